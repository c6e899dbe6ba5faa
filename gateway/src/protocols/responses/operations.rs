//! The Responses API's operations on stored responses: retrieve (with `stream=true`, follow a
//! streamed background response), delete, cancel a background response, and list a response's
//! input items.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::stored::{StoredResponse, not_found};
use super::{ResponseStore, Responses, runner};
use crate::error::ApiError;
use crate::openai::responses::InputItemList;
use crate::protocols::{Reply, StreamSettings};

/// `tenant`'s stored response `id`, or 404 `response_not_found`.
async fn stored_or_404(
    store: &ResponseStore,
    tenant: &str,
    id: &str,
) -> Result<StoredResponse, ApiError> {
    store
        .load(tenant, id)
        .await?
        .ok_or_else(|| not_found(id, None))
}

/// `POST /v1/responses/{id}/cancel`: stops `tenant`'s background response that is still
/// queued or running and stores it `cancelled`; a finished one is returned as it is.
pub(crate) async fn cancel(
    responses: &Responses,
    tenant: &str,
    id: &str,
) -> Result<Reply, ApiError> {
    let stored = stored_or_404(&responses.store, tenant, id).await?;
    if !stored.response.background {
        return Err(ApiError::invalid(
            "response_id",
            "only background responses can be cancelled",
        ));
    }
    let stored = runner::cancel(responses, tenant, stored).await?;
    Ok(Reply::json(None, &stored.response))
}

/// `GET /v1/responses/{id}`: `tenant`'s response, or with `stream=true` the event stream of
/// a streamed background response (after `starting_after`, when given).
pub(crate) async fn retrieve(
    responses: &Responses,
    streams: StreamSettings,
    tenant: &str,
    id: &str,
    query: &HashMap<String, String>,
) -> Result<Reply, ApiError> {
    let stored = stored_or_404(&responses.store, tenant, id).await?;
    let stream = match query.get("stream").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "stream",
                format!("'stream' must be true or false, not '{other}'"),
            ));
        }
    };
    let starting_after = match query.get("starting_after") {
        None => None,
        Some(n) => Some(n.parse::<u64>().map_err(|_| {
            ApiError::invalid(
                "starting_after",
                "'starting_after' must be a sequence number (an integer from 0)",
            )
        })?),
    };
    if stream {
        return runner::resume(responses, streams, tenant, &stored, starting_after).await;
    }
    Ok(Reply::json(None, &stored.response))
}

/// `DELETE /v1/responses/{id}`: stops `tenant`'s response if it runs here, and forgets it.
pub(crate) async fn delete(
    responses: &Responses,
    tenant: &str,
    id: &str,
) -> Result<Reply, ApiError> {
    runner::stop(responses, tenant, id);
    if !responses.store.delete(tenant, id).await? {
        return Err(not_found(id, None));
    }
    Ok(Reply::json(
        None,
        &json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// `GET /v1/responses/{id}/input_items`: `tenant`'s response's input items (`limit` 1..=100,
/// default 20; `order` `desc` (default) or `asc`; `after` an item id).
pub(crate) async fn input_items(
    responses: &Responses,
    tenant: &str,
    id: &str,
    query: &HashMap<String, String>,
) -> Result<Reply, ApiError> {
    let limit = crate::protocols::paging::limit(query, 20, 100)?;
    let ascending = crate::protocols::paging::ascending(query)?;
    let stored = stored_or_404(&responses.store, tenant, id).await?;
    let mut items = stored.input_items;
    if !ascending {
        items.reverse();
    }
    if let Some(after) = query.get("after") {
        let at = items
            .iter()
            .position(|item| item.get("id").and_then(Value::as_str) == Some(after))
            .ok_or_else(|| {
                ApiError::invalid(
                    "after",
                    format!("no input item '{after}' in response '{id}'"),
                )
            })?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let id_of = |item: Option<&Value>| {
        item.and_then(|i| i.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let list = InputItemList {
        object: "list",
        first_id: id_of(items.first()),
        last_id: id_of(items.last()),
        has_more,
        data: items,
    };
    Ok(Reply::json(None, &list))
}
