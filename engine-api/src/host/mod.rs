//! The host side of the SDK: load a plugin, create engines, and run requests as tokio streams.
//!
//! - [`Plugin::load`] opens a `.so`, checks its entry symbol, ABI major and table size, and keeps
//!   the library loaded for the life of the process (plugins are never unloaded: a library with
//!   live threads or thread-locals cannot be unloaded safely).
//! - [`Plugin::create`] builds an [`EngineHandle`]; the engine is destroyed when the last handle
//!   and the last [`EventStream`] are gone.
//! - [`EngineHandle::submit`] returns an [`EventStream`]: the plugin's sink feeds an unbounded
//!   tokio channel (the engine bounds it by `max_tokens`), the stream ends after the FINAL event,
//!   and dropping it before then cancels the request in the engine.
//!
//! Every failure is a [`PluginError`] whose message names the file and the reason.

mod bridge;
mod engine;
mod loader;
mod log;
mod writer;

use std::path::PathBuf;

pub use bridge::{EventReceiver, sink_pair};
pub use engine::{EngineHandle, EngineRequest, EventStream};
pub use loader::{Plugin, PluginInfo};

use crate::event::Status;

/// Why a plugin could not be loaded or its engine created.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// There is no file at the path.
    #[error("{}: no such file", path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The file is not a loadable shared library (not ELF, wrong architecture, missing deps).
    #[error("{}: cannot be loaded as a shared library: {reason}", path.display())]
    NotALibrary {
        /// The path given.
        path: PathBuf,
        /// The loader's reason.
        reason: String,
    },
    /// The library exports no Turnpike entry symbol.
    #[error("{}: not a Turnpike engine plugin (it exports no `turnpike_engine_v1` symbol)", path.display())]
    NotAPlugin {
        /// The path given.
        path: PathBuf,
    },
    /// The plugin was built for another ABI major version.
    #[error(
        "{}: built for engine ABI major {found}, but this host speaks major {}",
        path.display(),
        crate::abi::TP_ABI_MAJOR
    )]
    AbiMajorMismatch {
        /// The path given.
        path: PathBuf,
        /// The plugin's major version.
        found: u16,
    },
    /// The function table is missing required parts.
    #[error("{}: malformed function table: {reason}", path.display())]
    BadTable {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The plugin's `create` refused the configuration or failed.
    #[error("{}: engine `create` failed ({status}): {message}", path.display())]
    CreateFailed {
        /// The path given.
        path: PathBuf,
        /// The status `create` returned.
        status: Status,
        /// The plugin's message.
        message: String,
    },
}
