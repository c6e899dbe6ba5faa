//! A plugin instance and the transforms it opens: the hooks called safely, with capped outputs
//! and a tool call's outcome on a tokio oneshot channel.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::{LogContext, OutBuf, PluginError, borrowed, contract};
use crate::abi::{
    self, TgHostV1, TgPlugin, TgPluginApiV1, TgStatus, TgStr, TgToolSinkV1, TgTransform, TgVerdict,
};
use crate::json::{Description, GuardRequest, ToolCall, ToolSpec, TransformContext, Verdict};
use crate::plugin::Hooks;
use crate::tg_str;

/// A plugin instance; destroyed when the last handle drops.
#[derive(Debug)]
pub struct PluginInstance {
    api: TgPluginApiV1,
    raw: *mut TgPlugin,
    _host: Box<TgHostV1>,
    _log: Box<LogContext>,
    tools: Vec<ToolSpec>,
    hooks: Hooks,
}

// SAFETY: the ABI lets every entry but create and destroy run concurrently from any thread;
// destroy runs once, in Drop, when no handle is left.
unsafe impl Send for PluginInstance {}
// SAFETY: as above.
unsafe impl Sync for PluginInstance {}

/// How a tool call ended: the status and the text (the output, or why it failed).
pub type ToolResult = (TgStatus, String);

impl PluginInstance {
    /// The instance `create` made, with what it describes of itself.
    pub(super) fn new(
        api: TgPluginApiV1,
        raw: *mut TgPlugin,
        host: Box<TgHostV1>,
        log: Box<LogContext>,
        hooks: Hooks,
    ) -> Result<Arc<Self>, PluginError> {
        let mut instance = Self {
            api,
            raw,
            _host: host,
            _log: log,
            tools: Vec::new(),
            hooks,
        };
        instance.tools = instance.describe()?.tools;
        Ok(Arc::new(instance))
    }

    /// The hooks it offers.
    pub fn hooks(&self) -> Hooks {
        self.hooks
    }

