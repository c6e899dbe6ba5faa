//! The `extern "C"` entry points that wrap an [`Engine`]: validate raw input, call the engine
//! inside `catch_unwind`, and turn results and panics into statuses and writer output.

use std::any::Any;
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::sink::{Lifecycle, SinkCell};
use super::{EmbedRequest, Engine, Host, Request, Sink};
use crate::abi::{
    self, TpEmbedRequestV1, TpEngine, TpEngineApiV1, TpHostV1, TpRequestV1, TpSinkV1, TpStatus,
    TpStr, TpWriter,
};
use crate::event::EngineError;
use crate::json::{EmbedParams, GenerationParams, from_json_object};
use crate::layout;

/// What a `TpEngine*` points to.
struct Instance<E> {
    engine: E,
    life: Arc<Lifecycle>,
    host: Host,
}

/// The function table for `E`; used by `export_engine!`.
#[doc(hidden)]
pub const fn api_table<E: Engine>(name: *const c_char, version: *const c_char) -> TpEngineApiV1 {
    TpEngineApiV1 {
        struct_size: size_of::<TpEngineApiV1>() as u32,
        abi_major: abi::TP_ABI_MAJOR,
        abi_minor: abi::TP_ABI_MINOR,
        name,
        version,
        create: Some(create::<E>),
        destroy: Some(destroy::<E>),
        models: Some(models::<E>),
        submit: Some(submit::<E>),
        cancel: Some(cancel::<E>),
        stats: Some(stats::<E>),
        health: Some(health::<E>),
        embed: if E::EMBEDDINGS {
            Some(embed::<E>)
        } else {
            None
        },
    }
}

fn write(out: TpWriter, bytes: &[u8]) {
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

/// Runs `f`, writing an error's message (or a panic's) to `err` and returning its status.
fn guarded(err: TpWriter, what: &str, f: impl FnOnce() -> Result<(), EngineError>) -> TpStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => abi::TP_STATUS_OK,
        Ok(Err(e)) => {
            write(err, e.message.as_bytes());
            e.status.to_raw()
        }
        Err(payload) => {
            let e = panicked(what, payload.as_ref());
            write(err, e.message.as_bytes());
            e.status.to_raw()
        }
    }
}

fn panicked(what: &str, payload: &(dyn Any + Send)) -> EngineError {
    EngineError::internal(format!(
        "plugin panicked in {what}: {}",
        panic_message(payload)
    ))
}

/// The instance behind a raw engine pointer.
///
/// # Safety
/// `engine` must be NULL or a pointer `create::<E>` returned and `destroy` has not consumed.
unsafe fn instance<'a, E>(engine: *mut TpEngine) -> Result<&'a Instance<E>, EngineError> {
    // SAFETY: forwarded from the caller.
    unsafe { engine.cast::<Instance<E>>().as_ref() }
        .ok_or_else(|| EngineError::invalid_request("engine pointer is NULL"))
}

fn utf8(s: TpStr, what: &str) -> Result<String, EngineError> {
    // SAFETY: the ABI makes every TpStr argument valid for the call.
    let bytes = unsafe { layout::str_bytes(s) };
    String::from_utf8(bytes.to_vec())
        .map_err(|_| EngineError::invalid_request(format!("{what} is not valid UTF-8")))
}

unsafe extern "C" fn create<E: Engine>(
    host: *const TpHostV1,
    config: TpStr,
    out_engine: *mut *mut TpEngine,
    err: TpWriter,
) -> TpStatus {
    guarded(err, "create", || {
        if out_engine.is_null() {
            return Err(EngineError::invalid_request("out_engine is NULL"));
        }
        // SAFETY: the host passes its table, valid for its struct_size.
        let raw = unsafe { layout::read_at_least(host, layout::HOST_V1_0_SIZE, "host table") }
            .map_err(EngineError::invalid_request)?;
        if raw.abi_major != abi::TP_ABI_MAJOR {
            return Err(EngineError::invalid_request(format!(
                "host speaks ABI major {}, this plugin major {}",
                raw.abi_major,
                abi::TP_ABI_MAJOR
            )));
        }
        let host = Host::from_raw(raw);
        let config = utf8(config, "config").map_err(|e| EngineError::invalid_config(e.message))?;
        let engine = E::create(host.clone(), &config)?;
        let instance = Box::new(Instance {
            engine,
            life: Arc::default(),
            host,
        });
        // SAFETY: checked non-null above; the host owns the pointer until `destroy`.
        unsafe { *out_engine = Box::into_raw(instance).cast::<TpEngine>() };
        Ok(())
    })
}

