//! The middleware every `/v1` request passes: authentication, the endpoint scope, the tenant's
//! request rate, and, for POSTs with an `Idempotency-Key`, replay, join or conflict. Every
//! response leaves with the `x-ratelimit-*` headers of the limits it met.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AppState, unix_now};
use crate::error::ApiError;
use crate::tenancy::limits::LimitReport;
use crate::tenancy::{Caller, Endpoint, ratelimit_headers};

/// Admits a `/v1` request and marks its response.
pub async fn admission(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let tenancy = &state.tenancy;
    let now = i64::try_from(unix_now()).unwrap_or(i64::MAX);
    let principal = match tenancy.auth.authenticate(request.headers(), now) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if let Some(endpoint) = Endpoint::of_path(request.uri().path())
        && !principal.may_call(endpoint)
    {
        return ApiError::Forbidden {
            param: None,
            code: "endpoint_not_allowed",
            message: format!("This key may not call the `{}` endpoint.", endpoint.name()),
        }
        .into_response();
    }
    let caller = Caller::new(Arc::new(principal));
    let mut report = LimitReport::default();
    if let Err(e) = tenancy.limiter.hit(&caller.principal, &mut report).await {
        let mut response = e.into_response();
        ratelimit_headers::apply(response.headers_mut(), &report);
        return response;
    }
    caller.report(|r| r.requests = report.requests);
    request.extensions_mut().insert(caller.clone());
    let mut response = match (&tenancy.idempotency, request.method() == Method::POST) {
        (Some(idempotency), true) => {
            let tenant = caller.principal.tenant.name.clone();
            let deadline = started + state.server.request_timeout;
            idempotency
                .run(
                    &tenant,
                    request,
                    next,
                    state.server.max_body_bytes,
                    deadline,
                )
                .await
        }
        _ => next.run(request).await,
    };
    ratelimit_headers::apply(response.headers_mut(), &caller.snapshot());
    response
}
