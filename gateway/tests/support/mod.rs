//! Router test support: the real axum app over a scripted fake engine behind the same `Backend`
//! trait, with the project's own model folder (`examples/models/sim-small`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures_util::StreamExt;
use serde_json::Value;
use tower::ServiceExt;
use turnpike::config::{Config, Defaults, ModelConfig, ServerConfig};
use turnpike::engine_host::{self, Backend, EngineRun};
use turnpike::routes::{AppState, router};
use turnpike::tenancy::Tenancy;
use turnpike::text::tokenizer::TextTokenizer;
use turnpike_engine_api::host::EngineRequest;
use turnpike_engine_api::{
    Capabilities, EmbedParams, EngineError, EngineEvent, FinalEvent, Finish, ModelInfo, Stats,
    Status, TokenEvent, TopLogprob, Usage,
};

/// One step of a scripted generation.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// A token of a choice, with optional logprob and alternatives.
    Token {
        choice: u32,
        id: u32,
        logprob: Option<f32>,
        top: Vec<TopLogprob>,
    },
    /// A pause.
    Sleep(Duration),
    /// One choice of several ended.
    ChoiceEnd { choice: u32, finish: Finish },
    /// The FINAL.
    Final(FinalEvent),
}

/// Builds the steps of a request, or refuses it.
pub(crate) type Script =
    Box<dyn Fn(&EngineRequest) -> Result<Vec<Step>, EngineError> + Send + Sync>;

/// What the fake saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub requests: Mutex<Vec<EngineRequest>>,
    pub cancels: AtomicU32,
    /// Runs dropped before their FINAL was read.
    pub dropped: AtomicU32,
}

/// A scripted engine.
pub(crate) struct FakeBackend {
    pub info: ModelInfo,
    pub script: Script,
    pub seen: Arc<Seen>,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeBackend")
    }
}

struct DropWatch {
    seen: Arc<Seen>,
    finished: Arc<AtomicBool>,
}

