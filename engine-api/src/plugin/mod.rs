//! The plugin side of the SDK: implement [`Engine`], then call [`export_engine!`](crate::export_engine).
//!
//! The SDK turns the raw ABI into safe Rust: every entry point runs inside `catch_unwind` and
//! reports a panic as `TP_STATUS_INTERNAL` with the panic message; requests arrive parsed and
//! range-checked; the [`Sink`] guarantees the FINAL-then-release protocol even when the engine
//! forgets (a sink dropped unfinished sends a FINAL: cancelled while the engine is being
//! destroyed, internal otherwise); `stats` comes with request counters kept by the SDK.
//!
//! ```ignore
//! struct Echo;
//! impl Engine for Echo { /* ... */ }
//! turnpike_engine_api::export_engine!(Echo, "echo");
//! ```

mod sink;
mod thunks;

use std::fmt;
use std::sync::{Arc, RwLock};

pub use sink::Sink;
#[doc(hidden)]
pub use thunks::api_table;

use crate::abi::{self, TpHostV1};
use crate::event::EngineError;
use crate::json::{EmbedParams, GenerationParams, ModelInfo, Stats};
use crate::layout;

/// An engine. One value per `create`; shared by reference across host threads.
pub trait Engine: Send + Sync + Sized + 'static {
    /// Builds the engine from its JSON configuration. A bad configuration is
    /// `Status::InvalidConfig` with a message naming the offending key.
    fn create(host: Host, config: &str) -> Result<Self, EngineError>;

    /// The models this engine serves.
    fn models(&self) -> Vec<ModelInfo>;

    /// Starts a request and returns at once. Accepting (`Ok`) means the sink will get exactly one
    /// FINAL, from any thread, now or later. Refusing (`Err`) means it gets none: do not keep the
    /// sink when refusing.
    fn submit(&self, request: Request, sink: Sink) -> Result<(), EngineError>;

    /// Asks the engine to stop a request; idempotent; unknown ids are ignored. The request's sink
    /// should then finish with `Status::Cancelled`.
    fn cancel(&self, request_id: u64);

    /// Counters. `base` holds the SDK's own counts (requests in flight as `running`, and the
    /// completed, cancelled and failed totals); an engine may split queued from running and add
    /// its own.
    fn stats(&self, base: Stats) -> Stats {
        base
    }

    /// `Ok` when the engine can serve.
    fn health(&self) -> Result<(), EngineError> {
        Ok(())
    }

    /// Whether this plugin serves embeddings; when false the table's `embed` entry is NULL.
    const EMBEDDINGS: bool = false;

    /// One vector per input, all of one length.
    fn embed(&self, request: EmbedRequest) -> Result<Vec<Vec<f32>>, EngineError> {
        let _ = request;
        Err(EngineError::unsupported("this engine serves no embeddings"))
    }

    /// Called by `destroy` before the engine is dropped: finish or drop every live request and
    /// stop worker threads. Sinks still unfinished when the engine is dropped get a cancelled
    /// FINAL from the SDK.
    fn shutdown(&self) {}
}

/// A generation request, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Host-assigned id; `cancel` uses it.
    pub id: u64,
    /// Model id.
    pub model: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Parsed, range-checked parameters.
    pub params: GenerationParams,
    /// The host's W3C `traceparent` for this request; empty when it is not traced (since ABI
    /// minor 1). Send it on as the `traceparent` header to servers called for this request.
    pub trace_context: String,
}

/// An embeddings request, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    /// Model id.
    pub model: String,
    /// Token ids of each input.
    pub inputs: Vec<Vec<u32>>,
    /// Parsed parameters.
    pub params: EmbedParams,
}

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `TP_LOG_ERROR`
    Error,
    /// `TP_LOG_WARN`
    Warn,
    /// `TP_LOG_INFO`
    Info,
    /// `TP_LOG_DEBUG`
    Debug,
    /// `TP_LOG_TRACE`
    Trace,
}

/// The host's services. Cheap to clone and usable from any thread; once the engine's `destroy`
/// has begun, its calls do nothing (the host frees what they point to when `destroy` returns).
#[derive(Clone)]
pub struct Host {
    link: Arc<HostLink>,
}

