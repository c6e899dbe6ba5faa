//! `/admin/v1/...`: the admin API's handlers. Each authenticates an administrator (a key with
//! the `admin` endpoint, or a token with the `admin` scope; over a verified client certificate
//! when `admin.client_certificate = "required"`), translates the call into one
//! [`crate::admin::Change`] or read, and renders the result. Every change answers with the new
//! revision (also as `ETag`), and takes `If-Match: <revision>` to refuse a stale edit (412).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::extract::JsonBody;
use crate::admin::audit::AuditQuery;
use crate::admin::{Actor, Admin, AdminError, Applied, Change, KeySpec};
use crate::error::ApiError;
use crate::listener::ClientCertificate;
use crate::tenancy::settings::RawLimits;

/// Who an admin call comes from, once checked.
#[derive(Debug, Clone)]
pub(super) struct AdminCaller(Actor);

fn service(state: &AppState) -> Result<&Arc<Admin>, ApiError> {
    state.admin.as_ref().ok_or_else(|| ApiError::UnknownUrl {
        method: String::new(),
        path: "/admin/v1".into(),
    })
}

/// Lets administrators through, and only them.
pub(super) async fn authorize(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let checked = (|| {
        let admin = service(&state)?;
        let now = crate::clock::unix_now() as i64;
        let principal = state.tenancy.auth.authenticate(request.headers(), now)?;
        if !principal.is_admin() {
            return Err(AdminError::Forbidden {
                code: "admin_scope_required",
                message: "This credential may not call the admin API: use a key whose endpoints include `admin`, or a token with the `admin` scope.".into(),
            }
            .into());
        }
        let certificate = request
            .extensions()
            .get::<ClientCertificate>()
            .map(|c| c.fingerprint.clone());
        if admin.settings().client_certificate_required && certificate.is_none() {
            return Err(ApiError::from(AdminError::Forbidden {
                code: "client_certificate_required",
                message: "The admin API takes calls only over TLS with a client certificate this server verifies.".into(),
            }));
        }
        let who = principal.key_id.as_deref().unwrap_or("-");
        Ok::<_, ApiError>(AdminCaller(Actor {
            name: format!("{}/{who}", principal.tenant.name),
            certificate,
        }))
    })();
    match checked {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .map(|v| v.trim().trim_matches('"'))
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or_else(|| ApiError::InvalidHeader {
            header: "If-Match",
            message: "If-Match takes a revision number, as the ETag of an admin answer gives it"
                .into(),
        })
}

fn tagged(status: StatusCode, revision: u64, body: Value) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Ok(tag) = HeaderValue::from_str(&format!("\"{revision}\"")) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    response
}

async fn apply(
    state: &AppState,
    caller: &AdminCaller,
    headers: &HeaderMap,
    change: Change,
) -> Result<Response, ApiError> {
    let admin = service(state)?;
    let (revision, applied) = admin.change(&caller.0, &change, if_match(headers)?).await?;
    let target = change.target();
    Ok(match applied {
        Applied::State => tagged(
            StatusCode::OK,
            revision,
            json!({"revision": revision, "action": change.action(), "target": target}),
        ),
        Applied::Key(key, record) => {
            let mut body = json!({"revision": revision, "key": key, "record": record});
            if let Change::RotateKey(old, _) = &change {
                body["replaces"] = json!(old);
            }
            tagged(StatusCode::CREATED, revision, body)
        }
    })
}

type Caller = axum::Extension<AdminCaller>;

/// `GET /admin/v1/state`: the whole admin state and its revision.
pub(super) async fn read_state(State(state): State<AppState>) -> Result<Response, ApiError> {
    let snapshot = service(&state)?.snapshot();
    let body = json!({"revision": snapshot.revision, "state": snapshot.doc});
    Ok(tagged(StatusCode::OK, snapshot.revision, body))
}

