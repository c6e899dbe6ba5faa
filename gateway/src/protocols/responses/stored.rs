//! Stored responses: what `previous_response_id`, `GET`, `DELETE` and `input_items` read. Each
//! is kept in the state store (memory or Redis) under a key that holds the tenant, so one
//! tenant's ids are not found by another.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::events::StoredEvents;
use crate::error::ApiError;
use crate::openai::responses::ResponseObject;
use crate::store::{Store, StoreError};

/// How long a stored response is kept (OpenAI keeps them for 30 days).
pub(crate) const KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long the events of a streamed background response are kept for a reader to pick the
/// stream up again (the response itself stays for [`KEEP_FOR`]).
pub(crate) const KEEP_EVENTS_FOR: Duration = Duration::from_secs(24 * 3600);

/// A response with the conversation that led to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The response as returned.
    pub response: ResponseObject,
    /// Every input item of the conversation up to this response, oldest first (earlier turns'
    /// inputs and outputs, then this turn's input), without `instructions`.
    pub input_items: Vec<Value>,
}

/// The stored responses of every tenant.
#[derive(Debug, Clone)]
pub struct ResponseStore {
    store: Arc<dyn Store>,
    retry_after: Duration,
}

fn key(tenant: &str, id: &str) -> String {
    format!("turnpike:response:{tenant}:{id}")
}

fn events_key(tenant: &str, id: &str) -> String {
    format!("turnpike:response-events:{tenant}:{id}")
}

impl ResponseStore {
    /// Responses kept in `store`; `retry_after` is what a 503 says when it is unreachable.
    pub fn new(store: Arc<dyn Store>, retry_after: Duration) -> Self {
        Self { store, retry_after }
    }

    fn unavailable(&self, e: StoreError) -> ApiError {
        ApiError::StateUnavailable {
            detail: e.to_string(),
            retry_after: self.retry_after,
        }
    }

    /// Keeps `stored` for `tenant`.
    pub async fn save(&self, tenant: &str, stored: &StoredResponse) -> Result<(), ApiError> {
        let key = key(tenant, &stored.response.id);
        self.put(&key, stored, KEEP_FOR, "a stored response").await
    }

    /// `tenant`'s response `id`, if it is kept.
    pub async fn load(&self, tenant: &str, id: &str) -> Result<Option<StoredResponse>, ApiError> {
        self.get(&key(tenant, id), &format!("stored response {id}"))
            .await
    }

    /// Forgets `tenant`'s response `id` (and its events); whether it was kept.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, ApiError> {
        self.store
            .delete(&events_key(tenant, id))
            .await
            .map_err(|e| self.unavailable(e))?;
        self.store
            .delete(&key(tenant, id))
            .await
            .map_err(|e| self.unavailable(e))
    }

    /// Keeps the events of `tenant`'s streamed background response `id`.
    pub async fn save_events(
        &self,
        tenant: &str,
        id: &str,
        events: &StoredEvents,
    ) -> Result<(), ApiError> {
        let key = events_key(tenant, id);
        self.put(&key, events, KEEP_EVENTS_FOR, "a response's events")
            .await
    }

    /// The events of `tenant`'s response `id`, if it was a streamed background response.
    pub async fn load_events(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<StoredEvents>, ApiError> {
        self.get(
            &events_key(tenant, id),
            &format!("the events of response {id}"),
        )
        .await
    }

    /// Keeps `value` (`what`, for errors) as JSON under `key` for `ttl`.
    async fn put(
        &self,
        key: &str,
        value: &impl Serialize,
        ttl: Duration,
        what: &str,
    ) -> Result<(), ApiError> {
        let bytes = serde_json::to_vec(value).map_err(|e| ApiError::Internal {
            detail: format!("cannot encode {what}: {e}"),
        })?;
        self.store
            .put(key, bytes, ttl)
            .await
            .map_err(|e| self.unavailable(e))
    }

    /// The JSON value (`what`, for errors) kept under `key`, if any.
    async fn get<T: DeserializeOwned>(&self, key: &str, what: &str) -> Result<Option<T>, ApiError> {
        let Some(bytes) = self.store.get(key).await.map_err(|e| self.unavailable(e))? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ApiError::Internal {
                detail: format!("{what} cannot be read: {e}"),
            })
    }
}

/// The 404 for an id that is not kept for this caller.
pub(crate) fn not_found(id: &str, param: Option<&str>) -> ApiError {
    match param {
        Some(param) => ApiError::NotFound {
            param: Some(param.to_string()),
            code: "previous_response_not_found",
            message: format!("Previous response with id '{id}' not found."),
        },
        None => ApiError::NotFound {
            param: None,
            code: "response_not_found",
            message: format!("Response with id '{id}' not found."),
        },
    }
}
