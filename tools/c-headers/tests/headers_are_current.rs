//! Each checked-in C header must be what cbindgen generates from its crate's `src/abi.rs` today.

use turnpike_c_headers::Abi;

#[test]
fn checked_in_headers_are_current() {
    for abi in Abi::ALL {
        let fresh = match abi.generate() {
            Ok(text) => text,
            Err(e) => panic!("{e}"),
        };
        let path = abi.header_path();
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == fresh,
            "{} is stale: regenerate it with `cargo run -p turnpike-c-headers`",
            path.display()
        );
    }
}
