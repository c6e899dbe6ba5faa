//! Usage reports: `GET /admin/v1/usage` (an administrator: every tenant) and `GET /v1/usage`
//! (a key scoped to `usage`: its own tenant's). Both take `from`, `to` (`YYYY-MM-DD`, UTC;
//! default today), `tenant`, `key`, `model`, `group_by` (a comma list of `day`, `tenant`,
//! `key`, `model`) and `format` (`json` or `csv`), and read the daily sums every replica
//! shares through the state store.

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use crate::error::ApiError;
use crate::spend::report::{RawUsageQuery, csv, report};
use crate::tenancy::Caller;

/// Handles `GET /admin/v1/usage`.
pub(super) async fn admin_usage(
    State(state): State<AppState>,
    query: Result<Query<RawUsageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    render(&state, query, None).await
}

/// Handles `GET /v1/usage`: the caller's own tenant only.
pub(super) async fn tenant_usage(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<RawUsageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.principal.tenant.name.clone();
    render(&state, query, Some(tenant)).await
}

async fn render(
    state: &AppState,
    query: Result<Query<RawUsageQuery>, QueryRejection>,
    tenant: Option<String>,
) -> Result<Response, ApiError> {
    let Query(raw) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let as_csv = raw.format.as_deref() == Some("csv");
    let today = time::OffsetDateTime::now_utc().date();
    let mut query = raw
        .validate(today)
        .map_err(|(param, message)| ApiError::invalid(param, message))?;
    if let Some(own) = tenant {
        if query.tenant.as_ref().is_some_and(|asked| *asked != own) {
            return Err(ApiError::Forbidden {
                param: Some("tenant".into()),
                code: "tenant_not_allowed",
                message: "A usage key reads its own tenant's usage only.".into(),
            });
        }
        query.tenant = Some(own);
    }
    let rows = report(state.tenancy.store().as_ref(), &query)
        .await
        .map_err(|e| ApiError::StateUnavailable {
            detail: e.to_string(),
            retry_after: state.server.retry_after,
        })?;
    if as_csv {
        let body = csv(&rows, &query.group_by);
        return Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response());
    }
    let day = |d: time::Date| format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day());
    Ok(Json(json!({
        "object": "list",
        "from": day(query.from),
        "to": day(query.to),
        "currency": state.tenancy.spend().currency,
        "data": rows,
    }))
    .into_response())
}
