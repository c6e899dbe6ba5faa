//! The host side (feature `host`): load a gateway plugin library, create instances, and call
//! their hooks safely. Inputs are borrowed for one call; outputs come through capped writers; a
//! tool call's outcome arrives on a tokio oneshot channel.

use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod instance;

pub use instance::{PluginInstance, ToolResult, TransformHandle};

use crate::abi::{self, TgHostV1, TgLogLevel, TgPlugin, TgPluginApiV1, TgStatus, TgStr, TgWriter};
use crate::plugin::Hooks;
use crate::tg_str;

/// Longest output a hook may write (a rewritten request, a transformed piece, a description).
const OUT_LIMIT: usize = 16 << 20;

/// Why loading or calling a plugin failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The library cannot be opened or is not a gateway plugin of this ABI.
    #[error("{path}: {reason}")]
    Load {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A call returned an error status.
    #[error("{message} (status {status})")]
    Call {
        /// The status.
        status: TgStatus,
        /// What the plugin wrote.
        message: String,
    },
    /// A call's output broke the contract.
    #[error("{0}")]
    Contract(String),
}

fn contract(message: impl Into<String>) -> PluginError {
    PluginError::Contract(message.into())
}

struct OutBuf {
    bytes: Vec<u8>,
    truncated: bool,
}

unsafe extern "C" fn out_write(ctx: *mut c_void, data: *const u8, len: usize) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if ctx.is_null() || (data.is_null() && len > 0) {
            return;
        }
        // SAFETY: `ctx` is the `OutBuf` whose writer this is, alive for the call.
        let buf = unsafe { &mut *ctx.cast::<OutBuf>() };
        if buf.bytes.len() + len > OUT_LIMIT {
            buf.truncated = true;
            return;
        }
        if len > 0 {
            // SAFETY: the plugin passes `len` readable bytes at `data`.
            buf.bytes
                .extend_from_slice(unsafe { std::slice::from_raw_parts(data, len) });
        }
    }));
}

impl OutBuf {
    fn new() -> Self {
        Self {
            bytes: Vec::new(),
            truncated: false,
        }
    }

    fn writer(&mut self) -> TgWriter {
        TgWriter {
            ctx: (self as *mut Self).cast(),
            write: Some(out_write),
        }
    }

    fn text(self) -> Result<String, PluginError> {
        if self.truncated {
            return Err(contract(format!(
                "the plugin wrote more than {OUT_LIMIT} bytes"
            )));
        }
        String::from_utf8(self.bytes)
            .map_err(|_| contract("the plugin wrote text that is not UTF-8"))
    }

    fn failure(self, status: TgStatus) -> PluginError {
        let message = String::from_utf8_lossy(&self.bytes)
            .trim()
            .chars()
            .take(2000)
            .collect::<String>();
        PluginError::Call {
            status,
            message: if message.is_empty() {
                "no reason given".into()
            } else {
                message
            },
        }
    }
}

/// A loaded plugin library; stays loaded for the process's life.
#[derive(Debug, Clone)]
pub struct PluginLibrary {
    api: TgPluginApiV1,
    path: PathBuf,
    name: String,
    version: String,
}

// SAFETY: the table is immutable static data of a library never unloaded.
unsafe impl Send for PluginLibrary {}
// SAFETY: as above.
unsafe impl Sync for PluginLibrary {}

