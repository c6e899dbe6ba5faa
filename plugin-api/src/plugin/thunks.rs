//! The `extern "C"` entry points that wrap a [`GatewayPlugin`]: read raw input, call the plugin
//! inside `catch_unwind`, turn results and panics into statuses and writer output.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, Weak};

use super::{
    GatewayPlugin, Host, Sink, Slot, SlotState, ToolDone, ToolOutcome, Transform, deliver, lock,
};
use crate::abi::{
    self, TgHostV1, TgPlugin, TgPluginApiV1, TgStatus, TgStr, TgToolSinkV1, TgTransform, TgVerdict,
    TgWriter,
};
use crate::json::{Description, GuardRequest, ToolCall, TransformContext, Verdict};

/// What a `TgPlugin*` points to.
struct Instance<P> {
    plugin: P,
    /// Accepted tool calls whose sinks may still be unanswered.
    calls: Mutex<HashMap<u64, Weak<Slot>>>,
}

/// What a `TgTransform*` points to.
type TransformBox = Box<dyn Transform>;

/// The function table for `P`; used by `export_gateway_plugin!`.
#[doc(hidden)]
pub const fn api_table<P: GatewayPlugin>(
    name: *const c_char,
    version: *const c_char,
) -> TgPluginApiV1 {
    let hooks = P::HOOKS;
    TgPluginApiV1 {
        struct_size: size_of::<TgPluginApiV1>() as u32,
        abi_major: abi::TG_ABI_MAJOR,
        abi_minor: abi::TG_ABI_MINOR,
        name,
        version,
        create: Some(create::<P>),
        destroy: Some(destroy::<P>),
        describe: Some(describe::<P>),
        guard: if hooks.guard { Some(guard::<P>) } else { None },
        transform_open: if hooks.transform {
            Some(transform_open::<P>)
        } else {
            None
        },
        transform_feed: if hooks.transform {
            Some(transform_feed)
        } else {
            None
        },
        transform_close: if hooks.transform {
            Some(transform_close)
        } else {
            None
        },
        tool_call: if hooks.tools {
            Some(tool_call::<P>)
        } else {
            None
        },
        tool_cancel: if hooks.tools {
            Some(tool_cancel::<P>)
        } else {
            None
        },
    }
}

fn write(out: TgWriter, bytes: &[u8]) {
    if let Some(w) = out.write {
        // SAFETY: the host gave this writer for the duration of the current call.
        unsafe { w(out.ctx, bytes.as_ptr(), bytes.len()) };
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `f`; an error's message (or a panic's) goes to `err` with its status.
fn guarded(
    err: TgWriter,
    what: &str,
    f: impl FnOnce() -> Result<(), (TgStatus, String)>,
) -> TgStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => abi::TG_STATUS_OK,
        Ok(Err((status, message))) => {
            write(err, message.as_bytes());
            status
        }
        Err(payload) => {
            let message = format!("{what} panicked: {}", panic_message(payload.as_ref()));
            write(err, message.as_bytes());
            abi::TG_STATUS_INTERNAL
        }
    }
}

/// The text of a borrowed string.
///
/// # Safety
/// `s` must point to `len` readable bytes for the current call.
unsafe fn text<'a>(s: TgStr) -> Result<&'a str, (TgStatus, String)> {
    if s.len == 0 {
        return Ok("");
    }
    if s.ptr.is_null() {
        return Err((
            abi::TG_STATUS_INVALID_INPUT,
            "a null string with a length".into(),
        ));
    }
    // SAFETY: forwarded from the caller.
    let bytes = unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) };
    std::str::from_utf8(bytes)
        .map_err(|e| (abi::TG_STATUS_INVALID_INPUT, format!("not UTF-8: {e}")))
}

fn parse<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, (TgStatus, String)> {
    serde_json::from_str(text).map_err(|e| {
        (
            abi::TG_STATUS_INVALID_INPUT,
            format!("the {what} document: {e}"),
        )
    })
}

fn instance<'a, P>(plugin: *mut TgPlugin) -> Result<&'a Instance<P>, (TgStatus, String)> {
    if plugin.is_null() {
        return Err((abi::TG_STATUS_INVALID_INPUT, "a null plugin".into()));
    }
    // SAFETY: a non-null `TgPlugin*` is one `create::<P>` made, alive until `destroy`.
    Ok(unsafe { &*plugin.cast::<Instance<P>>() })
}

