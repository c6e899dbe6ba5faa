//! HTTP routes: one thin handler file per endpoint, and the router that joins them.

pub mod error;
pub mod health;
pub mod models;

use std::sync::Arc;

use axum::Router;
use axum::http::{Method, Uri};
use axum::routing::get;

use crate::engine_host::ModelRegistry;
use error::ApiError;

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Served models and their engines.
    pub registry: Arc<ModelRegistry>,
}

/// The application's router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{model}", get(models::retrieve))
        .fallback(unknown_url)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
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