unsafe extern "C" fn destroy<E: Engine>(engine: *mut TpEngine) {
    if engine.is_null() {
        return;
    }
    // SAFETY: `engine` came from `create::<E>`, and the host calls `destroy` once, last.
    let instance = unsafe { Box::from_raw(engine.cast::<Instance<E>>()) };
    let life = Arc::clone(&instance.life);
    let host = instance.host.clone();
    life.destroying.store(true, Ordering::Release);
    let outcome = catch_unwind(AssertUnwindSafe(move || {
        instance.engine.shutdown();
        drop(instance);
    }));
    if let Err(payload) = outcome {
        host.error(&format!(
            "plugin panicked in destroy: {}",
            panic_message(payload.as_ref())
        ));
    }
    // Rule 5: every sink is released before `destroy` returns, also those an engine thread
    // still holds; wait for them, saying so.
    life.wait_released(|left| {
        host.warn(&format!(
            "destroy is waiting for {left} requests whose sinks the engine still holds"
        ));
    });
    host.disconnect();
}

unsafe extern "C" fn models<E: Engine>(engine: *mut TpEngine, out: TpWriter) -> TpStatus {
    guarded(out, "models", || {
        // SAFETY: the host passes the pointer `create` returned.
        let instance = unsafe { instance::<E>(engine) }?;
        let json = serde_json::to_vec(&instance.engine.models())
            .map_err(|e| EngineError::internal(format!("cannot serialise models: {e}")))?;
        write(out, &json);
        Ok(())
    })
}

fn parse_request(request: *const TpRequestV1) -> Result<Request, EngineError> {
    // SAFETY: the host passes a request valid for its struct_size, for the call.
    let raw = unsafe { layout::read_at_least(request, layout::REQUEST_V1_0_SIZE, "request") }
        .map_err(EngineError::invalid_request)?;
    let params = utf8(raw.params_json, "params_json")?;
    Ok(Request {
        id: raw.id,
        model: utf8(raw.model, "model")?,
        // SAFETY: the ABI makes `prompt` valid for the call.
        prompt: unsafe { layout::tokens(raw.prompt) }.to_vec(),
        params: GenerationParams::from_json(&params).map_err(EngineError::invalid_request)?,
        // Zero (an older host) reads as empty.
        trace_context: utf8(raw.trace_context, "trace_context")?,
    })
}

/// Releases a sink that never reached a cell (a request refused before the engine saw it).
fn release_raw(sink: TpSinkV1) {
    if let Some(release) = sink.release {
        // SAFETY: the sink was handed to `submit`, which must release it exactly once; no cell
        // owns it, so this is the one release.
        unsafe { release(sink.ctx) };
    }
}

unsafe extern "C" fn submit<E: Engine>(
    engine: *mut TpEngine,
    request: *const TpRequestV1,
    sink: TpSinkV1,
    err: TpWriter,
) -> TpStatus {
    let prepared = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host passes the pointer `create` returned.
        let instance = unsafe { instance::<E>(engine) }?;
        if sink.on_event.is_none() {
            return Err(EngineError::invalid_request("the sink's on_event is NULL"));
        }
        Ok((instance, parse_request(request)?))
    }))
    .unwrap_or_else(|payload| Err(panicked("submit", payload.as_ref())));
    let (instance, request) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            release_raw(sink);
            write(err, e.message.as_bytes());
            return e.status.to_raw();
        }
    };
    let cell = SinkCell::new(sink, request.id, Arc::clone(&instance.life));
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        instance
            .engine
            .submit(request, Sink::new(Arc::clone(&cell)))
    }));
    let error = match outcome {
        Ok(Ok(())) => return abi::TP_STATUS_OK,
        Ok(Err(e)) => e,
        Err(payload) => panicked("submit", payload.as_ref()),
    };
    if cell.refuse(error.clone()) {
        write(err, error.message.as_bytes());
        error.status.to_raw()
    } else {
        // Events already went out: the request counts as accepted and its FINAL carries the error.
        abi::TP_STATUS_OK
    }
}