unsafe extern "C" fn create<P: GatewayPlugin>(
    host: *const TgHostV1,
    config: TgStr,
    out: *mut *mut TgPlugin,
    err: TgWriter,
) -> TgStatus {
    guarded(err, "create", || {
        if host.is_null() || out.is_null() {
            return Err((
                abi::TG_STATUS_INVALID_INPUT,
                "create got a null pointer".into(),
            ));
        }
        // SAFETY: the host passes a valid `TgHostV1` for the duration of the call; it is copied.
        let host = Host::from_raw(unsafe { host.read_unaligned() });
        // SAFETY: `config` is borrowed for this call.
        let config = unsafe { text(config) }?;
        let config: serde_json::Value = if config.trim().is_empty() {
            serde_json::Value::Object(serde_json::Map::new())
        } else {
            parse(config, "configuration").map_err(|(_, m)| (abi::TG_STATUS_INVALID_CONFIG, m))?
        };
        let plugin = P::create(&config, host).map_err(|m| (abi::TG_STATUS_INVALID_CONFIG, m))?;
        let boxed = Box::new(Instance {
            plugin,
            calls: Mutex::default(),
        });
        // SAFETY: `out` is non-null and writable for the call.
        unsafe { out.write(Box::into_raw(boxed).cast()) };
        Ok(())
    })
}