fn static_text(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the table's strings are NUL-terminated and static.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

impl PluginLibrary {
    /// Opens the library at `path` and checks its function table.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PluginError> {
        let given = path.as_ref().to_path_buf();
        let fail = |reason: String| PluginError::Load {
            path: given.clone(),
            reason,
        };
        let full = std::fs::canonicalize(&given).map_err(|e| fail(format!("cannot open: {e}")))?;
        // SAFETY: loading runs the library's initialisers; a plugin is trusted code the operator
        // configured. The library is leaked, so it is never unloaded under live pointers.
        let library = unsafe { libloading::Library::new(&full) }
            .map_err(|e| fail(format!("not a loadable library: {e}")))?;
        let library: &'static libloading::Library = Box::leak(Box::new(library));
        // SAFETY: the symbol, when present, has the documented signature.
        let entry = unsafe { library.get::<abi::TgEntryV1>(abi::TG_ENTRY_SYMBOL_V1.as_bytes()) }
            .map_err(|_| {
                fail(format!(
                    "not a Turnpike gateway plugin (no `{}`)",
                    abi::TG_ENTRY_SYMBOL_V1
                ))
            })?;
        // SAFETY: as above.
        let table = unsafe { entry() };
        if table.is_null() {
            return Err(fail("its entry point returned NULL".into()));
        }
        // SAFETY: the table starts with `struct_size` and lives as long as the library.
        let api = unsafe { turnpike_engine_api::layout::read_prefix(table) };
        if api.abi_major != abi::TG_ABI_MAJOR {
            return Err(fail(format!(
                "built for gateway plugin ABI {}, this host speaks {}",
                api.abi_major,
                abi::TG_ABI_MAJOR
            )));
        }
        if api.create.is_none() || api.destroy.is_none() {
            return Err(fail("its table lacks create or destroy".into()));
        }
        let transform = [
            api.transform_open.is_some(),
            api.transform_feed.is_some(),
            api.transform_close.is_some(),
        ];
        if transform.iter().any(|h| *h) && !transform.iter().all(|h| *h) {
            return Err(fail(
                "it exports part of the transform hook (open, feed and close come together)".into(),
            ));
        }
        if api.tool_call.is_some() != api.tool_cancel.is_some() {
            return Err(fail(
                "it exports tool_call without tool_cancel, or the other way round".into(),
            ));
        }
        Ok(Self {
            name: static_text(api.name),
            version: static_text(api.version),
            api,
            path: full,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The hooks it exports.
    pub fn hooks(&self) -> Hooks {
        Hooks {
            guard: self.api.guard.is_some(),
            transform: self.api.transform_open.is_some(),
            tools: self.api.tool_call.is_some(),
        }
    }

    /// Creates an instance from `config` (JSON); `label` names it in the host's log.
    pub fn create(&self, config: &str, label: &str) -> Result<Arc<PluginInstance>, PluginError> {
        let log = Box::new(LogContext {
            name: label.to_string(),
        });
        let host = TgHostV1 {
            struct_size: size_of::<TgHostV1>() as u32,
            abi_major: abi::TG_ABI_MAJOR,
            abi_minor: abi::TG_ABI_MINOR,
            ctx: (&*log as *const LogContext).cast_mut().cast(),
            log: Some(host_log),
        };
        let host = Box::new(host);
        let mut raw: *mut TgPlugin = std::ptr::null_mut();
        let mut err = OutBuf::new();
        let create = self.api.create.ok_or_else(|| contract("no create"))?;
        // SAFETY: `host` and `log_name` outlive the instance (kept in it); the strings are
        // borrowed for the call.
        let status = unsafe { create(&*host, tg_str(config), &mut raw, err.writer()) };
        if status != abi::TG_STATUS_OK {
            return Err(err.failure(status));
        }
        if raw.is_null() {
            return Err(contract("create returned OK without an instance"));
        }
        PluginInstance::new(self.api, raw, host, log, self.hooks())
    }
}

unsafe extern "C" fn host_log(ctx: *mut c_void, level: TgLogLevel, message: TgStr) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if ctx.is_null() {
            return;
        }
        // SAFETY: `ctx` is the instance's log context, alive until `destroy` returns.
        let name = &unsafe { &*ctx.cast::<LogContext>() }.name;
        // SAFETY: `message` is borrowed for the call.
        let text = unsafe { borrowed(message) };
        match level {
            abi::TG_LOG_ERROR => tracing::error!(plugin = %name, "{text}"),
            abi::TG_LOG_WARN => tracing::warn!(plugin = %name, "{text}"),
            abi::TG_LOG_INFO => tracing::info!(plugin = %name, "{text}"),
            _ => tracing::debug!(plugin = %name, "{text}"),
        }
    }));
}

/// The lossy text of a borrowed string.
///
/// # Safety
/// `s` must point to `len` readable bytes for the current call.
unsafe fn borrowed(s: TgStr) -> String {
    if s.ptr.is_null() || s.len == 0 {
        return String::new();
    }
    // SAFETY: forwarded from the caller.
    let bytes = unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// What the host's log callback is given: the instance's name.
#[derive(Debug)]
struct LogContext {
    name: String,
}
