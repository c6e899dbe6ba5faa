//! Rewrites the C ABI headers from their Rust definitions: `cargo run -p turnpike-c-headers`.

use std::process::ExitCode;

use turnpike_c_headers::Abi;

#[allow(clippy::print_stdout, clippy::print_stderr)] // a tool's report, one line per header
fn main() -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    for abi in Abi::ALL {
        let path = abi.header_path();
        match abi.write() {
            Ok(true) => println!("rewrote {}", path.display()),
            Ok(false) => println!("{} is current", path.display()),
            Err(e) => {
                eprintln!("c-headers: {e}");
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}
