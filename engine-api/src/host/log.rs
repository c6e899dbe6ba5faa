//! The host table given to `create`: plugin log lines become `tracing` events with target
//! `turnpike::plugin` and the plugin's name as a field.

use std::ffi::c_void;
use std::panic::catch_unwind;

use crate::abi::{self, TpHostV1, TpLogLevel, TpStr};
use crate::layout;

/// A host table and the context it points to; both must outlive the engine.
#[derive(Debug)]
pub(crate) struct HostTable {
    // Boxed so the addresses handed to the plugin stay put when `HostTable` moves.
    table: Box<TpHostV1>,
    _ctx: Box<LogCtx>,
}

#[derive(Debug)]
struct LogCtx {
    plugin: String,
}

// SAFETY: the table only points at `_ctx`, which is immutable and owned alongside it.
unsafe impl Send for HostTable {}
// SAFETY: as above.
unsafe impl Sync for HostTable {}

impl HostTable {
    pub(crate) fn new(plugin: &str) -> Self {
        let mut ctx = Box::new(LogCtx {
            plugin: plugin.to_string(),
        });
        let table = Box::new(TpHostV1 {
            struct_size: std::mem::size_of::<TpHostV1>() as u32,
            abi_major: abi::TP_ABI_MAJOR,
            abi_minor: abi::TP_ABI_MINOR,
            ctx: (&mut *ctx as *mut LogCtx).cast::<c_void>(),
            log: Some(host_log),
        });
        Self { table, _ctx: ctx }
    }

    pub(crate) fn as_ptr(&self) -> *const TpHostV1 {
        &*self.table
    }
}

unsafe extern "C" fn host_log(ctx: *mut c_void, level: TpLogLevel, message: TpStr) {
    let _ = catch_unwind(|| {
        // SAFETY: `ctx` is the `LogCtx` of a live `HostTable`.
        let Some(ctx) = (unsafe { ctx.cast::<LogCtx>().as_ref() }) else {
            return;
        };
        // SAFETY: the ABI makes `message` valid for the call.
        let message = unsafe { layout::str_lossy(message) };
        let plugin = ctx.plugin.as_str();
        match level {
            abi::TP_LOG_ERROR => tracing::error!(target: "turnpike::plugin", plugin, "{message}"),
            abi::TP_LOG_WARN => tracing::warn!(target: "turnpike::plugin", plugin, "{message}"),
            abi::TP_LOG_DEBUG => tracing::debug!(target: "turnpike::plugin", plugin, "{message}"),
            abi::TP_LOG_TRACE => tracing::trace!(target: "turnpike::plugin", plugin, "{message}"),
            _ => tracing::info!(target: "turnpike::plugin", plugin, "{message}"),
        }
    });
}