/// `GET /admin/v1/tenants`: every tenant, where it is defined, and its limits.
pub(super) async fn list_tenants(State(state): State<AppState>) -> Result<Response, ApiError> {
    let snapshot = service(&state)?.snapshot();
    let directory = state.tenancy.auth.directory();
    let mut names: Vec<&String> = directory.tenants.keys().collect();
    names.sort();
    let data: Vec<Value> = names
        .into_iter()
        .map(|name| match snapshot.doc.directory.tenants.get(name) {
            Some(limits) => json!({"name": name, "source": "admin", "limits": limits}),
            None => json!({"name": name, "source": "configuration"}),
        })
        .collect();
    Ok(tagged(
        StatusCode::OK,
        snapshot.revision,
        json!({"data": data}),
    ))
}

/// `GET /admin/v1/plans`: the plans the admin API made.
pub(super) async fn list_plans(State(state): State<AppState>) -> Result<Response, ApiError> {
    let snapshot = service(&state)?.snapshot();
    let body = json!({"data": snapshot.doc.directory.plans});
    Ok(tagged(StatusCode::OK, snapshot.revision, body))
}

/// `PUT /admin/v1/tenants/{name}` and (`PLAN`) `PUT /admin/v1/plans/{name}`.
pub(super) async fn put_limits<const PLAN: bool>(
    State(state): State<AppState>,
    axum::Extension(caller): Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
    JsonBody(limits): JsonBody<RawLimits>,
) -> Result<Response, ApiError> {
    let change = if PLAN {
        Change::PutPlan(name, limits)
    } else {
        Change::PutTenant(name, limits)
    };
    apply(&state, &caller, &headers, change).await
}