impl Drop for DropWatch {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::SeqCst) {
            self.seen.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Backend for FakeBackend {
    fn label(&self) -> String {
        "fake/1".into()
    }

    fn models(&self) -> Result<Vec<ModelInfo>, EngineError> {
        Ok(vec![self.info.clone()])
    }

    fn submit(&self, request: &EngineRequest) -> Result<EngineRun, EngineError> {
        self.seen.requests.lock().unwrap().push(request.clone());
        let steps = (self.script)(request)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&cancelled);
        let prompt = request.prompt.len() as u32;
        tokio::spawn(async move {
            let mut produced = 0;
            for step in steps {
                if stop.load(Ordering::SeqCst) {
                    let usage = Usage {
                        prompt_tokens: prompt,
                        completion_tokens: produced,
                        ..Usage::default()
                    };
                    let _ = tx.send(EngineEvent::Final(FinalEvent::failed(
                        Status::Cancelled,
                        "cancelled",
                        usage,
                    )));
                    return;
                }
                let event = match step {
                    Step::Sleep(d) => {
                        tokio::time::sleep(d).await;
                        continue;
                    }
                    Step::Token {
                        choice,
                        id,
                        logprob,
                        top,
                    } => {
                        produced += 1;
                        EngineEvent::Token(TokenEvent {
                            choice,
                            token_id: id,
                            logprob,
                            top_logprobs: top,
                        })
                    }
                    Step::ChoiceEnd { choice, finish } => EngineEvent::ChoiceEnd { choice, finish },
                    Step::Final(fin) => EngineEvent::Final(fin),
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        let watch = DropWatch {
            seen: Arc::clone(&self.seen),
            finished: Arc::clone(&finished),
        };
        let events = futures_util::stream::unfold((rx, watch), |(mut rx, watch)| async move {
            let event = rx.recv().await?;
            if matches!(event, EngineEvent::Final(_)) {
                watch.finished.store(true, Ordering::SeqCst);
            }
            Some((event, (rx, watch)))
        });
        let seen = Arc::clone(&self.seen);
        Ok(EngineRun::new(events.boxed(), move || {
            seen.cancels.fetch_add(1, Ordering::SeqCst);
            cancelled.store(true, Ordering::SeqCst);
        }))
    }

    fn embed(
        &self,
        _model: &str,
        inputs: &[Vec<u32>],
        params: &EmbedParams,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let dim = params.dimensions.unwrap_or(4) as usize;
        Ok(inputs
            .iter()
            .map(|ids| (0..dim).map(|i| (ids.len() + i) as f32 * 0.5).collect())
            .collect())
    }

    fn supports_embeddings(&self) -> bool {
        true
    }

    fn health(&self) -> Result<(), EngineError> {
        Ok(())
    }

    fn stats(&self) -> Result<Stats, EngineError> {
        Ok(Stats::default())
    }
}

/// The model folder tests use.
pub(crate) fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models/sim-small")
}

/// The folder's tokenizer.
pub(crate) fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_file(&folder().join("tokenizer.json")).unwrap()
}

/// Token ids of `text`.
pub(crate) fn ids(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).unwrap()
}

/// Steps that emit `text` as choice 0, then end with `length`.
pub(crate) fn say(text: &str) -> Vec<Step> {
    let ids = ids(text);
    let n = ids.len() as u32;
    let mut steps: Vec<Step> = ids
        .into_iter()
        .map(|id| Step::Token {
            choice: 0,
            id,
            logprob: None,
            top: vec![],
        })
        .collect();
    steps.push(Step::Final(FinalEvent::ok(
        Finish::length(),
        Usage {
            completion_tokens: n,
            ..Usage::default()
        },
    )));
    steps
}

/// A fake serving model `fake` (and alias `fake-alias`) with full capabilities.
pub(crate) fn fake(script: Script) -> (Arc<Seen>, FakeBackend) {
    let seen = Arc::new(Seen::default());
    let info = ModelInfo {
        id: "fake-engine-model".into(),
        owned_by: Some("tests".into()),
        max_context: 2048,
        vocab_size: 1024,
        eos_token_ids: vec![4],
        tokenizer: None,
        embedding_dim: Some(8),
        capabilities: Capabilities {
            generation: true,
            max_n: 8,
            logprobs: true,
            max_top_logprobs: 20,
            sampling: true,
            penalties: true,
            grammar: false,
            tool_call_grammar: false,
            speculative: false,
            draft_confidence: false,
            resume: false,
            max_beam_width: 0,
        },
    };
    (Arc::clone(&seen), FakeBackend { info, script, seen })
}

/// Server settings for tests (short heartbeat and timeout where a test sets them).
pub(crate) fn server(heartbeat_ms: u64, timeout_ms: u64) -> ServerConfig {
    ServerConfig {
        max_body_bytes: 64 * 1024,
        stream_heartbeat: Duration::from_millis(heartbeat_ms),
        request_timeout: Duration::from_millis(timeout_ms),
        retry_after: Duration::from_millis(1500),
        cors: turnpike::config::CorsOrigins::None,
        websocket_max_connections: 16,
        websocket_max_duration: Duration::from_secs(3600),
        websocket_max_per_tenant: 16,
        websocket_idle_timeout: Duration::from_secs(300),
        connections: turnpike::listener::ConnectionLimits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(30),
        },
        body_read_timeout: Duration::from_secs(30),
        tls: None,
        health_listen: None,
        drain: turnpike::routes::settings::Drain {
            delay: Duration::ZERO,
            timeout: Duration::from_secs(30),
        },
    }
}

/// The seed's defaults.
pub(crate) fn defaults() -> Defaults {
    Defaults {
        max_request_tokens: 8192,
        max_output_tokens: 64,
        temperature: 0.7,
        top_p: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        tool_call_parser: None,
    }
}