    /// The tools it runs.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    fn describe(&self) -> Result<Description, PluginError> {
        let Some(describe) = self.api.describe else {
            return Ok(Description::default());
        };
        let mut out = OutBuf::new();
        // SAFETY: `raw` is alive; the writer outlives the call.
        let status = unsafe { describe(self.raw, out.writer()) };
        if status != abi::TG_STATUS_OK {
            return Err(out.failure(status));
        }
        let text = out.text()?;
        serde_json::from_str(&text)
            .map_err(|e| contract(format!("describe wrote no valid description: {e}")))
    }

    /// Runs the guard (`Allow` without one).
    pub fn guard(&self, request: &GuardRequest) -> Result<Verdict, PluginError> {
        let Some(guard) = self.api.guard else {
            return Ok(Verdict::Allow);
        };
        let input = serde_json::to_string(request).map_err(|e| contract(e.to_string()))?;
        let mut out = OutBuf::new();
        let mut verdict: TgVerdict = u32::MAX;
        // SAFETY: `raw` is alive; the input and the writer outlive the call.
        let status = unsafe { guard(self.raw, tg_str(&input), out.writer(), &mut verdict) };
        if status != abi::TG_STATUS_OK {
            return Err(out.failure(status));
        }
        match verdict {
            abi::TG_VERDICT_ALLOW => Ok(Verdict::Allow),
            abi::TG_VERDICT_REJECT => {
                let text = out.text()?;
                let rejection: crate::json::Rejection = serde_json::from_str(&text)
                    .map_err(|e| contract(format!("the guard's rejection is not valid: {e}")))?;
                if !(400..=499).contains(&rejection.status) {
                    return Err(contract(format!(
                        "the guard rejected with status {}, not 400 to 499",
                        rejection.status
                    )));
                }
                Ok(Verdict::Reject(rejection))
            }
            abi::TG_VERDICT_REWRITE => {
                let text = out.text()?;
                let rewritten: GuardRequest = serde_json::from_str(&text)
                    .map_err(|e| contract(format!("the guard's rewrite is not a request: {e}")))?;
                let count = |r: &GuardRequest| {
                    (
                        r.messages.as_ref().map(Vec::len),
                        r.prompt.as_ref().map(Vec::len),
                    )
                };
                if count(&rewritten) != count(request) {
                    return Err(contract(
                        "the guard's rewrite changed the number of messages or prompts",
                    ));
                }
                Ok(Verdict::Rewrite(rewritten))
            }
            other => Err(contract(format!("the guard returned verdict {other}"))),
        }
    }

    /// Opens a transform of one output text.
    pub fn open_transform(
        self: &Arc<Self>,
        context: &TransformContext,
    ) -> Result<TransformHandle, PluginError> {
        let Some(open) = self.api.transform_open else {
            return Err(contract("this plugin has no transform"));
        };
        let input = serde_json::to_string(context).map_err(|e| contract(e.to_string()))?;
        let mut raw: *mut TgTransform = std::ptr::null_mut();
        // SAFETY: `raw` (the instance) is alive; the input outlives the call.
        let status = unsafe { open(self.raw, tg_str(&input), &mut raw) };
        if status != abi::TG_STATUS_OK || raw.is_null() {
            return Err(PluginError::Call {
                status,
                message: "transform_open failed".into(),
            });
        }
        Ok(TransformHandle {
            instance: Arc::clone(self),
            raw,
        })
    }

    /// Starts a tool call; its outcome arrives on the returned channel.
    pub fn call_tool(
        &self,
        id: u64,
        call: &ToolCall,
    ) -> Result<tokio::sync::oneshot::Receiver<ToolResult>, PluginError> {
        let Some(start) = self.api.tool_call else {
            return Err(contract("this plugin runs no tools"));
        };
        let input = serde_json::to_string(call).map_err(|e| contract(e.to_string()))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<ToolResult>();
        let ctx = Box::into_raw(Box::new(tx));
        let sink = TgToolSinkV1 {
            ctx: ctx.cast(),
            done: Some(tool_done),
        };
        let mut err = OutBuf::new();
        // SAFETY: `raw` is alive; the sink's context stays valid until `done` reclaims it.
        let status = unsafe { start(self.raw, id, tg_str(&input), sink, err.writer()) };
        if status != abi::TG_STATUS_OK {
            // SAFETY: a refused call never calls `done`, so the context is still ours.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(err.failure(status));
        }
        Ok(rx)
    }

    /// Asks a tool call to stop.
    pub fn cancel_tool(&self, id: u64) {
        if let Some(cancel) = self.api.tool_cancel {
            // SAFETY: `raw` is alive.
            unsafe { cancel(self.raw, id) };
        }
    }
}

unsafe extern "C" fn tool_done(ctx: *mut c_void, status: TgStatus, result: TgStr) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if ctx.is_null() {
            return;
        }
        // SAFETY: `ctx` is the boxed sender `call_tool` made; `done` is called once per call.
        let tx = unsafe { Box::from_raw(ctx.cast::<tokio::sync::oneshot::Sender<ToolResult>>()) };
        // SAFETY: `result` is borrowed for this call.
        let _ = tx.send((status, unsafe { borrowed(result) }));
    }));
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        if let Some(destroy) = self.api.destroy {
            // SAFETY: the last handle is gone: nothing else calls into the instance.
            unsafe { destroy(self.raw) };
        }
    }
}

/// The transform of one output text; closed when dropped.
#[derive(Debug)]
pub struct TransformHandle {
    instance: Arc<PluginInstance>,
    raw: *mut TgTransform,
}

// SAFETY: a transform is fed from one thread at a time (`&mut self`); the ABI lets that thread
// be any.
unsafe impl Send for TransformHandle {}

impl TransformHandle {
    /// Feeds a piece; returns the text ready to be sent.
    pub fn feed(&mut self, text: &str, last: bool) -> Result<String, PluginError> {
        let Some(feed) = self.instance.api.transform_feed else {
            return Err(contract("this plugin has no transform"));
        };
        let mut out = OutBuf::new();
        // SAFETY: the transform is open; the input and writer outlive the call.
        let status = unsafe { feed(self.raw, tg_str(text), u32::from(last), out.writer()) };
        if status != abi::TG_STATUS_OK {
            return Err(out.failure(status));
        }
        out.text()
    }
}

impl Drop for TransformHandle {
    fn drop(&mut self) {
        if let Some(close) = self.instance.api.transform_close {
            // SAFETY: the transform is open and closed once, here.
            unsafe { close(self.raw) };
        }
    }
}
