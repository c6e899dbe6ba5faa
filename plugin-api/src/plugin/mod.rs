//! Writing a gateway plugin in Rust: implement [`GatewayPlugin`] and call
//! [`export_gateway_plugin!`]. The SDK's entry points catch panics, parse and write the JSON
//! documents, and keep a tool call's `done` exactly once (a [`ToolDone`] dropped unanswered
//! reports the call as failed).

mod thunks;

use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::abi::{self, TgHostV1, TgToolSinkV1};
use crate::json::{GuardRequest, ToolCall, ToolSpec, TransformContext, Verdict};
pub use thunks::api_table;

/// Which hooks a plugin offers; the others are exported as NULL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hooks {
    /// `guard`.
    pub guard: bool,
    /// `transform_open`, `transform_feed`, `transform_close`.
    pub transform: bool,
    /// `tool_call`, `tool_cancel` (and `describe` lists the tools).
    pub tools: bool,
}

/// A gateway plugin.
pub trait GatewayPlugin: Sized + Send + Sync + 'static {
    /// The hooks it offers.
    const HOOKS: Hooks;

    /// Builds an instance from its configuration (the `config` table of its `[[plugins]]`
    /// entry, as JSON). The error is a one-line reason for the operator.
    fn create(config: &Value, host: Host) -> Result<Self, String>;

    /// The tools it runs.
    fn tools(&self) -> Vec<ToolSpec> {
        Vec::new()
    }

    /// Judges a request. Must return promptly.
    fn guard(&self, _request: &GuardRequest) -> Result<Verdict, String> {
        Ok(Verdict::Allow)
    }

    /// A transform for one output text.
    fn transform(&self, _context: &TransformContext) -> Result<Box<dyn Transform>, String> {
        Err("this plugin has no response transform".into())
    }

    /// Starts a tool call; its outcome goes to `done`, from any thread, before the deadline in
    /// `call` or soon after a cancel.
    fn call_tool(&self, _id: u64, call: ToolCall, _done: ToolDone) -> Result<(), String> {
        Err(format!("this plugin has no tool `{}`", call.name))
    }

    /// Asks a call to stop; its `done` says how it ended.
    fn cancel_tool(&self, _id: u64) {}
}

/// The transform of one output text.
pub trait Transform: Send {
    /// Takes the next piece; returns the text ready to be sent (holding back what a later piece
    /// may change). With `last`, returns everything held. What it returns over all calls must not
    /// depend on how the text was cut into pieces.
    fn feed(&mut self, text: &str, last: bool) -> String;
}

/// A tool call's outcome channel: answer once with [`ToolDone::finish`]. Dropping it unanswered
/// reports the call as failed, so the host always hears back.
#[derive(Debug)]
pub struct ToolDone {
    slot: Arc<Slot>,
}

/// A tool call's sink and where the call stands.
#[derive(Debug, Default)]
pub(crate) struct SlotState {
    /// The sink, until its `done` is called (or a refused call takes it back).
    pub(crate) sink: Option<Sink>,
    /// Whether `tool_call` has returned OK.
    pub(crate) accepted: bool,
    /// Whether the [`ToolDone`] was dropped unanswered before the call was accepted.
    pub(crate) abandoned: bool,
}

/// A tool call's slot.
pub(crate) type Slot = Mutex<SlotState>;

pub(crate) fn lock(slot: &Slot) -> std::sync::MutexGuard<'_, SlotState> {
    // Every update is one assignment; a poisoned lock holds consistent data.
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
pub(crate) struct Sink(TgToolSinkV1);

// SAFETY: the host's tool sink may be called from any thread (see `TgToolSinkV1`).
unsafe impl Send for Sink {}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// Its output.
    Done(String),
    /// It failed; the message is shown to the model.
    Failed(String),
    /// It was cancelled.
    Cancelled,
}