/// The app over `backend`, with the given server settings.
pub(crate) fn app_with(backend: FakeBackend, server_config: ServerConfig) -> Router {
    app_with_model(backend, server_config, |_| {})
}

/// Tenancy services from configuration text (the tenancy sections only).
pub(crate) fn tenancy(toml: &str) -> Arc<Tenancy> {
    let text = format!("{toml}\n[[engines]]\nname = \"fake\"\nplugin = \"none.so\"\n");
    let config = Config::from_toml(&text, std::path::Path::new("/tmp/turnpike.toml"), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Tenancy::build(&config.tenancy, Duration::from_secs(1)).unwrap())
}

/// The app over `backend`, its model configuration changed by `edit`, without authentication.
pub(crate) fn app_with_model(
    backend: FakeBackend,
    server_config: ServerConfig,
    edit: impl FnOnce(&mut ModelConfig),
) -> Router {
    app_with_tenancy(
        backend,
        server_config,
        edit,
        tenancy("[auth]\nmode = \"none\""),
    )
}

/// The app over `backend` with these tenancy services.
pub(crate) fn app_with_tenancy(
    backend: FakeBackend,
    server_config: ServerConfig,
    edit: impl FnOnce(&mut ModelConfig),
    tenancy: Arc<Tenancy>,
) -> Router {
    let mut model = ModelConfig {
        name: "fake".into(),
        version: None,
        aliases: vec!["fake-alias".into()],
        engine: "fake".into(),
        engine_model: "fake-engine-model".into(),
        folder: folder(),
        owned_by: None,
        deprecation_date: None,
        context_length: None,
        max_output_tokens: 128,
        tool_call_parser: None,
        reasoning: None,
        structured_output: Default::default(),
        standby: Vec::new(),
        canary: None,
    };
    edit(&mut model);
    let backend: Arc<dyn Backend> = Arc::new(backend);
    let registry =
        engine_host::load_with(vec![("fake".into(), backend)], Some(&[model]), &defaults())
            .unwrap();
    router(AppState::new(
        Arc::new(registry),
        Arc::new(server_config),
        Arc::new(defaults()),
        tenancy,
    ))
}

/// The app over `script` with default test settings.
pub(crate) fn app(script: Script) -> (Arc<Seen>, Router) {
    let (seen, backend) = fake(script);
    (seen, app_with(backend, server(10_000, 10_000)))
}

/// A response: status, headers, body text.
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The JSON payloads of an SSE body (`[DONE]` excluded) and whether it ended with `[DONE]`;
    /// each event's `id:` is checked to be its place in the stream.
    pub(crate) fn events(&self) -> (Vec<Value>, bool) {
        let mut events = Vec::new();
        let mut done = false;
        let mut next_id = 0;
        for frame in self.body.split("\n\n").filter(|f| !f.is_empty()) {
            if frame.starts_with(':') {
                continue;
            }
            let id = frame.lines().find_map(|l| l.strip_prefix("id: "));
            assert_eq!(
                id,
                Some(next_id.to_string().as_str()),
                "event {next_id}: {frame}"
            );
            next_id += 1;
            let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
            } else {
                events.push(
                    serde_json::from_str(data)
                        .unwrap_or_else(|e| panic!("bad event ({e}): {data}")),
                );
            }
        }
        (events, done)
    }
}

/// Sends `body` to `path` and reads the whole response.
pub(crate) async fn post(app: &Router, path: &str, body: &str) -> Reply {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send(app, request).await
}

/// Sends a request and reads the whole response.
pub(crate) async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// `GET path`.
pub(crate) async fn get(app: &Router, path: &str) -> Reply {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}

/// Asserts an OpenAI error body with all four keys, returning it.
pub(crate) fn error_of(reply: &Reply, status: u16) -> Value {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.body);
    let body = reply.json();
    let error = body["error"].clone();
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "no `{key}` in {error}");
    }
    error
}
