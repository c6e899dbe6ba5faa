//! The middleware every `/v1` request passes: authentication, the endpoint scope, a JSON body
//! (415 otherwise), the tenant's request rate, and, for POSTs with an `Idempotency-Key`,
//! replay, join or conflict. Every response leaves with the `x-ratelimit-*` headers of the
//! limits it met.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::AppState;
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::tenancy::limits::LimitReport;
use crate::tenancy::{Caller, Endpoint, ratelimit_headers};

/// Admits a `/v1` request and marks its response.
pub(super) async fn admission(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let tenancy = &state.tenancy;
    let now = i64::try_from(unix_now()).unwrap_or(i64::MAX);
    let auth_span = tracing::info_span!(target: crate::observability::traces::TARGET, "auth");
    let authenticated = auth_span.in_scope(|| tenancy.auth.authenticate(request.headers(), now));
    drop(auth_span);
    let principal = match authenticated {
        Ok(p) => p,
        Err(e) => return refuse(request, e, &LimitReport::default(), &state).await,
    };
    if let Some(endpoint) = Endpoint::of_path(request.uri().path())
        && !principal.may_call(endpoint)
    {
        let e = ApiError::Forbidden {
            param: None,
            code: "endpoint_not_allowed",
            message: format!("This key may not call the `{}` endpoint.", endpoint.name()),
        };
        return refuse(request, e, &LimitReport::default(), &state).await;
    }
    if let Err(e) = json_body(&request) {
        return refuse(request, e, &LimitReport::default(), &state).await;
    }
    let caller =
        Caller::new(Arc::new(principal)).correlated(super::trace::correlation_id(&request));
    let mut report = LimitReport::default();
    let limits_span = tracing::info_span!(target: crate::observability::traces::TARGET, "limits");
    let limited = tenancy
        .limiter
        .hit(&caller.principal, &mut report)
        .instrument(limits_span)
        .await;
    if let Err(e) = limited {
        return refuse(request, e, &report, &state).await;
    }
    caller.report(|r| r.requests = report.requests);
    request.extensions_mut().insert(caller.clone());
    let mut response = match (&tenancy.idempotency, request.method() == Method::POST) {
        (Some(idempotency), true) => {
            let tenant = caller.principal.tenant.name.clone();
            let deadline = started + state.server.request_timeout;
            let body_limit = if request.uri().path() == "/v1/files" {
                usize::try_from(state.batches.files().max_bytes()).unwrap_or(usize::MAX)
                    + (64 << 10)
            } else {
                state.server.max_body_bytes
            };
            idempotency
                .run(&tenant, request, next, body_limit, deadline)
                .await
        }
        // Nothing is kept to resume from: a resume would run the request again.
        (None, true) if request.headers().contains_key("last-event-id") => {
            resume_off().into_response()
        }
        _ => next.run(request).await,
    };
    ratelimit_headers::apply(response.headers_mut(), &caller.snapshot());
    response
}

/// Answered to a resume (`Last-Event-ID`, a turn's `resume_after`) where idempotency is off.
pub(super) fn resume_off() -> ApiError {
    ApiError::unsupported(
        "Last-Event-ID",
        "Resuming a stream needs idempotency, which is off on this gateway ([idempotency] enabled = false).",
    )
}

/// Every `/v1` POST that carries a body carries JSON. Without this a web page on any origin could
/// make a browser send a "simple" cross-origin request (`text/plain`, a form) with no preflight,
/// and spend the gateway's compute where authentication is off.
fn json_body(request: &Request) -> Result<(), ApiError> {
    use axum::body::HttpBody;
    if request.method() != Method::POST || request.body().is_end_stream() {
        return Ok(());
    }
    // An upload is a multipart form (a browser's simple request may send one, but a file
    // upload only stores bytes the same tenant reads back).
    if request.uri().path() == "/v1/files" {
        return Ok(());
    }
    let declared_empty = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() == b"0");
    if declared_empty {
        return Ok(());
    }
    match request.headers().get(axum::http::header::CONTENT_TYPE) {
        Some(v) if v.to_str().is_ok_and(crate::body::is_json) => Ok(()),
        Some(v) => Err(ApiError::UnsupportedMediaType(format!(
            "`{}`",
            String::from_utf8_lossy(v.as_bytes())
        ))),
        None => Err(ApiError::UnsupportedMediaType("no Content-Type".into())),
    }
}

/// Refuses a request before its handler ran. The body is read first (within the size limit and
/// briefly): answering while a client is still sending makes the server drop the connection,
/// and a client that wrote its body separately would see a broken connection, not the error.
async fn refuse(
    request: Request,
    error: ApiError,
    report: &LimitReport,
    state: &AppState,
) -> Response {
    let limit = state.server.max_body_bytes;
    // A body too large or too slow to wait for stays unread: the body deadline layer, which
    // sees that, closes the connection and says so.
    let _ =
        tokio::time::timeout(DRAIN_TIME, axum::body::to_bytes(request.into_body(), limit)).await;
    let mut response = error.into_response();
    ratelimit_headers::apply(response.headers_mut(), report);
    response
}

/// Longest a refused request's body is waited for.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);