/// Delivers `outcome` to the sink in `slot`, unless it was delivered already.
pub(crate) fn deliver(slot: &Slot, outcome: ToolOutcome) {
    let taken = lock(slot).sink.take();
    let Some(Sink(sink)) = taken else { return };
    let Some(done) = sink.done else { return };
    let (status, text) = match &outcome {
        ToolOutcome::Done(text) => (abi::TG_STATUS_OK, text.as_str()),
        ToolOutcome::Failed(message) => (abi::TG_STATUS_FAILED, message.as_str()),
        ToolOutcome::Cancelled => (abi::TG_STATUS_CANCELLED, "cancelled"),
    };
    // SAFETY: the host keeps the sink valid until its `done` is called, which happens here once
    // (the sink was taken out of its slot).
    unsafe { done(sink.ctx, status, crate::tg_str(text)) };
}

impl ToolDone {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        Self { slot }
    }

    /// Delivers the outcome.
    pub fn finish(self, outcome: ToolOutcome) {
        deliver(&self.slot, outcome);
    }
}

impl Drop for ToolDone {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.slot);
            if !state.accepted {
                // Refused calls hear nothing; an accepted one is answered by `tool_call`.
                state.abandoned = true;
                return;
            }
        }
        deliver(
            &self.slot,
            ToolOutcome::Failed("the tool ended without an answer".into()),
        );
    }
}

impl Sink {
    pub(crate) fn new(raw: TgToolSinkV1) -> Self {
        Self(raw)
    }
}

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// An error the operator must see.
    Error,
    /// Something unexpected.
    Warn,
    /// Normal operation.
    Info,
    /// Detail.
    Debug,
}

/// The host's services, valid while the instance lives.
#[derive(Debug, Clone)]
pub struct Host {
    raw: Arc<RawHost>,
}

#[derive(Debug)]
struct RawHost(TgHostV1);

// SAFETY: the host's log may be called from any thread and its context stays valid until the
// instance is destroyed (see `TgHostV1`).
unsafe impl Send for RawHost {}
// SAFETY: as above.
unsafe impl Sync for RawHost {}

impl Host {
    pub(crate) fn from_raw(raw: TgHostV1) -> Self {
        Self {
            raw: Arc::new(RawHost(raw)),
        }
    }

    /// A host with no log, for a plugin's own tests.
    pub fn detached() -> Self {
        Self::from_raw(TgHostV1 {
            struct_size: size_of::<TgHostV1>() as u32,
            abi_major: abi::TG_ABI_MAJOR,
            abi_minor: abi::TG_ABI_MINOR,
            ctx: std::ptr::null_mut(),
            log: None,
        })
    }

    /// Writes a line to the host's log.
    pub fn log(&self, level: LogLevel, message: &str) {
        let Some(log) = self.raw.0.log else { return };
        let level = match level {
            LogLevel::Error => abi::TG_LOG_ERROR,
            LogLevel::Warn => abi::TG_LOG_WARN,
            LogLevel::Info => abi::TG_LOG_INFO,
            LogLevel::Debug => abi::TG_LOG_DEBUG,
        };
        // SAFETY: the host keeps this callback and its context valid until `destroy` returns.
        unsafe { log(self.raw.0.ctx, level, crate::tg_str(message)) };
    }
}

/// Exports a [`GatewayPlugin`]: defines the entry symbol `turnpike_gateway_plugin_v1` returning
/// a static function table whose entries wrap the plugin's methods.
///
/// `export_gateway_plugin!(MyPlugin, "my-plugin")` takes the version from the crate's
/// `Cargo.toml`.
#[macro_export]
macro_rules! export_gateway_plugin {
    ($plugin:ty, $name:literal) => {
        /// Entry point of this Turnpike gateway plugin, ABI major 1.
        #[unsafe(no_mangle)]
        pub extern "C" fn turnpike_gateway_plugin_v1() -> *const $crate::abi::TgPluginApiV1 {
            static API: $crate::abi::TgPluginApiV1 = $crate::plugin::api_table::<$plugin>(
                concat!($name, "\0").as_ptr().cast(),
                concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast(),
            );
            &API
        }
    };
}
