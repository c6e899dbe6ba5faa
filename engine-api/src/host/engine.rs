//! A live engine instance and the streams of its requests.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_core::Stream;

use super::bridge::{EventReceiver, sink_pair};
use super::loader::PluginInfo;
use super::log::HostTable;
use super::writer::{EMBED_LIMIT, OutBuf, SMALL_LIMIT};
use crate::abi::{TpEmbedRequestV1, TpEngine, TpEngineApiV1, TpRequestV1, TpSinkV1};
use crate::event::{EngineError, EngineEvent, Status};
use crate::json::{EmbedParams, GenerationParams, ModelInfo, Stats};
use crate::layout;

/// What the host asks an engine to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    /// Model id.
    pub model: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation parameters.
    pub params: GenerationParams,
    /// The W3C `traceparent` of the host's span for it, when traced (`TpRequestV1.trace_context`).
    pub trace_context: Option<String>,
}

struct EngineInner {
    info: Arc<PluginInfo>,
    api: TpEngineApiV1,
    raw: *mut TpEngine,
    next_id: AtomicU64,
    // Must outlive `raw`: the plugin may log until `destroy` returns.
    _host: HostTable,
}

// SAFETY: the ABI makes every entry but create/destroy callable from any thread concurrently;
// `destroy` runs once, from `Drop`, when no other reference exists.
unsafe impl Send for EngineInner {}
// SAFETY: as above.
unsafe impl Sync for EngineInner {}

impl Drop for EngineInner {
    fn drop(&mut self) {
        if let Some(destroy) = self.api.destroy {
            // SAFETY: last reference: no call is in flight and none can start.
            unsafe { destroy(self.raw) };
        }
    }
}

impl EngineInner {
    fn cancel(&self, id: u64) -> Status {
        let Some(cancel) = self.api.cancel else {
            return Status::Internal;
        };
        // SAFETY: `raw` is live while `self` is.
        let status = Status::from_raw(unsafe { cancel(self.raw, id) });
        if status != Status::Ok {
            tracing::warn!(plugin = %self.info.name, request = id, %status, "cancel failed");
        }
        status
    }
}

/// A live engine. Cheap to clone and shareable across threads; destroyed when the last handle
/// and the last stream are gone.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("plugin", &self.inner.info.name)
            .finish()
    }
}

