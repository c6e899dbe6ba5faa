//! CORS for browser clients, from `server.cors_allowed_origins`.
//!
//! The OpenAI SDKs send `Authorization` and their own `X-Stainless-*` headers; a wildcard
//! `Access-Control-Allow-Headers` does not cover `Authorization`, so preflights are answered
//! with the headers the browser asked for. Headers clients read from a response are exposed.
//!
//! Browsers do not apply CORS to WebSockets, so an upgrade that carries an `Origin` is checked
//! here against the same allow-list ([`check_websocket_origin`]).

use std::time::Duration;

use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use super::settings::CorsOrigins;
use crate::error::ApiError;

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

/// An upgrade from a browser page (it sends `Origin`) is allowed only from an origin the CORS
/// allow-list names, or from the gateway's own host (a page it serves, or a client library that
/// sends `Origin` for the host it connects to); clients that send no `Origin` are not affected.
pub(super) fn check_websocket_origin(
    headers: &HeaderMap,
    allowed: &CorsOrigins,
) -> Result<(), ApiError> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(HOST).map(|h| h.as_bytes());
    let authority = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, authority)| authority.as_bytes());
    let same_host = matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h));
    let permitted = same_host
        || match allowed {
            CorsOrigins::Any => true,
            CorsOrigins::None => false,
            CorsOrigins::List(list) => list.iter().any(|o| o.as_bytes() == origin.as_bytes()),
        };
    if permitted {
        return Ok(());
    }
    Err(ApiError::Forbidden {
        param: None,
        code: "origin_not_allowed",
        message: format!(
            "WebSocket connections from the origin `{}` are not allowed (server.cors_allowed_origins).",
            String::from_utf8_lossy(origin.as_bytes())
        ),
    })
}
