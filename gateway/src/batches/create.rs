//! `POST /v1/batches`: the request checked (window, endpoint, metadata, the caller's scope, the
//! file's purpose, size and every line's endpoint), the batch recorded, listed and opened.

use serde::Deserialize;
use serde_json::Value;

use super::record::{self, BatchRecord, Owner, Phase};
use super::{Batches, LISTED};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::files::lines::{self, ENDPOINTS};
use crate::tenancy::{Endpoint, Principal};

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

impl Batches {
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
