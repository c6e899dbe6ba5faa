//! `/v1/files`: upload (multipart), list, retrieve, content and delete, for the Batch API.

use std::collections::HashMap;

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt;
use serde_json::json;

use super::AppState;
use super::batches::LIST_MOST;
use crate::error::ApiError;
use crate::protocols::paging;
use crate::tenancy::Caller;

fn tenant(caller: &Caller) -> &str {
    &caller.principal.tenant.name
}

fn multipart_error(status: StatusCode, limit: u64, message: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        }
    } else {
        ApiError::invalid(
            "file",
            format!("The upload is not a readable multipart form: {message}"),
        )
    }
}

/// `POST /v1/files`: a multipart form with `file` and `purpose`.
pub(super) async fn upload(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let files = state.batches.files();
    files.enabled_or_err()?;
    let limit = files.max_bytes();
    let mut form = form.map_err(|e| multipart_error(e.status(), limit, e.body_text()))?;
    let mut file: Option<(String, Bytes)> = None;
    let mut purpose: Option<String> = None;
    loop {
        let field = form
            .next_field()
            .await
            .map_err(|e| multipart_error(e.status(), limit, e.body_text()))?;
        let Some(field) = field else { break };
        let name = field.name().unwrap_or("").to_string();
        let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
        let bytes = field
            .bytes()
            .await
            .map_err(|e| multipart_error(e.status(), limit, e.body_text()))?;
        match name.as_str() {
            "file" => file = Some((filename, bytes)),
            "purpose" => purpose = Some(String::from_utf8_lossy(&bytes).trim().to_string()),
            // Fields OpenAI's form may carry that change nothing here.
            "expires_after[anchor]" | "expires_after[seconds]" => {}
            other => {
                return Err(ApiError::invalid(
                    other,
                    format!("Unknown form field {other:?}; send `file` and `purpose`."),
                ));
            }
        }
    }
    let (filename, bytes) = file.ok_or_else(|| ApiError::MissingParam("file".into()))?;
    let purpose = purpose.ok_or_else(|| ApiError::MissingParam("purpose".into()))?;
    let meta = files
        .upload(tenant(&caller), &filename, &purpose, bytes)
        .await?;
    Ok(Json(meta.wire()).into_response())
}

/// `GET /v1/files`.
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let limit = paging::limit(&query, LIST_MOST, LIST_MOST)?;
    let ascending = paging::ascending(&query)?;
    let (metas, has_more) = state
        .batches
        .files()
        .list(
            tenant(&caller),
            query.get("purpose").map(String::as_str),
            query.get("after").map(String::as_str),
            limit,
            ascending,
        )
        .await?;
    let data: Vec<_> = metas.iter().map(|m| m.wire()).collect();
    Ok(Json(json!({
        "object": "list",
        "first_id": metas.first().map(|m| m.id.clone()),
        "last_id": metas.last().map(|m| m.id.clone()),
        "has_more": has_more,
        "data": data,
    }))
    .into_response())
}

/// `GET /v1/files/{id}`.
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let meta = state.batches.files().meta(tenant(&caller), &id).await?;
    Ok(Json(meta.wire()).into_response())
}

/// `GET /v1/files/{id}/content`: the bytes, streamed.
pub(super) async fn content(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let stream = state.batches.files().content(tenant(&caller), &id).await?;
    let body = Body::from_stream(stream.map_err(std::io::Error::other));
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

/// `DELETE /v1/files/{id}`.
pub(super) async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.batches.files().delete(tenant(&caller), &id).await?;
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})).into_response())
}
