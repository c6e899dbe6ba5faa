//! One batch line run as its endpoint's request, and its answer as a result-file line.
//!
//! A line goes through the same protocol code as a client's request (the one generation
//! facade, limits, budgets and usage); only the caller differs: the batch's owner, marked as
//! batch work so the engine runs it last and usage counts it as batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::Batches;
use super::record::Owner;
use crate::error::ApiError;
use crate::files::lines::InputLine;
use crate::protocols::{Call, Reply, chat, completions, embeddings, responses};
use crate::tenancy::{Caller, Principal};

/// How a line ended.
#[derive(Debug)]
pub(super) enum Answer {
    /// Its result-file line (`ok`: answered; otherwise it goes to the error file).
    Line { ok: bool, text: Vec<u8> },
    /// A limit or an overloaded engine refused it for now: run it again after this long.
    Later(Duration),
}

/// The caller a batch's lines run as, or why they cannot run (the key was revoked, the
/// tenant removed).
pub(super) fn caller(batches: &Batches, owner: &Owner, batch_id: &str) -> Result<Caller, ApiError> {
    let auth = &batches.tenancy.auth;
    let principal = if !auth.is_required() {
        Principal::local()
    } else {
        let directory = auth.directory();
        let gone = || {
            ApiError::Unauthenticated(
                "The credential that created this batch is no longer valid.".into(),
            )
        };
        let tenant = directory.tenants.get(&owner.tenant).ok_or_else(gone)?;
        let scopes = if owner.is_key {
            let id = owner.key_id.as_deref().ok_or_else(gone)?;
            let key = directory.keys.get(id).ok_or_else(gone)?;
            let now = i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX);
            if key.revoked || key.expires_at.is_some_and(|at| now >= at) {
                return Err(gone());
            }
            key.scopes.clone()
        } else {
            owner.token_scopes()
        };
        Principal {
            tenant: Arc::clone(tenant),
            key_id: owner.key_id.clone(),
            scopes,
        }
    };
    Ok(Caller::new(Arc::new(principal)).in_batch(batch_id))
}

fn parse<T: DeserializeOwned>(body: Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(body)).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid(path, e.into_inner().to_string())
    })
}

/// Runs `line` of an `endpoint` batch as `caller`.
pub(super) async fn run(
    batches: &Batches,
    caller: &Caller,
    endpoint: &str,
    line: InputLine,
) -> Answer {
    let custom_id = line.custom_id.clone();
    match answer(batches, caller, endpoint, line.body).await {
        Ok((request_id, body)) => Answer::Line {
            ok: true,
            text: result_line(&custom_id, 200, request_id.as_deref(), body, None),
        },
        Err(e) => {
            let later = match &e {
                ApiError::RateLimited(r) if !r.never => Some(r.retry_after),
                _ if e.should_retry() == Some(true) => e.retry_after(),
                _ => None,
            };
            if let (Some(wait), false) = (later, matches!(e, ApiError::ShuttingDown { .. })) {
                return Answer::Later(wait.max(Duration::from_millis(50)));
            }
            e.log();
            Answer::Line {
                ok: false,
                text: error_line(&custom_id, &e),
            }
        }
    }
}

/// The error-file line of a line that failed with `e`: its status, its error body and the
/// error's code and message.
pub(super) fn error_line(custom_id: &str, e: &ApiError) -> Vec<u8> {
    let detail = e.detail();
    let error = json!({"code": detail.code, "message": detail.message});
    let body = json!({ "error": detail });
    result_line(custom_id, e.status().as_u16(), None, body, Some(error))
}

/// A result-file line in OpenAI's format.
pub(super) fn result_line(
    custom_id: &str,
    status: u16,
    request_id: Option<&str>,
    body: Value,
    error: Option<Value>,
) -> Vec<u8> {
    let line = json!({
        "id": crate::ids::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": request_id,
            "body": body,
        },
        "error": error,
    });
    serde_json::to_vec(&line).unwrap_or_default()
}

/// A line that never ran (its batch expired first), for the error file.
pub(super) fn expired_line(custom_id: &str) -> Vec<u8> {
    let line = json!({
        "id": crate::ids::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": null,
        "error": {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        },
    });
    serde_json::to_vec(&line).unwrap_or_default()
}

/// The line's answer: its request id and JSON body.
async fn answer(
    batches: &Batches,
    caller: &Caller,
    endpoint: &str,
    mut body: Map<String, Value>,
) -> Result<(Option<String>, Value), ApiError> {
    // A line counts against its tenant's request rate as a request does.
    let mut report = crate::tenancy::limits::LimitReport::default();
    batches
        .tenancy
        .limiter
        .hit(&caller.principal, &mut report)
        .await?;
    // A batch line is answered whole; a stream asked for is folded.
    body.remove("stream");
    body.remove("stream_options");
    let call = Call {
        generator: &batches.generator,
        caller,
        started: Instant::now(),
        streams: batches.streams,
    };
    let reply = match endpoint {
        "/v1/chat/completions" => chat::complete(call, &parse(body)?).await?,
        "/v1/completions" => completions::complete(call, &parse(body)?).await?,
        "/v1/embeddings" => embeddings::embed(call, parse(body)?).await?,
        "/v1/responses" => {
            if body
                .get("background")
                .is_some_and(|b| b == &Value::Bool(true))
            {
                return Err(ApiError::unsupported(
                    "background",
                    "A batch line cannot run in the background; it already does.",
                ));
            }
            let req = parse(body)?;
            responses::api::respond(call, &batches.responses, &req, None)
                .await?
                .0
        }
        other => {
            return Err(ApiError::invalid(
                "url",
                format!("{other:?} is not a batch endpoint"),
            ));
        }
    };
    match reply {
        Reply::Json { id, body } => {
            let value = serde_json::from_slice(&body).map_err(|e| ApiError::Internal {
                detail: format!("a batch line's answer is not JSON: {e}"),
            })?;
            Ok((id, value))
        }
        Reply::Events { .. } | Reply::Log { .. } => Err(ApiError::Internal {
            detail: "a batch line was answered with a stream".into(),
        }),
    }
}