unsafe extern "C" fn cancel<E: Engine>(engine: *mut TpEngine, request_id: u64) -> TpStatus {
    let nowhere = TpWriter {
        ctx: std::ptr::null_mut(),
        write: None,
    };
    guarded(nowhere, "cancel", || {
        // SAFETY: the host passes the pointer `create` returned.
        unsafe { instance::<E>(engine) }?.engine.cancel(request_id);
        Ok(())
    })
}

unsafe extern "C" fn stats<E: Engine>(engine: *mut TpEngine, out: TpWriter) -> TpStatus {
    guarded(out, "stats", || {
        // SAFETY: the host passes the pointer `create` returned.
        let instance = unsafe { instance::<E>(engine) }?;
        let stats = instance.engine.stats(instance.life.stats());
        let json = serde_json::to_vec(&stats)
            .map_err(|e| EngineError::internal(format!("cannot serialise stats: {e}")))?;
        write(out, &json);
        Ok(())
    })
}

unsafe extern "C" fn health<E: Engine>(engine: *mut TpEngine, out: TpWriter) -> TpStatus {
    guarded(out, "health", || {
        // SAFETY: the host passes the pointer `create` returned.
        unsafe { instance::<E>(engine) }?.engine.health()
    })
}

fn parse_embed_request(request: *const TpEmbedRequestV1) -> Result<EmbedRequest, EngineError> {
    // SAFETY: the host passes a request valid for its struct_size, for the call.
    let raw =
        unsafe { layout::read_at_least(request, layout::EMBED_REQUEST_V1_0_SIZE, "embed request") }
            .map_err(EngineError::invalid_request)?;
    let inputs = if raw.inputs.is_null() || raw.num_inputs == 0 {
        &[][..]
    } else {
        // SAFETY: the ABI says `inputs` holds `num_inputs` arrays, valid for the call.
        unsafe { std::slice::from_raw_parts(raw.inputs, raw.num_inputs) }
    };
    let params = utf8(raw.params_json, "params_json")?;
    let params: EmbedParams = from_json_object(&params)
        .map_err(|e| EngineError::invalid_request(format!("invalid embed parameters: {e}")))?;
    Ok(EmbedRequest {
        model: utf8(raw.model, "model")?,
        // SAFETY: each input array is valid for the call.
        inputs: inputs
            .iter()
            .map(|t| unsafe { layout::tokens(*t) }.to_vec())
            .collect(),
        params,
    })
}

unsafe extern "C" fn embed<E: Engine>(
    engine: *mut TpEngine,
    request: *const TpEmbedRequestV1,
    out: TpWriter,
) -> TpStatus {
    guarded(out, "embed", || {
        // SAFETY: the host passes the pointer `create` returned.
        let instance = unsafe { instance::<E>(engine) }?;
        let request = parse_embed_request(request)?;
        let expected = request.inputs.len();
        let vectors = instance.engine.embed(request)?;
        let dim = vectors.first().map_or(0, Vec::len);
        if vectors.len() != expected || vectors.iter().any(|v| v.len() != dim) {
            return Err(EngineError::internal(format!(
                "engine returned {} vectors of uneven or wrong size for {expected} inputs",
                vectors.len()
            )));
        }
        let mut bytes = Vec::with_capacity(expected * dim * 4);
        for x in vectors.iter().flatten() {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        write(out, &bytes);
        Ok(())
    })
}
