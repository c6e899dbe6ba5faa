//! The checked-in C header must be what cbindgen generates from `src/abi.rs` today.
//! Run with `TURNPIKE_BLESS=1` to rewrite it after changing the ABI.

use std::path::Path;

#[test]
fn checked_in_header_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/abi.rs"))
        .generate()
        .expect("cbindgen can generate the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("header is UTF-8");

    let path = root.join("include/turnpike_gateway_plugin.h");
    if std::env::var_os("TURNPIKE_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write header");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "{} is stale: regenerate it with `TURNPIKE_BLESS=1 cargo test -p turnpike-plugin-api --test header`",
        path.display()
    );
}
