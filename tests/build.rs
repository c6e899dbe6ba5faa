//! Hands the target triple to the test support, which compiles C fixtures with the `cc` crate.

fn main() {
    for var in ["TARGET", "HOST"] {
        let value = std::env::var(var).unwrap_or_default();
        println!("cargo:rustc-env=TURNPIKE_TEST_{var}={value}");
    }
}
