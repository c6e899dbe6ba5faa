//! HTTP routes: one thin handler per endpoint, and the router that joins them. A handler
//! extracts the caller and the body, calls its protocol ([`crate::protocols`]) and frames the
//! [`crate::protocols::Reply`] ([`sse`]); WebSocket turns frame the same replies as messages
//! ([`websocket`]).

mod admin;
mod admission;
mod anthropic;
mod batches;
mod chat;
mod chat_ws;
mod completions;
mod cors;
mod embeddings;
mod extract;
mod files;
mod generate;
mod health;
mod metrics;
mod models;
mod responses;
mod responses_ws;
pub mod settings;
mod sse;
mod trace;
mod turn;
mod usage;
mod websocket;
pub mod websocket_slots;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

use crate::engine_host::Defaults;
use crate::engine_host::{ModelRegistry, ServedModel};
use crate::error::ApiError;
use crate::generation::{Generator, Timing};
use crate::observability::metrics as record;
use crate::protocols::responses::{ResponseStore, Responses};
use crate::protocols::{Call, StreamSettings};
use crate::tenancy::{Caller, Tenancy};
pub use settings::{CorsOrigins, ServerConfig};

/// What every handler can reach: one shared [`Shared`], so the clone each handler and
/// middleware takes per request is one reference count, not one per part.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Debug, Clone)]
pub struct Shared {
    /// Served models and their engines.
    pub registry: Arc<ModelRegistry>,
    /// Server limits and timings.
    pub server: Arc<ServerConfig>,
    /// The facade every generation goes through.
    pub generator: Generator,
    /// Authentication, limits, queues and idempotency.
    pub tenancy: Arc<Tenancy>,
    /// Stored responses (kept in the tenancy's state store) and background runs.
    pub responses: Responses,
    /// Open WebSocket connections, in all and per tenant.
    pub websockets: Arc<websocket_slots::WebSocketSlots>,
    /// The admin API, when `[admin]` enables it.
    pub admin: Option<Arc<crate::admin::Admin>>,
    /// Files and batches (off until [`AppState::with_batches`] names a directory).
    pub batches: Arc<crate::batches::Batches>,
}

impl AppState {
    /// The state of a server: stored responses live in the tenancy's state store.
    pub fn new(
        registry: Arc<ModelRegistry>,
        server: Arc<ServerConfig>,
        defaults: Arc<Defaults>,
        tenancy: Arc<Tenancy>,
    ) -> Self {
        let responses = Responses {
            store: ResponseStore::new(Arc::clone(tenancy.limiter.store()), server.retry_after),
            running: Arc::default(),
        };
        let websockets = websocket_slots::WebSocketSlots::new(
            server.websocket_max_connections,
            server.websocket_max_per_tenant,
        );
        let timing = Timing {
            request_timeout: server.request_timeout,
            retry_after: server.retry_after,
        };
        let generator = Generator::new(
            Arc::clone(&registry),
            defaults,
            Arc::clone(&tenancy),
            timing,
        );
        let batches = Arc::new(batches(
            crate::files::Files::off(Arc::clone(tenancy.limiter.store()), server.retry_after),
            Default::default(),
            &generator,
            &tenancy,
            &responses,
            stream_settings(&server),
        ));
        Self(Arc::new(Shared {
            websockets,
            registry,
            server,
            generator,
            tenancy,
            responses,
            admin: None,
            batches,
        }))
    }

    /// The same state with `change` made to its parts (while a server is set up).
    fn changed(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.0);
        change(&mut shared);
        Self(Arc::new(shared))
    }

    /// The same state, keeping files as `files` says and running batches as `settings` say
    /// (after the plugins: batch lines pass the same guards).
    pub fn with_batches(
        self,
        files: crate::files::FilesSettings,
        settings: crate::batches::BatchSettings,
    ) -> Result<Self, String> {
        let store = Arc::clone(self.tenancy.limiter.store());
        let files = crate::files::Files::new(files, store, self.server.retry_after)?;
        let batches = Arc::new(batches(
            files,
            settings,
            &self.generator,
            &self.tenancy,
            &self.responses,
            self.streams(),
        ));
        Ok(self.changed(|s| s.batches = batches))
    }

    /// The same state, running gateway plugins.
    pub fn with_plugins(self, plugins: Arc<crate::plugins::PluginHost>) -> Self {
        let generator = self.generator.clone().with_plugins(plugins);
        self.changed(|s| s.generator = generator)
    }

    /// The same state, serving the admin API.
    pub fn with_admin(self, admin: Arc<crate::admin::Admin>) -> Self {
        self.changed(|s| s.admin = Some(admin))
    }

    /// How streamed answers are timed.
    pub fn streams(&self) -> StreamSettings {
        stream_settings(&self.server)
    }

    /// A protocol call by `caller`, for a request that arrived at `started`.
    pub fn call<'a>(&'a self, caller: &'a Caller, started: Instant) -> Call<'a> {
        Call {
            generator: &self.generator,
            caller,
            started,
            streams: self.streams(),
        }
    }

    /// The model a request names, or 404.
    pub fn model(&self, id: &str) -> Result<Arc<ServedModel>, ApiError> {
        self.registry
            .resolve(id)
            .ok_or_else(|| ApiError::ModelNotFound(id.to_string()))
    }
}

