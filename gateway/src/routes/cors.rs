//! CORS for browser clients, from `server.cors_allowed_origins`.
//!
//! The OpenAI SDKs send `Authorization` and their own `X-Stainless-*` headers; a wildcard
//! `Access-Control-Allow-Headers` does not cover `Authorization`, so preflights are answered
//! with the headers the browser asked for. Headers clients read from a response are exposed.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::config::CorsOrigins;

/// Response headers a browser client may read.
const EXPOSED: [&str; 4] = [
    "x-request-id",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
];

/// The layer for `origins`, or none when CORS is off.
pub(super) fn layer(origins: &CorsOrigins) -> Option<CorsLayer> {
    let allow = match origins {
        CorsOrigins::None => return None,
        CorsOrigins::Any => AllowOrigin::any(),
        // Validated as plain ASCII origins when the configuration was read.
        CorsOrigins::List(list) => AllowOrigin::list(
            list.iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect::<Vec<_>>(),
        ),
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers(EXPOSED.map(HeaderName::from_static))
            .max_age(Duration::from_secs(600)),
    )
}
