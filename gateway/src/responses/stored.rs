//! Stored responses: what `previous_response_id`, `GET`, `DELETE` and `input_items` read. Each
//! is kept in the state store (memory or Redis) under a key that holds the tenant, so one
//! tenant's ids are not found by another.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::openai::responses::ResponseObject;
use crate::store::{Store, StoreError};

/// How long a stored response is kept (OpenAI keeps them for 30 days).
pub const KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

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
        let bytes = serde_json::to_vec(stored).map_err(|e| ApiError::Internal {
            detail: format!("cannot encode a stored response: {e}"),
        })?;
        self.store
            .put(&key(tenant, &stored.response.id), bytes, KEEP_FOR)
            .await
            .map_err(|e| self.unavailable(e))
    }

    /// `tenant`'s response `id`, if it is kept.
    pub async fn load(&self, tenant: &str, id: &str) -> Result<Option<StoredResponse>, ApiError> {
        let Some(bytes) = self
            .store
            .get(&key(tenant, id))
            .await
            .map_err(|e| self.unavailable(e))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ApiError::Internal {
                detail: format!("stored response {id} cannot be read: {e}"),
            })
    }

    /// Forgets `tenant`'s response `id`; whether it was kept.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, ApiError> {
        self.store
            .delete(&key(tenant, id))
            .await
            .map_err(|e| self.unavailable(e))
    }
}

/// The 404 for an id that is not kept for this caller.
pub fn not_found(id: &str, param: Option<&str>) -> ApiError {
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
