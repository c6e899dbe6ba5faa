//! Background responses: the request returns at once with the response `in_progress`, the
//! generation runs on a task and stores its result, and `POST /v1/responses/{id}/cancel` stops
//! it. The tasks of this process are kept here (bounded, with a gauge) so a cancel can abort one;
//! aborting drops the generation stream, which cancels the engine's work. A streamed one also
//! keeps its [`EventLog`] here while it runs, for readers on this replica.

use std::collections::HashMap;
use std::sync::Mutex;

use std::sync::Arc;

use tokio::task::AbortHandle;

use super::events::EventLog;
use crate::error::ApiError;

/// Background responses one process runs at most.
pub(crate) const MAX_RUNNING: usize = 4096;

/// One running background response.
#[derive(Debug)]
struct Task {
    abort: AbortHandle,
    log: Option<Arc<EventLog>>,
}

/// The running background responses, by `tenant/id`.
#[derive(Debug, Default)]
pub struct Running {
    tasks: Mutex<HashMap<String, Task>>,
}

fn key(tenant: &str, id: &str) -> String {
    format!("{tenant}/{id}")
}

fn gauge(count: usize) {
    metrics::gauge!("turnpike_background_responses").set(count as f64);
}

impl Running {
    /// Makes room for one more, or refuses (429) when [`MAX_RUNNING`] run.
    pub fn check_room(&self) -> Result<(), ApiError> {
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if tasks.len() >= MAX_RUNNING {
            return Err(ApiError::Overloaded {
                message: format!("{MAX_RUNNING} background responses are running; retry later"),
                retry_after: std::time::Duration::from_secs(1),
            });
        }
        Ok(())
    }

    /// Keeps the task of `tenant`'s response `id`, with its event log when it is streamed.
    pub fn insert(&self, tenant: &str, id: &str, abort: AbortHandle, log: Option<Arc<EventLog>>) {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.insert(key(tenant, id), Task { abort, log });
        gauge(tasks.len());
    }

    /// The event log of `tenant`'s response `id`, while it runs on this replica.
    pub fn log(&self, tenant: &str, id: &str) -> Option<Arc<EventLog>> {
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.get(&key(tenant, id)).and_then(|t| t.log.clone())
    }

    /// Forgets the task (it ended, or is to be stopped); returns it, with its event log, when
    /// it was kept.
    pub fn remove(&self, tenant: &str, id: &str) -> Option<(AbortHandle, Option<Arc<EventLog>>)> {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let task = tasks.remove(&key(tenant, id));
        gauge(tasks.len());
        task.map(|t| (t.abort, t.log))
    }
}
