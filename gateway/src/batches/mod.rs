//! The Batch API: `POST /v1/batches` runs every line of an uploaded file ([`crate::files`])
//! through the same protocols, limits, budgets and usage as a client's own request, at the
//! lowest priority and only while the engine has room ([`worker`]), and writes the answers and
//! errors to result files in OpenAI's line format.
//!
//! Everything a batch needs is in the state store, so any replica sharing it runs any batch's
//! lines and a restart picks up where the last process stopped. A batch's lines are cut into
//! chunks; a replica claims a chunk under a lease it renews (the store's idempotency records:
//! a claim is `begin`, a result `finish`), runs its lines and writes the chunk's results as one
//! object before it marks the chunk done. A replica that dies leaves its chunk to lapse and be
//! claimed again, so each line's answer is written exactly once. The last chunk's finisher
//! (or any replica that finds every chunk done) writes the result files.

mod finalize;
mod line;
pub(crate) mod record;
pub mod settings;
mod state;
pub(crate) mod worker;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::unix_now;
use crate::error::ApiError;
use crate::files::Files;
use crate::files::index::{self, Index, IndexError};
use crate::files::lines::{self, ENDPOINTS};
use crate::protocols::StreamSettings;
use crate::protocols::responses::Responses;
use crate::store::Store;
use crate::tenancy::{Endpoint, Principal, Tenancy};
use record::{BatchRecord, Owner, Phase};
pub use settings::BatchSettings;
use state::Keys;

/// `POST /v1/batches` as sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBatch {
    /// The uploaded file of lines.
    pub input_file_id: String,
    /// The endpoint every line calls.
    pub endpoint: String,
    /// `24h`.
    pub completion_window: String,
    /// Up to 16 string pairs.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// `output_expires_after`, accepted and ignored: result files are kept as `[files]
    /// keep_days` says.
    #[serde(default, rename = "output_expires_after")]
    _output_expires_after: Option<serde::de::IgnoredAny>,
}

/// The windows a batch may be given.
const WINDOWS: [(&str, u64); 1] = [("24h", 24 * 3600)];

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

    fn index_error(&self, e: IndexError) -> ApiError {
        match e {
            IndexError::Refused(message) => ApiError::Overloaded {
                message,
                retry_after: std::time::Duration::from_secs(60),
            },
            other => self.unavailable(other),
        }
    }

    fn tenant_index(&self, tenant: &str) -> Index {
        Index::new(
            Arc::clone(&self.store),
            format!("turnpike:batches:{tenant}"),
        )
    }

    /// Creates a batch of `principal`'s: checks the file's lines against the endpoint, records
    /// the batch and wakes the workers.
    pub(crate) async fn create(
        &self,
        principal: &Principal,
        req: CreateBatch,
    ) -> Result<Value, ApiError> {
        let tenant = principal.tenant.name.as_str();
        self.files.enabled_or_err()?;
        // An API key's scopes are read again as lines run (a revoked key stops its batches);
        // a token's are kept as they are now.
        let is_key = principal.key_id.as_ref().is_some_and(|id| {
            self.tenancy
                .auth
                .directory()
                .keys
                .get(id)
                .is_some_and(|k| k.tenant == tenant)
        });
        let window = WINDOWS
            .iter()
            .find(|(w, _)| *w == req.completion_window)
            .map(|(_, secs)| *secs)
            .ok_or_else(|| {
                ApiError::invalid("completion_window", "'completion_window' must be \"24h\"")
            })?;
        if !ENDPOINTS.contains(&req.endpoint.as_str()) {
            return Err(ApiError::invalid(
                "endpoint",
                format!(
                    "'endpoint' must be one of {}, got {:?}",
                    ENDPOINTS.join(", "),
                    req.endpoint
                ),
            ));
        }
        check_metadata(req.metadata.as_ref())?;
        let scope = Endpoint::of_path(&req.endpoint).unwrap_or(Endpoint::Chat);
        if !principal.may_call(scope) {
            return Err(ApiError::Forbidden {
                param: Some("endpoint".into()),
                code: "endpoint_not_allowed",
                message: format!("This key may not call the `{}` endpoint.", scope.name()),
            });
        }
        let meta = self
            .files
            .find(tenant, &req.input_file_id)
            .await?
            .ok_or_else(|| crate::files::not_found(&req.input_file_id, Some("input_file_id")))?;
        if meta.purpose != "batch" {
            return Err(ApiError::invalid(
                "input_file_id",
                format!(
                    "File '{}' was not uploaded with purpose \"batch\".",
                    meta.id
                ),
            ));
        }
        if meta.lines > self.settings.max_lines {
            return Err(ApiError::invalid(
                "input_file_id",
                format!(
                    "The file holds {} lines; a batch may hold at most {}.",
                    meta.lines, self.settings.max_lines
                ),
            ));
        }
        let bytes = self.files.read(tenant, &meta.id).await?;
        for (number, (start, end)) in lines::spans(&bytes).enumerate() {
            let line = lines::parse_line(&bytes[start..end], number as u64 + 1)
                .map_err(|m| ApiError::invalid("input_file_id", m))?;
            if line.url != req.endpoint {
                return Err(ApiError::invalid(
                    "input_file_id",
                    format!(
                        "line {}: `url` is {:?}, but the batch's endpoint is {:?}; a batch's lines all call its endpoint.",
                        number + 1,
                        line.url,
                        req.endpoint
                    ),
                ));
            }
        }
        let now = unix_now();
        let record = BatchRecord {
            id: crate::ids::new_id("batch_"),
            endpoint: req.endpoint,
            input_file_id: meta.id,
            completion_window: req.completion_window,
            created_at: now,
            expires_at: now + window,
            metadata: req.metadata,
            owner: Owner::of(principal, is_key),
            total: meta.lines,
            chunk_lines: self.settings.chunk_lines,
            chunks: lines::chunks(&bytes, self.settings.chunk_lines),
        };
        let max_open = self.settings.max_open_per_tenant;
        let entry = (tenant.to_string(), record.id.clone());
        self.put_record(&record).await?;
        self.open
            .update(|open: &mut Vec<(String, String)>| {
                let mine = open.iter().filter(|(t, _)| *t == entry.0).count();
                if mine >= max_open {
                    return Err(format!(
                        "This tenant has {max_open} batches open, the most allowed; wait for one to end."
                    ));
                }
                open.push(entry.clone());
                Ok(true)
            })
            .await
            .map_err(|e| self.index_error(e))?;
        let id = record.id.clone();
        self.tenant_index(tenant)
            .update(|ids: &mut Vec<String>| {
                if ids.len() >= LISTED {
                    ids.remove(0);
                }
                ids.push(id.clone());
                Ok(true)
            })
            .await
            .map_err(|e| self.index_error(e))?;
        metrics::counter!("turnpike_batches_created_total").increment(1);
        self.wake.notify_one();
        Ok(record.wire(&Phase::InProgress, record::Counts::default(), None))
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

/// OpenAI's metadata rule: at most 16 pairs, keys up to 64 characters, string values up to 512.
fn check_metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let Some(metadata) = metadata else {
        return Ok(());
    };
    let bad = || {
        ApiError::invalid(
            "metadata",
            "'metadata' must be an object of at most 16 string values (keys up to 64 characters, values up to 512)",
        )
    };
    if metadata.is_null() {
        return Ok(());
    }
    let map = metadata.as_object().ok_or_else(bad)?;
    if map.len() > 16 {
        return Err(bad());
    }
    for (key, value) in map {
        let ok =
            key.chars().count() <= 64 && value.as_str().is_some_and(|v| v.chars().count() <= 512);
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}