fn stream_settings(server: &ServerConfig) -> StreamSettings {
    StreamSettings {
        heartbeat: server.stream_heartbeat,
        request_timeout: server.request_timeout,
    }
}

fn batches(
    files: crate::files::Files,
    settings: crate::batches::BatchSettings,
    generator: &Generator,
    tenancy: &Arc<Tenancy>,
    responses: &Responses,
    streams: StreamSettings,
) -> crate::batches::Batches {
    let engines = crate::batches::Engines {
        generator: generator.clone(),
        tenancy: Arc::clone(tenancy),
        responses: responses.clone(),
        streams,
    };
    crate::batches::Batches::new(files, settings, engines)
}

/// The application's router.
pub fn router(state: AppState) -> Router {
    record::handle(); // the metrics recorder, installed once per process
    let cors = cors::layer(&state.server.cors);
    // A multipart form around the largest file.
    let upload_limit = usize::try_from(state.batches.files().max_bytes())
        .unwrap_or(usize::MAX)
        .saturating_add(64 << 10);
    let api = Router::new()
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*model}", get(models::retrieve))
        .route(
            "/v1/chat/completions",
            post(chat::chat).get(chat_ws::connect),
        )
        .route("/v1/completions", post(completions::completions))
        .route("/generate", post(generate::generate))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route(
            "/v1/responses",
            post(responses::create).get(responses_ws::connect),
        )
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/responses/compact", post(responses::compact))
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/usage", get(usage::tenant_usage))
        .route(
            "/v1/files",
            post(files::upload)
                .get(files::list)
                .layer(axum::extract::DefaultBodyLimit::max(upload_limit)),
        )
        .route("/v1/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batches", post(batches::create).get(batches::list))
        .route("/v1/batches/{id}", get(batches::retrieve))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admission::admission,
        ));
    // Anthropic's Messages API: the same admission, every error in Anthropic's shape.
    let messages = Router::new()
        .route("/v1/messages", post(anthropic::create))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admission::admission,
        ))
        .route_layer(middleware::from_fn(anthropic::error_shape));
    let mut router = Router::new().merge(api).merge(messages);
    if state.admin.is_some() {
        router = router.nest("/admin/v1", admin_router(&state));
    }
    let router = router
        .route("/health", get(health::health))
        .route("/model_info", get(generate::model_info))
        .route("/get_model_info", get(generate::model_info))
        .route("/server_info", get(generate::server_info))
        .route("/get_server_info", get(generate::server_info))
        .route("/ready", get(health::ready))
        .route("/metrics", get(metrics::metrics))
        .fallback(unknown_url)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), body_deadline))
        .layer(middleware::from_fn(count_requests))
        .layer(middleware::from_fn(trace::trace_request))
        .with_state(state);
    match cors {
        // Outermost, so preflights are answered before routing and every response is marked.
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// `/admin/v1`: the admin API, behind its own authorization.
fn admin_router(state: &AppState) -> Router<AppState> {
    use axum::routing::put;
    Router::new()
        .route("/state", get(admin::read_state))
        .route("/tenants", get(admin::list_tenants))
        .route(
            "/tenants/{name}",
            put(admin::put_limits::<false>).delete(admin::delete_limits::<false>),
        )
        .route("/plans", get(admin::list_plans))
        .route(
            "/plans/{name}",
            put(admin::put_limits::<true>).delete(admin::delete_limits::<true>),
        )
        .route("/keys", get(admin::list_keys).post(admin::create_key))
        .route("/keys/{id}/{action}", post(admin::key_action))
        .route("/models", get(admin::list_models))
        .route(
            "/models/{kind}/{*id}",
            put(admin::put_map).delete(admin::delete_map),
        )
        .route("/audit", get(admin::audit))
        .route("/usage", get(usage::admin_usage))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admin::authorize,
        ))
}

/// The health listener's router: `/health` and `/ready` only, without authentication (see
/// `server.health_listen`).
pub fn health_router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .fallback(unknown_url)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(count_requests))
        .with_state(state)
}

async fn count_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    // The matched route is shared (a reference count), not copied.
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = next.run(request).await;
    let endpoint = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    record::http_request(endpoint, response.status().as_u16(), started.elapsed());
    response
}

/// Gives a request's body its deadline (`server.body_read_timeout`), counted from when its
/// headers arrived, and closes the connection after a response given before the body was read
/// to its end; a request without a body is left alone.
async fn body_deadline(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    use axum::body::HttpBody;
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let timeout = state.server.body_read_timeout;
    let (parts, body) = request.into_parts();
    let (body, ended) = crate::body::with_deadline(body, timeout);
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if !ended.ended() {
        // A refusal before the whole body arrived: the rest of it would be read as the next
        // request, so the connection closes, and says so, so a client does not reuse it.
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

async fn unknown_url(method: Method, uri: Uri) -> ApiError {
    ApiError::UnknownUrl {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

/// `response` with an `x-request-id` header (the response id, for matching logs).
pub fn with_request_id(mut response: Response, id: &str) -> Response {
    if let Ok(value) = axum::http::HeaderValue::from_str(id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}