unsafe extern "C" fn destroy<P: GatewayPlugin>(plugin: *mut TgPlugin) {
    if plugin.is_null() {
        return;
    }
    // SAFETY: the host calls `destroy` once, on an instance `create::<P>` made.
    let boxed = unsafe { Box::from_raw(plugin.cast::<Instance<P>>()) };
    let calls: Vec<Arc<Slot>> = boxed
        .calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .drain()
        .filter_map(|(_, weak)| weak.upgrade())
        .collect();
    for slot in calls {
        deliver(&slot, ToolOutcome::Cancelled);
    }
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

unsafe extern "C" fn describe<P: GatewayPlugin>(plugin: *mut TgPlugin, out: TgWriter) -> TgStatus {
    let mut document = Vec::new();
    let status = guarded(out, "describe", || {
        let me = instance::<P>(plugin)?;
        let description = Description {
            tools: if P::HOOKS.tools {
                me.plugin.tools()
            } else {
                Vec::new()
            },
        };
        document = serde_json::to_vec(&description)
            .map_err(|e| (abi::TG_STATUS_INTERNAL, e.to_string()))?;
        Ok(())
    });
    if status == abi::TG_STATUS_OK {
        write(out, &document);
    }
    status
}

unsafe extern "C" fn guard<P: GatewayPlugin>(
    plugin: *mut TgPlugin,
    request: TgStr,
    out: TgWriter,
    verdict: *mut TgVerdict,
) -> TgStatus {
    let mut answer: Option<(TgVerdict, Vec<u8>)> = None;
    let status = guarded(out, "guard", || {
        let me = instance::<P>(plugin)?;
        // SAFETY: `request` is borrowed for this call.
        let request: GuardRequest = parse(unsafe { text(request) }?, "request")?;
        let decided = me
            .plugin
            .guard(&request)
            .map_err(|m| (abi::TG_STATUS_INTERNAL, m))?;
        let encode = |v: &dyn erased::Json| v.bytes().map_err(|e| (abi::TG_STATUS_INTERNAL, e));
        answer = Some(match &decided {
            Verdict::Allow => (abi::TG_VERDICT_ALLOW, Vec::new()),
            Verdict::Reject(r) => (abi::TG_VERDICT_REJECT, encode(r)?),
            Verdict::Rewrite(r) => (abi::TG_VERDICT_REWRITE, encode(r)?),
        });
        Ok(())
    });
    if let Some((decided, bytes)) = answer {
        if verdict.is_null() {
            return abi::TG_STATUS_INVALID_INPUT;
        }
        write(out, &bytes);
        // SAFETY: `verdict` is non-null and writable for the call.
        unsafe { verdict.write(decided) };
    }
    status
}

mod erased {
    /// A document the guard writes.
    pub(super) trait Json {
        fn bytes(&self) -> Result<Vec<u8>, String>;
    }
    impl<T: serde::Serialize> Json for T {
        fn bytes(&self) -> Result<Vec<u8>, String> {
            serde_json::to_vec(self).map_err(|e| e.to_string())
        }
    }
}

unsafe extern "C" fn transform_open<P: GatewayPlugin>(
    plugin: *mut TgPlugin,
    context: TgStr,
    out: *mut *mut TgTransform,
) -> TgStatus {
    let sink = TgWriter {
        ctx: std::ptr::null_mut(),
        write: None,
    };
    guarded(sink, "transform_open", || {
        let me = instance::<P>(plugin)?;
        if out.is_null() {
            return Err((abi::TG_STATUS_INVALID_INPUT, "a null output".into()));
        }
        // SAFETY: `context` is borrowed for this call.
        let context: TransformContext = parse(unsafe { text(context) }?, "transform context")?;
        let transform: TransformBox = me
            .plugin
            .transform(&context)
            .map_err(|m| (abi::TG_STATUS_INTERNAL, m))?;
        // SAFETY: `out` is non-null and writable for the call.
        unsafe { out.write(Box::into_raw(Box::new(transform)).cast()) };
        Ok(())
    })
}

unsafe extern "C" fn transform_feed(
    transform: *mut TgTransform,
    piece: TgStr,
    last: u32,
    out: TgWriter,
) -> TgStatus {
    let mut ready = String::new();
    let status = guarded(out, "transform_feed", || {
        if transform.is_null() {
            return Err((abi::TG_STATUS_INVALID_INPUT, "a null transform".into()));
        }
        // SAFETY: a non-null `TgTransform*` is one `transform_open` made, not yet closed, and
        // the host feeds one transform from one thread at a time.
        let state = unsafe { &mut *transform.cast::<TransformBox>() };
        // SAFETY: `piece` is borrowed for this call.
        ready = state.feed(unsafe { text(piece) }?, last != 0);
        Ok(())
    });
    if status == abi::TG_STATUS_OK {
        write(out, ready.as_bytes());
    }
    status
}

unsafe extern "C" fn transform_close(transform: *mut TgTransform) {
    if transform.is_null() {
        return;
    }
    // SAFETY: the host closes each transform once, after its last feed.
    let state = unsafe { Box::from_raw(transform.cast::<TransformBox>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(state)));
}

unsafe extern "C" fn tool_call<P: GatewayPlugin>(
    plugin: *mut TgPlugin,
    id: u64,
    call: TgStr,
    sink: TgToolSinkV1,
    err: TgWriter,
) -> TgStatus {
    guarded(err, "tool_call", || {
        let me = instance::<P>(plugin)?;
        // SAFETY: `call` is borrowed for this call.
        let call: ToolCall = parse(unsafe { text(call) }?, "tool call")?;
        let slot: Arc<Slot> = Arc::new(Mutex::new(SlotState {
            sink: Some(Sink::new(sink)),
            ..SlotState::default()
        }));
        let done = ToolDone::new(Arc::clone(&slot));
        let started = catch_unwind(AssertUnwindSafe(|| me.plugin.call_tool(id, call, done)))
            .unwrap_or_else(|p| Err(format!("tool_call panicked: {}", panic_message(p.as_ref()))));
        let mut state = lock(&slot);
        match started {
            // Answered already (inside `call_tool`): the call stands, whatever it returned.
            _ if state.sink.is_none() => Ok(()),
            Ok(()) => {
                state.accepted = true;
                let abandoned = state.abandoned;
                drop(state);
                if abandoned {
                    deliver(
                        &slot,
                        ToolOutcome::Failed("the tool ended without an answer".into()),
                    );
                }
                let mut calls = me
                    .calls
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                calls.retain(|_, weak| weak.strong_count() > 0);
                calls.insert(id, Arc::downgrade(&slot));
                Ok(())
            }
            Err(message) => {
                // A refused call never hears `done`: the sink goes back unanswered.
                state.sink = None;
                Err((abi::TG_STATUS_UNSUPPORTED, message))
            }
        }
    })
}

unsafe extern "C" fn tool_cancel<P: GatewayPlugin>(plugin: *mut TgPlugin, id: u64) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Ok(me) = instance::<P>(plugin) {
            me.plugin.cancel_tool(id);
        }
    }));
}