struct HostLink {
    raw: TpHostV1,
    /// False from the end of `destroy` on; read-locked around every call into the host.
    alive: RwLock<bool>,
}

// SAFETY: the ABI makes the host's callbacks callable from any thread and its `ctx` valid until
// `destroy` returns; `alive` stops every call before that.
unsafe impl Send for HostLink {}
// SAFETY: as above; `raw` is read-only.
unsafe impl Sync for HostLink {}

impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("abi_major", &self.link.raw.abi_major)
            .field("abi_minor", &self.link.raw.abi_minor)
            .finish()
    }
}

impl Host {
    /// A host with no log sink, for engines built outside a host (unit tests).
    pub fn detached() -> Self {
        Self::from_raw(TpHostV1 {
            struct_size: std::mem::size_of::<TpHostV1>() as u32,
            abi_major: abi::TP_ABI_MAJOR,
            abi_minor: abi::TP_ABI_MINOR,
            ctx: std::ptr::null_mut(),
            log: None,
        })
    }

    pub(crate) fn from_raw(raw: TpHostV1) -> Self {
        Self {
            link: Arc::new(HostLink {
                raw,
                alive: RwLock::new(true),
            }),
        }
    }

    /// Stops every later call into the host, waiting for calls in progress.
    pub(crate) fn disconnect(&self) {
        *self.link.alive.write().unwrap_or_else(|p| p.into_inner()) = false;
    }

    /// The host's ABI version (major, minor).
    pub fn abi_version(&self) -> (u16, u16) {
        (self.link.raw.abi_major, self.link.raw.abi_minor)
    }

    /// Writes a line to the host's log.
    pub fn log(&self, level: LogLevel, message: &str) {
        let Some(log) = self.link.raw.log else { return };
        let alive = self.link.alive.read().unwrap_or_else(|p| p.into_inner());
        if !*alive {
            return;
        }
        let level = match level {
            LogLevel::Error => abi::TP_LOG_ERROR,
            LogLevel::Warn => abi::TP_LOG_WARN,
            LogLevel::Info => abi::TP_LOG_INFO,
            LogLevel::Debug => abi::TP_LOG_DEBUG,
            LogLevel::Trace => abi::TP_LOG_TRACE,
        };
        // SAFETY: the host keeps this callback and context valid until `destroy` returns, and
        // `alive` (held for reading) is cleared before that.
        unsafe { log(self.link.raw.ctx, level, layout::tp_str(message)) };
    }

    /// `log(LogLevel::Error, ..)`
    pub fn error(&self, message: &str) {
        self.log(LogLevel::Error, message);
    }
    /// `log(LogLevel::Warn, ..)`
    pub fn warn(&self, message: &str) {
        self.log(LogLevel::Warn, message);
    }
    /// `log(LogLevel::Info, ..)`
    pub fn info(&self, message: &str) {
        self.log(LogLevel::Info, message);
    }
    /// `log(LogLevel::Debug, ..)`
    pub fn debug(&self, message: &str) {
        self.log(LogLevel::Debug, message);
    }
}

/// Exports an [`Engine`] as a Turnpike plugin: defines the entry symbol `turnpike_engine_v1`
/// returning a static function table whose entries wrap the engine's methods.
///
/// `export_engine!(MyEngine, "my-engine")` takes the version from the plugin crate's
/// `Cargo.toml`; `export_engine!(MyEngine, "my-engine", "1.2.3")` sets it.
#[macro_export]
macro_rules! export_engine {
    ($engine:ty, $name:literal) => {
        $crate::export_engine!(@table $engine, concat!($name, "\0"), concat!(env!("CARGO_PKG_VERSION"), "\0"));
    };
    ($engine:ty, $name:literal, $version:literal) => {
        $crate::export_engine!(@table $engine, concat!($name, "\0"), concat!($version, "\0"));
    };
    (@table $engine:ty, $name:expr, $version:expr) => {
        /// Entry point of this Turnpike engine plugin, ABI major 1.
        #[unsafe(no_mangle)]
        pub extern "C" fn turnpike_engine_v1() -> *const $crate::abi::TpEngineApiV1 {
            static API: $crate::abi::TpEngineApiV1 = $crate::plugin::api_table::<$engine>(
                $name.as_ptr().cast(),
                $version.as_ptr().cast(),
            );
            &API
        }
    };
}