impl EngineHandle {
    pub(crate) fn new(
        info: Arc<PluginInfo>,
        api: TpEngineApiV1,
        raw: *mut TpEngine,
        host: HostTable,
    ) -> Self {
        let inner = EngineInner {
            info,
            api,
            raw,
            next_id: AtomicU64::new(1),
            _host: host,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The plugin this engine came from.
    pub fn plugin(&self) -> &PluginInfo {
        &self.inner.info
    }

    fn call_out(
        &self,
        what: &str,
        limit: usize,
        f: impl FnOnce(&mut OutBuf) -> u32,
    ) -> Result<Vec<u8>, EngineError> {
        let mut out = OutBuf::new(limit);
        let status = Status::from_raw(f(&mut out));
        if status != Status::Ok {
            return Err(EngineError::new(
                status,
                out.message(&format!("{what} failed")),
            ));
        }
        out.bytes()
            .map(<[u8]>::to_vec)
            .map_err(|e| EngineError::internal(format!("{what}: {e}")))
    }

    /// The models the engine serves.
    pub fn models(&self) -> Result<Vec<ModelInfo>, EngineError> {
        let models = self
            .inner
            .api
            .models
            .ok_or_else(|| EngineError::internal("no models entry"))?;
        let raw = self.inner.raw;
        // SAFETY: `raw` is live; the writer's buffer outlives the call.
        let bytes = self.call_out("models", SMALL_LIMIT, |out| unsafe {
            models(raw, out.writer())
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::internal(format!("models returned malformed JSON: {e}")))
    }

    /// Counters; `Unsupported` when the plugin has no `stats`.
    pub fn stats(&self) -> Result<Stats, EngineError> {
        let stats = self
            .inner
            .api
            .stats
            .ok_or_else(|| EngineError::unsupported("this plugin reports no stats"))?;
        let raw = self.inner.raw;
        // SAFETY: `raw` is live; the writer's buffer outlives the call.
        let bytes = self.call_out("stats", SMALL_LIMIT, |out| unsafe {
            stats(raw, out.writer())
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::internal(format!("stats returned malformed JSON: {e}")))
    }

    /// `Ok` when the engine can serve (also when the plugin has no `health`).
    pub fn health(&self) -> Result<(), EngineError> {
        let Some(health) = self.inner.api.health else {
            return Ok(());
        };
        let raw = self.inner.raw;
        // SAFETY: `raw` is live; the writer's buffer outlives the call.
        self.call_out("health", SMALL_LIMIT, |out| unsafe {
            health(raw, out.writer())
        })
        .map(drop)
    }

    /// Starts a request. The stream ends after the FINAL event; dropping it earlier cancels the
    /// request in the engine.
    pub fn submit(&self, request: &EngineRequest) -> Result<EventStream, EngineError> {
        let params = serde_json::to_string(&request.params)
            .map_err(|e| EngineError::internal(format!("cannot serialise parameters: {e}")))?;
        let (sink, events) = sink_pair();
        let trace = request.trace_context.as_deref().unwrap_or("");
        // SAFETY: a fresh bridge sink, handed to this one submit only.
        let id =
            unsafe { self.submit_parts(&request.model, &request.prompt, &params, trace, sink) }?;
        Ok(EventStream {
            events,
            id,
            engine: Some(Arc::clone(&self.inner)),
        })
    }

    /// Submits with a caller-provided sink and raw parameter text, for hosts that route events
    /// elsewhere and for tests; returns the request's id. The sink is handed over whatever the
    /// outcome, as the ABI says.
    ///
    /// # Safety
    /// `sink` must be valid as the ABI requires until the plugin calls its `release`, and must
    /// not be handed to any other `submit` (its `release` runs exactly once).
    pub unsafe fn submit_raw(
        &self,
        model: &str,
        prompt: &[u32],
        params_json: &str,
        sink: TpSinkV1,
    ) -> Result<u64, EngineError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.submit_parts(model, prompt, params_json, "", sink) }
    }

    /// [`Self::submit_raw`] with the request's trace context.
    ///
    /// # Safety
    /// As [`Self::submit_raw`].
    unsafe fn submit_parts(
        &self,
        model: &str,
        prompt: &[u32],
        params_json: &str,
        trace_context: &str,
        sink: TpSinkV1,
    ) -> Result<u64, EngineError> {
        let id = self.next_request_id();
        let request = TpRequestV1 {
            struct_size: size_of::<TpRequestV1>() as u32,
            reserved: 0,
            id,
            model: layout::tp_str(model),
            prompt: layout::tp_tokens(prompt),
            params_json: layout::tp_str(params_json),
            trace_context: layout::tp_str(trace_context),
        };
        // SAFETY: `request` borrows data that outlives the call; the caller vouches for `sink`.
        unsafe { self.submit_request(&request, sink) }.map(|()| id)
    }

    /// Submits a raw request (which may be a larger struct that starts with a `TpRequestV1`).
    ///
    /// # Safety
    /// `request` must be valid for its declared `struct_size` for the duration of the call.
    pub(crate) unsafe fn submit_request(
        &self,
        request: *const TpRequestV1,
        sink: TpSinkV1,
    ) -> Result<(), EngineError> {
        let submit = self
            .inner
            .api
            .submit
            .ok_or_else(|| EngineError::internal("no submit entry"))?;
        let mut err = OutBuf::new(SMALL_LIMIT);
        // SAFETY: `raw` is live; the caller vouches for `request`; the sink is handed over.
        let status =
            Status::from_raw(unsafe { submit(self.inner.raw, request, sink, err.writer()) });
        if status == Status::Ok {
            Ok(())
        } else {
            Err(EngineError::new(status, err.message("request refused")))
        }
    }

    /// A fresh request id for this engine.
    pub(crate) fn next_request_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Asks the engine to stop a request (what dropping its stream does); returns the status
    /// `cancel` returned, which is `Ok` unless the plugin failed inside it.
    pub fn cancel(&self, id: u64) -> Status {
        self.inner.cancel(id)
    }

    /// Whether the plugin serves embeddings.
    pub fn supports_embeddings(&self) -> bool {
        self.inner.api.embed.is_some()
    }

    /// One vector per input. Runs on the calling thread and may take a while: call it from a
    /// blocking-capable thread.
    pub fn embed(
        &self,
        model: &str,
        inputs: &[Vec<u32>],
        params: &EmbedParams,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let embed = self
            .inner
            .api
            .embed
            .ok_or_else(|| EngineError::unsupported("this engine serves no embeddings"))?;
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let params = serde_json::to_string(params)
            .map_err(|e| EngineError::internal(format!("cannot serialise parameters: {e}")))?;
        let arrays: Vec<_> = inputs.iter().map(|t| layout::tp_tokens(t)).collect();
        let raw_request = TpEmbedRequestV1 {
            struct_size: size_of::<TpEmbedRequestV1>() as u32,
            reserved: 0,
            model: layout::tp_str(model),
            inputs: arrays.as_ptr(),
            num_inputs: arrays.len(),
            params_json: layout::tp_str(&params),
        };
        let raw = self.inner.raw;
        // SAFETY: `raw` is live; the request borrows data that outlives the call.
        let bytes = self.call_out("embed", EMBED_LIMIT, |out| unsafe {
            embed(raw, &raw_request, out.writer())
        })?;
        let floats = bytes.len() / 4;
        if floats == 0 || bytes.len() % 4 != 0 || floats % inputs.len() != 0 {
            return Err(EngineError::internal(format!(
                "embed returned {} bytes, not a whole number of vectors for {} inputs",
                bytes.len(),
                inputs.len()
            )));
        }
        let dim = floats / inputs.len();
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(values.chunks(dim.max(1)).map(<[f32]>::to_vec).collect())
    }
}

/// The events of one request (see [`EventReceiver`]), which cancels the request in the engine
/// when dropped before its FINAL event.
#[derive(Debug)]
pub struct EventStream {
    events: EventReceiver,
    id: u64,
    engine: Option<Arc<EngineInner>>,
}

impl std::fmt::Debug for EngineInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineInner")
            .field("plugin", &self.info.name)
            .finish()
    }
}

impl EventStream {
    /// The engine-level id of the request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event, or `None` after the FINAL.
    pub async fn recv(&mut self) -> Option<EngineEvent> {
        self.events.recv().await
    }
}

impl Stream for EventStream {
    type Item = EngineEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EngineEvent>> {
        self.get_mut().events.poll_event(cx)
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take()
            && !self.events.engine_finished()
        {
            engine.cancel(self.id);
        }
    }
}