/// `DELETE /admin/v1/tenants/{name}` and (`PLAN`) `DELETE /admin/v1/plans/{name}`.
pub(super) async fn delete_limits<const PLAN: bool>(
    State(state): State<AppState>,
    axum::Extension(caller): Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let change = if PLAN {
        Change::DeletePlan(name)
    } else {
        Change::DeleteTenant(name)
    };
    apply(&state, &caller, &headers, change).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyFilter {
    tenant: Option<String>,
}

/// `GET /admin/v1/keys`: every key without its secret or hash.
pub(super) async fn list_keys(
    State(state): State<AppState>,
    filter: Result<Query<KeyFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(filter) = filter.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let snapshot = service(&state)?.snapshot();
    let directory = state.tenancy.auth.directory();
    let mut keys: Vec<_> = directory
        .keys
        .values()
        .filter(|k| filter.tenant.as_ref().is_none_or(|t| *t == k.tenant))
        .collect();
    keys.sort_by(|a, b| a.id.cmp(&b.id));
    let data: Vec<Value> = keys
        .into_iter()
        .map(|k| {
            let managed = snapshot.doc.directory.keys.iter().find(|m| m.id == k.id);
            json!({
                "id": k.id,
                "tenant": k.tenant,
                "source": if managed.is_some() { "admin" } else { "configuration" },
                "created": managed.and_then(|m| m.created.clone()),
                "expires": k.expires_at.map(crate::tenancy::keys_file::format_time),
                "revoked": k.revoked,
                "admin": k.scopes.admin,
                "models": managed.and_then(|m| m.models.clone()),
                "endpoints": managed.and_then(|m| m.endpoints.clone()),
            })
        })
        .collect();
    Ok(tagged(
        StatusCode::OK,
        snapshot.revision,
        json!({"data": data}),
    ))
}

/// `POST /admin/v1/keys`: a new key, shown once.
pub(super) async fn create_key(
    State(state): State<AppState>,
    axum::Extension(caller): Caller,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<KeySpec>,
) -> Result<Response, ApiError> {
    apply(&state, &caller, &headers, Change::CreateKey(spec)).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Rotation {
    /// How long the old key keeps working (a day by default).
    grace_seconds: Option<u64>,
}

/// `POST /admin/v1/keys/{id}/rotate` and `POST /admin/v1/keys/{id}/revoke`.
pub(super) async fn key_action(
    State(state): State<AppState>,
    axum::Extension(caller): Caller,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let change = match action.as_str() {
        "rotate" => {
            let rotation: Rotation = if body.is_empty() {
                Rotation::default()
            } else {
                super::extract::parse(&body)?
            };
            Change::RotateKey(
                id,
                Duration::from_secs(rotation.grace_seconds.unwrap_or(86_400)),
            )
        }
        "revoke" => Change::RevokeKey(id),
        other => {
            return Err(ApiError::UnknownUrl {
                method: "POST".into(),
                path: format!("/admin/v1/keys/{id}/{other}"),
            });
        }
    };
    apply(&state, &caller, &headers, change).await
}

/// `GET /admin/v1/models`: every public id, the aliases and shutdown dates the API set.
pub(super) async fn list_models(State(state): State<AppState>) -> Result<Response, ApiError> {
    let snapshot = service(&state)?.snapshot();
    let models: Vec<Value> = state
        .registry
        .entries()
        .into_iter()
        .map(|m| json!({"id": m.id, "serves": m.model.id, "shutdown_date": m.shutdown_date}))
        .collect();
    let body = json!({"data": models, "map": snapshot.doc.models});
    Ok(tagged(StatusCode::OK, snapshot.revision, body))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MapValue {
    model: Option<String>,
    date: Option<String>,
    prices: Option<Vec<crate::spend::settings::RawModelPrice>>,
}

/// `PUT /admin/v1/models/{aliases|shutdown_dates|prices}/{id}`.
pub(super) async fn put_map(
    State(state): State<AppState>,
    axum::Extension(caller): Caller,
    headers: HeaderMap,
    Path((kind, id)): Path<(String, String)>,
    JsonBody(value): JsonBody<MapValue>,
) -> Result<Response, ApiError> {
    let change = match (kind.as_str(), value) {
        (
            "aliases",
            MapValue {
                model: Some(model),
                date: None,
                prices: None,
            },
        ) => Change::PutAlias(id, model),
        (
            "shutdown_dates",
            MapValue {
                model: None,
                date: Some(date),
                prices: None,
            },
        ) => Change::PutShutdownDate(id, date),
        (
            "prices",
            MapValue {
                model: None,
                date: None,
                prices: Some(prices),
            },
        ) => Change::PutPrices(id, prices),
        ("aliases", _) => return Err(ApiError::MissingParam("model".into())),
        ("shutdown_dates", _) => return Err(ApiError::MissingParam("date".into())),
        ("prices", _) => return Err(ApiError::MissingParam("prices".into())),
        _ => return Err(unknown_map(&kind)),
    };
    apply(&state, &caller, &headers, change).await
}

/// `DELETE /admin/v1/models/{aliases|shutdown_dates|prices}/{id}`.
pub(super) async fn delete_map(
    State(state): State<AppState>,
    axum::Extension(caller): Caller,
    headers: HeaderMap,
    Path((kind, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let change = match kind.as_str() {
        "aliases" => Change::DeleteAlias(id),
        "shutdown_dates" => Change::DeleteShutdownDate(id),
        "prices" => Change::DeletePrices(id),
        _ => return Err(unknown_map(&kind)),
    };
    apply(&state, &caller, &headers, change).await
}

fn unknown_map(kind: &str) -> ApiError {
    ApiError::UnknownUrl {
        method: String::new(),
        path: format!("/admin/v1/models/{kind}"),
    }
}

/// `GET /admin/v1/audit`: the audit entries a query names, oldest first.
pub(super) async fn audit(
    State(state): State<AppState>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let read = service(&state)?.audit(&query).await?;
    Ok(Json(json!({
        "data": read.entries,
        "chain_intact": read.breaks.is_empty(),
        "chain_breaks": read.breaks,
        "revision": read.revision,
    }))
    .into_response())
}
