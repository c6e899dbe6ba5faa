//! What an admin call can fail with, and the one mapping to HTTP statuses.

use std::time::Duration;

use crate::error::ApiError;
use crate::store::StoreError;

/// Why an admin call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// The change would leave an invalid state, or the request is malformed (400).
    #[error("{0}")]
    Invalid(String),
    /// It names nothing the admin state holds (404).
    #[error("{what} `{name}` does not exist")]
    NotFound {
        /// What kind of thing.
        what: &'static str,
        /// Its name.
        name: String,
    },
    /// It clashes with what the configuration defines, or with the state (409).
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` named another revision (412).
    #[error("the admin state is at revision {current}, not {expected}; read it again and retry")]
    Stale {
        /// The revision the caller expected.
        expected: u64,
        /// The revision in force.
        current: u64,
    },
    /// Other replicas kept changing the state while this change was tried (409).
    #[error("the admin state kept changing while this change was tried; retry")]
    Contended,
    /// The caller is not an administrator, or lacks the client certificate required (403).
    #[error("{message}")]
    Forbidden {
        /// `admin_scope_required` or `client_certificate_required`.
        code: &'static str,
        /// What is missing.
        message: String,
    },
    /// The state store did not answer (503).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store went behind the state the replicas hold and is not restored yet (503).
    #[error(
        "the state store lost the admin state (it is at revision {store}, this replica holds {held}); it is being put back: retry"
    )]
    Restoring {
        /// The store's revision.
        store: u64,
        /// The revision held here.
        held: u64,
    },
    /// The stored state cannot be read, or no key could be made (500; logged).
    #[error("{0}")]
    Internal(String),
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> Self {
        match error {
            AdminError::Invalid(message) => ApiError::invalid("body", message),
            AdminError::NotFound { what, name } => ApiError::NotFound {
                param: None,
                code: "not_found",
                message: format!("{what} `{name}` does not exist"),
            },
            AdminError::Conflict(message) => ApiError::Conflict {
                code: "managed_elsewhere",
                message,
            },
            e @ AdminError::Contended => ApiError::Conflict {
                code: "state_changed",
                message: e.to_string(),
            },
            e @ AdminError::Stale { .. } => ApiError::PreconditionFailed(e.to_string()),
            AdminError::Forbidden { code, message } => ApiError::Forbidden {
                param: None,
                code,
                message,
            },
            AdminError::Store(e) => ApiError::StateUnavailable {
                detail: e.to_string(),
                retry_after: Duration::from_secs(1),
            },
            e @ AdminError::Restoring { .. } => ApiError::StateUnavailable {
                detail: e.to_string(),
                retry_after: Duration::from_secs(1),
            },
            AdminError::Internal(detail) => ApiError::Internal { detail },
        }
    }
}
