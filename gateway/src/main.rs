//! The `turnpike` binary: parse the command line, set up logging, run.

use std::process::ExitCode;

use clap::Parser;
use turnpike::cli::{Cli, run};
use turnpike::observability::init_logging;

/// mimalloc: the request path allocates many small, short-lived buffers (bodies, token lists,
/// JSON), and glibc's malloc took a fifth of a fleet front's CPU (`bench/results/fleet.md`).
/// Plugins keep their own allocator; the ABI never frees memory across the boundary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.default_log_level());
    let mut stdout = std::io::stdout();
    match run(cli, &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)] // the one line a failed command leaves for its caller
            {
                eprintln!("turnpike: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
