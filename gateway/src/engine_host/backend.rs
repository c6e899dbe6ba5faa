//! The gateway's view of an engine: a small trait with plain data, so routes and the pipeline can
//! run against a plugin (the real thing) or a scripted fake (router tests) alike.

use std::fmt;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use turnpike_engine_api::host::{EngineHandle, EngineRequest};
use turnpike_engine_api::{EmbedParams, EngineError, EngineEvent, ModelInfo, Stats};

/// A running request: its events, and a way to stop it early while still reading its FINAL (for
/// exact usage). Dropping it before the FINAL also cancels it.
pub struct EngineRun {
    /// The events; the last is the FINAL.
    pub events: BoxStream<'static, EngineEvent>,
    cancel: Box<dyn Fn() + Send + Sync>,
    /// For a routed model, which route and engine took it (`standby fleet-b`).
    pub route: Option<String>,
}

impl fmt::Debug for EngineRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineRun").finish_non_exhaustive()
    }
}

impl EngineRun {
    /// A run from its events and a canceller.
    pub fn new(
        events: BoxStream<'static, EngineEvent>,
        cancel: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Self {
            events,
            cancel: Box::new(cancel),
            route: None,
        }
    }

    /// Asks the engine to stop; the FINAL still follows.
    pub fn cancel(&self) {
        (self.cancel)();
    }
}

/// An engine as the gateway uses it.
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// `name/version` of the engine, for `system_fingerprint` and logs.
    fn label(&self) -> String;
    /// The models it serves.
    fn models(&self) -> Result<Vec<ModelInfo>, EngineError>;
    /// Starts a request.
    fn submit(&self, request: &EngineRequest) -> Result<EngineRun, EngineError>;
    /// Embeds inputs (blocking: call from a blocking-capable thread).
    fn embed(
        &self,
        model: &str,
        inputs: &[Vec<u32>],
        params: &EmbedParams,
    ) -> Result<Vec<Vec<f32>>, EngineError>;
    /// Whether embeddings are served at all.
    fn supports_embeddings(&self) -> bool;
    /// `Ok` when it can serve.
    fn health(&self) -> Result<(), EngineError>;
    /// Counters.
    fn stats(&self) -> Result<Stats, EngineError>;
}

/// A plugin engine.
#[derive(Debug, Clone)]
pub struct PluginBackend {
    handle: EngineHandle,
}

impl PluginBackend {
    /// Wraps a created plugin engine.
    pub fn shared(handle: EngineHandle) -> Arc<dyn Backend> {
        Arc::new(Self { handle })
    }
}

impl Backend for PluginBackend {
    fn label(&self) -> String {
        let p = self.handle.plugin();
        format!("{}/{}", p.name, p.version)
    }

    fn models(&self) -> Result<Vec<ModelInfo>, EngineError> {
        self.handle.models()
    }

    fn submit(&self, request: &EngineRequest) -> Result<EngineRun, EngineError> {
        let stream = self.handle.submit(request)?;
        let (handle, id) = (self.handle.clone(), stream.id());
        Ok(EngineRun::new(Box::pin(stream), move || {
            let _ = handle.cancel(id);
        }))
    }

    fn embed(
        &self,
        model: &str,
        inputs: &[Vec<u32>],
        params: &EmbedParams,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.handle.embed(model, inputs, params)
    }

    fn supports_embeddings(&self) -> bool {
        self.handle.supports_embeddings()
    }

    fn health(&self) -> Result<(), EngineError> {
        self.handle.health()
    }

    fn stats(&self) -> Result<Stats, EngineError> {
        self.handle.stats()
    }
}
