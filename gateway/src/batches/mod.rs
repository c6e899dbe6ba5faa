//! The Batch API: `POST /v1/batches` runs every line of an uploaded file ([`crate::files`])
//! through the same protocols, limits, budgets and usage as a client's own request, at the
//! lowest priority and only while the engine has room ([`worker`]), and writes the answers and
//! errors to result files in OpenAI's line format.
//!
//! Everything a batch needs is in the state store, so any replica sharing it runs any batch's
//! lines and a restart picks up where the last process stopped. A batch's lines are cut into
//! chunks; a replica claims a chunk under a lease it renews (the store's idempotency records:
//! a claim is `begin`, a result `finish`), runs its lines and writes each answer to the chunk's
//! results object as it comes, marking the chunk done after the last. A replica that dies
//! leaves its chunk to lapse and be claimed again; the new holder runs only the lines that had
//! no answer (those under way when the replica died), so each line's answer is written once. The last chunk's finisher
//! (or any replica that finds every chunk done) writes the result files.

mod chunk;
mod create;
mod finalize;
mod line;
mod part;
pub(crate) mod record;
pub mod settings;
mod state;
pub(crate) mod worker;

use std::sync::Arc;

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::files::Files;
use crate::files::index::{self, Index, IndexError};
use crate::protocols::StreamSettings;
use crate::protocols::responses::Responses;
use crate::store::Store;
use crate::tenancy::Tenancy;
pub(crate) use create::CreateBatch;
use record::{BatchRecord, Phase};
pub use settings::BatchSettings;
use state::Keys;

/// Most batches a tenant's list keeps.
const LISTED: usize = 10_000;

/// The batches of every tenant, and what runs their lines.
#[derive(Debug)]
pub struct Batches {
    files: Files,
    store: Arc<dyn Store>,
    settings: BatchSettings,
    tenancy: Arc<Tenancy>,
    generator: crate::generation::Generator,
    responses: Responses,
    streams: StreamSettings,
    open: Index,
    wake: tokio::sync::Notify,
}

/// The 404 for a batch id this caller does not have.
fn not_found(id: &str) -> ApiError {
    ApiError::NotFound {
        param: None,
        code: "batch_not_found",
        message: format!("No batch with id '{id}' found."),
    }
}

/// What a batch's lines run on.
#[derive(Debug)]
pub struct Engines {
    /// The facade.
    pub generator: crate::generation::Generator,
    /// Authentication's directory and the tenants' limits.
    pub tenancy: Arc<Tenancy>,
    /// Stored responses, for `/v1/responses` lines.
    pub responses: Responses,
    /// How long a line may take.
    pub streams: StreamSettings,
}

impl Batches {
    /// The batches kept in `files`' store, run by `engines`.
    pub fn new(files: Files, settings: BatchSettings, engines: Engines) -> Self {
        let store = Arc::clone(engines.tenancy.store());
        let open = Index::new(Arc::clone(&store), "turnpike:batches-open".into());
        Self {
            files,
            store,
            settings,
            tenancy: engines.tenancy,
            generator: engines.generator,
            responses: engines.responses,
            streams: engines.streams,
            open,
            wake: tokio::sync::Notify::new(),
        }
    }

    /// The files batches read and write.
    pub(crate) fn files(&self) -> &Files {
        &self.files
    }

    fn unavailable(&self, e: impl std::fmt::Display) -> ApiError {
        self.files.unavailable(e)
    }

    /// A batch list's failure; a tenant's full open list frees as its batches end.
    fn index_error(&self, e: IndexError) -> ApiError {
        self.files.list_error(e, std::time::Duration::from_secs(60))
    }

    fn tenant_index(&self, tenant: &str) -> Index {
        Index::new(
            Arc::clone(&self.store),
            format!("turnpike:batches:{tenant}"),
        )
    }

    async fn put_record(&self, record: &BatchRecord) -> Result<(), ApiError> {
        let value = serde_json::to_vec(record).map_err(|e| self.unavailable(e))?;
        let keep = state::keep_for(record);
        self.store
            .put(
                &state::record_key(&record.owner.tenant, &record.id),
                value,
                keep,
            )
            .await
            .map_err(|e| self.unavailable(e))
    }

    /// A batch of this tenant's, or 404.
    pub(crate) async fn record(&self, tenant: &str, id: &str) -> Result<BatchRecord, ApiError> {
        state::load_record(&*self.store, tenant, id)
            .await
            .map_err(|e| self.unavailable(e))?
            .ok_or_else(|| not_found(id))
    }

    /// The batch object of a record as it stands.
    async fn view(&self, record: &BatchRecord) -> Result<Value, ApiError> {
        let keys = Keys::new(record);
        let now = state::read(&*self.store, &keys)
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(record.wire(&now.phase, now.counts, now.cancelled_at))
    }

    /// `GET /v1/batches/{id}`.
    pub(crate) async fn retrieve(&self, tenant: &str, id: &str) -> Result<Value, ApiError> {
        self.files.enabled_or_err()?;
        let record = self.record(tenant, id).await?;
        self.view(&record).await
    }

    /// `GET /v1/batches`: newest first, after the id `after`, at most `limit`.
    pub(crate) async fn list(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Value, ApiError> {
        self.files.enabled_or_err()?;
        let (_, mut ids): (u64, Vec<String>) = self
            .tenant_index(tenant)
            .read()
            .await
            .map_err(|e| self.index_error(e))?;
        ids.reverse();
        let start = index::page_start(&ids, after);
        let mut data = Vec::new();
        let mut has_more = false;
        for id in &ids[start..] {
            let Some(record) = state::load_record(&*self.store, tenant, id)
                .await
                .map_err(|e| self.unavailable(e))?
            else {
                continue;
            };
            if data.len() == limit {
                has_more = true;
                break;
            }
            data.push(self.view(&record).await?);
        }
        Ok(json!({
            "object": "list",
            "first_id": data.first().map(|b| b["id"].clone()),
            "last_id": data.last().map(|b| b["id"].clone()),
            "has_more": has_more,
            "data": data,
        }))
    }

    /// `POST /v1/batches/{id}/cancel`: lines under way stop, finished ones are kept.
    pub(crate) async fn cancel(&self, tenant: &str, id: &str) -> Result<Value, ApiError> {
        self.files.enabled_or_err()?;
        let record = self.record(tenant, id).await?;
        let keys = Keys::new(&record);
        let now = state::read(&*self.store, &keys)
            .await
            .map_err(|e| self.unavailable(e))?;
        if let Phase::Ended(ending) = &now.phase {
            return Err(ApiError::Conflict {
                code: "batch_not_cancellable",
                message: format!("Batch '{id}' has already ended ({}).", ending.status),
            });
        }
        if now.cancelled_at.is_none() {
            state::mark_cancelled(&*self.store, &record)
                .await
                .map_err(|e| self.unavailable(e))?;
        }
        self.wake.notify_one();
        self.view(&record).await
    }
}

impl Batches {
    /// Takes an ended (or lapsed) batch off the open list.
    pub(crate) async fn forget(&self, tenant: &str, id: &str) {
        let removed = self
            .open
            .update(|open: &mut Vec<(String, String)>| {
                let before = open.len();
                open.retain(|(t, i)| !(t == tenant && i == id));
                Ok(open.len() != before)
            })
            .await;
        if let Err(e) = removed {
            tracing::warn!(batch = %id, error = %e, "batch: leaving the open list failed; trying again later");
        }
    }
}
