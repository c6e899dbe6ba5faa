//! What the state store keeps of a batch, and the batch object OpenAI's clients read.
//!
//! A batch is written once when it is created ([`BatchRecord`]); everything after is kept
//! beside it, each piece written by one party, so replicas never overwrite each other: the
//! cancel mark, the live line counts (tallies), each chunk's claim and result, and the final
//! state ([`Ending`]) its finisher writes last.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::tenancy::{Endpoint, NameSet, Principal, Scopes};

/// Who created a batch: its lines run as them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    /// The tenant.
    pub tenant: String,
    /// The API key's id, or the token's subject.
    pub key_id: Option<String>,
    /// Whether `key_id` names an API key (whose scopes are read again when lines run, so a
    /// revoked key stops its batches) rather than a token's subject.
    pub is_key: bool,
    /// The models a token allowed (`None`: all).
    pub models: Option<BTreeSet<String>>,
    /// The endpoints a token allowed, by scope name (`None`: the implied ones).
    pub endpoints: Option<BTreeSet<String>>,
}

impl Owner {
    /// The owner of a batch `principal` creates.
    pub(crate) fn of(principal: &Principal, is_key: bool) -> Self {
        let models = match &principal.scopes.models {
            NameSet::All => None,
            NameSet::Only(set) => Some(set.clone()),
        };
        let endpoints = principal
            .scopes
            .endpoints
            .as_ref()
            .map(|set| set.iter().map(|e| e.name().to_string()).collect());
        Self {
            tenant: principal.tenant.name.clone(),
            key_id: principal.key_id.clone(),
            is_key,
            models,
            endpoints,
        }
    }

    /// A token's scopes as they were when the batch was created.
    pub(crate) fn token_scopes(&self) -> Scopes {
        Scopes {
            models: match &self.models {
                None => NameSet::All,
                Some(set) => NameSet::Only(set.clone()),
            },
            endpoints: self
                .endpoints
                .as_ref()
                .map(|names| names.iter().filter_map(|n| Endpoint::parse(n)).collect()),
            admin: false,
            budget: None,
        }
    }
}

/// A batch as created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BatchRecord {
    /// `batch_…`.
    pub id: String,
    /// The endpoint every line calls.
    pub endpoint: String,
    /// The input file.
    pub input_file_id: String,
    /// `24h`.
    pub completion_window: String,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds when unfinished lines expire.
    pub expires_at: u64,
    /// The caller's metadata.
    pub metadata: Option<Value>,
    /// Who runs it.
    pub owner: Owner,
    /// Its lines.
    pub total: u64,
    /// Lines per chunk.
    pub chunk_lines: usize,
    /// Each chunk's byte range in the input file.
    pub chunks: Vec<(u64, u64)>,
}

/// How a batch ended, written once by its finisher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ending {
    /// `completed`, `cancelled`, `expired` or `failed`.
    pub status: String,
    /// Unix seconds.
    pub at: u64,
    /// The answers' file.
    pub output_file_id: Option<String>,
    /// The errors' file.
    pub error_file_id: Option<String>,
    /// Lines answered.
    pub completed: u64,
    /// Lines that failed.
    pub failed: u64,
    /// Why the batch failed as a whole (`failed`), as OpenAI's `errors.data`.
    #[serde(default)]
    pub errors: Option<Value>,
}

/// A batch's state between its creation and its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Lines are running.
    InProgress,
    /// Cancelled; lines under way are stopping.
    Cancelling,
    /// The result files are being written.
    Finalizing,
    /// Over.
    Ended(Ending),
}

/// Lines done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    /// Answered.
    pub completed: u64,
    /// Failed.
    pub failed: u64,
    /// Whether a replica has taken any of its lines (until then it is `validating`).
    pub started: bool,
}

impl BatchRecord {
    /// The batch object as OpenAI returns it.
    pub(crate) fn wire(&self, phase: &Phase, counts: Counts, cancelled_at: Option<u64>) -> Value {
        let (status, counts, ending) = match phase {
            Phase::InProgress if !counts.started => ("validating", counts, None),
            Phase::InProgress => ("in_progress", counts, None),
            Phase::Cancelling => ("cancelling", counts, None),
            Phase::Finalizing => ("finalizing", counts, None),
            Phase::Ended(e) => (
                e.status.as_str(),
                Counts {
                    completed: e.completed,
                    failed: e.failed,
                    started: true,
                },
                Some(e),
            ),
        };
        let at = |s: &str| ending.filter(|e| e.status == s).map(|e| e.at);
        let finished = ending.map(|e| e.at);
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": ending.and_then(|e| e.errors.clone()),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": status,
            "output_file_id": ending.and_then(|e| e.output_file_id.clone()),
            "error_file_id": ending.and_then(|e| e.error_file_id.clone()),
            "created_at": self.created_at,
            "in_progress_at": (status != "validating").then_some(self.created_at),
            "expires_at": self.expires_at,
            "finalizing_at": finished,
            "completed_at": at("completed"),
            "failed_at": at("failed"),
            "expired_at": at("expired"),
            "cancelling_at": cancelled_at,
            "cancelled_at": at("cancelled"),
            "request_counts": {
                "total": self.total,
                "completed": counts.completed,
                "failed": counts.failed,
            },
            "metadata": self.metadata,
        })
    }
}
