//! Usage records: one per request that reached an engine, written when it ends (finished,
//! failed or cancelled) with what was actually generated and its cost. Each record adds to its
//! day's sums by tenant, key and model in the same store step, so a report of the sums always
//! equals the records (see `crate::store::usage`).

use std::time::Instant;

use serde::Serialize;

use super::{Money, Usage};
use crate::store::UsageEntry;

/// What a record says about its request besides the counts, known at admission.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordContext {
    /// The request's id (`chatcmpl-…`).
    pub request_id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its key's id (or token subject); `-` when none.
    pub key_id: String,
    /// The model as called.
    pub model: String,
    /// The model id that served it.
    pub served: String,
    /// The endpoint (`chat`, `completions`, `responses`, `messages`, `embeddings`, `generate`).
    pub endpoint: &'static str,
    /// When it arrived.
    pub started: Instant,
    /// The batch it is a line of.
    pub batch: Option<String>,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It finished (its final usage was counted).
    Finished,
    /// It ended with an error after it started.
    Failed,
    /// The client left or the server cut it.
    Cancelled,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Finished => "ok",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One record as written (a JSON line).
#[derive(Debug, Serialize)]
struct Record<'a> {
    time: String,
    request_id: &'a str,
    tenant: &'a str,
    key_id: &'a str,
    model: &'a str,
    served: &'a str,
    endpoint: &'a str,
    status: &'static str,
    input_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    reasoning_tokens: u64,
    cost: f64,
    cost_nanos: u64,
    latency_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_id: Option<&'a str>,
}

/// The metrics a day's sums keep per tenant, key and model.
pub const METRICS: [&str; 10] = [
    "requests",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_nanos",
    "failed",
    "batch_requests",
    "batch_input_tokens",
    "batch_output_tokens",
];

/// A sum's name: tenant, key, model and metric, tab-separated (none of them holds a tab).
pub fn sum_name(tenant: &str, key: &str, model: &str, metric: &str) -> String {
    // Every request writes several of these: joined by hand, in one allocation.
    let parts = [tenant, "\t", key, "\t", model, "\t", metric];
    let mut name = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| name.push_str(p));
    name
}

impl RecordContext {
    /// The record of this request's end (with `logged`: only the export log keeps records, so
    /// without it the record is left empty) and its sums, at `now` (Unix seconds).
    pub fn entry(
        &self,
        usage: Usage,
        cost: Money,
        outcome: Outcome,
        now: i64,
        logged: bool,
    ) -> UsageEntry {
        let time = time::OffsetDateTime::from_unix_timestamp(now)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let day = super::day_key(time.date());
        let record = logged.then(|| Record {
            time: time
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            request_id: &self.request_id,
            tenant: &self.tenant,
            key_id: &self.key_id,
            model: &self.model,
            served: &self.served,
            endpoint: self.endpoint,
            status: outcome.as_str(),
            input_tokens: usage.prompt,
            cached_tokens: usage.cached,
            output_tokens: usage.completion,
            reasoning_tokens: usage.reasoning,
            cost: cost.units(),
            cost_nanos: cost.0,
            latency_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            batch_id: self.batch.as_deref(),
        });
        let batch = u64::from(self.batch.is_some());
        let amounts = [
            1,
            usage.prompt,
            usage.cached,
            usage.completion,
            usage.reasoning,
            cost.0,
            u64::from(outcome != Outcome::Finished),
            batch,
            batch * usage.prompt,
            batch * usage.completion,
        ];
        let sums = METRICS
            .iter()
            .zip(amounts)
            .filter(|(_, amount)| *amount > 0)
            .map(|(metric, amount)| {
                (
                    sum_name(&self.tenant, &self.key_id, &self.model, metric),
                    amount,
                )
            })
            .collect();
        UsageEntry {
            record: record
                .and_then(|r| serde_json::to_vec(&r).ok())
                .unwrap_or_default(),
            day,
            sums,
        }
    }
}
