//! The project's two C ABI headers, generated from their Rust definitions by cbindgen:
//! `engine-api/include/turnpike_engine.h` from `engine-api/src/abi.rs` and
//! `plugin-api/include/turnpike_gateway_plugin.h` from `plugin-api/src/abi.rs`, each configured
//! by its crate's `cbindgen.toml`. `cargo run -p turnpike-c-headers` rewrites both after an ABI
//! change; `tests/headers_are_current.rs` fails while a checked-in header is stale.
//!
//! Why a crate of its own, with cbindgen as a normal dependency: cbindgen turns on `syn`'s
//! `fold` feature. As a dev-dependency of the ABI crates it did so only in `cargo test` builds,
//! so a test build and a plain `cargo build --workspace` resolved different features below every
//! crate of the workspace and each rebuilt the default engine and the gateway over the other's
//! output (the black-box tests build the workspace from inside `cargo test`: minutes per run).
//! Here it is part of every build of the workspace, so both resolve the same units.

use std::path::{Path, PathBuf};

/// One of the two ABIs whose header is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// The engine plugin ABI (`turnpike-engine-api`).
    Engine,
    /// The gateway plugin ABI (`turnpike-plugin-api`).
    GatewayPlugin,
}

/// What can go wrong generating or writing a header.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The crate's `cbindgen.toml` could not be read.
    #[error("{path}: {reason}")]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// cbindgen's reason.
        reason: String,
    },
    /// cbindgen could not generate the header from the sources.
    #[error("generating {header}: {source}")]
    Generate {
        /// The header being generated.
        header: PathBuf,
        /// cbindgen's reason (boxed: it is large, and errors are rare).
        source: Box<cbindgen::Error>,
    },
    /// Generated text that is not UTF-8.
    #[error("{0}: cbindgen wrote text that is not UTF-8")]
    NotUtf8(PathBuf),
    /// Writing the header failed.
    #[error("{path}: {source}")]
    Write {
        /// The header being written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Abi {
    /// Both ABIs.
    pub const ALL: [Abi; 2] = [Abi::Engine, Abi::GatewayPlugin];

    /// The crate that defines the ABI.
    pub fn crate_dir(self) -> PathBuf {
        let dir = match self {
            Abi::Engine => "engine-api",
            Abi::GatewayPlugin => "plugin-api",
        };
        workspace_root().join(dir)
    }

    /// The checked-in header.
    pub fn header_path(self) -> PathBuf {
        let file = match self {
            Abi::Engine => "turnpike_engine.h",
            Abi::GatewayPlugin => "turnpike_gateway_plugin.h",
        };
        self.crate_dir().join("include").join(file)
    }

    /// The header as cbindgen generates it from the crate's `src/abi.rs` today.
    pub fn generate(self) -> Result<String, HeaderError> {
        let dir = self.crate_dir();
        let config_path = dir.join("cbindgen.toml");
        let config =
            cbindgen::Config::from_file(&config_path).map_err(|reason| HeaderError::Config {
                path: config_path,
                reason,
            })?;
        let bindings = cbindgen::Builder::new()
            .with_config(config)
            .with_src(dir.join("src/abi.rs"))
            .generate()
            .map_err(|source| HeaderError::Generate {
                header: self.header_path(),
                source: Box::new(source),
            })?;
        let mut text = Vec::new();
        bindings.write(&mut text);
        String::from_utf8(text).map_err(|_| HeaderError::NotUtf8(self.header_path()))
    }

    /// Rewrites the checked-in header if it differs from the generated one; says whether it did.
    pub fn write(self) -> Result<bool, HeaderError> {
        let fresh = self.generate()?;
        let path = self.header_path();
        if std::fs::read_to_string(&path).is_ok_and(|old| old == fresh) {
            return Ok(false);
        }
        std::fs::write(&path, fresh).map_err(|source| HeaderError::Write { path, source })?;
        Ok(true)
    }
}

/// The workspace's root directory (this crate lives in `tools/c-headers`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}
