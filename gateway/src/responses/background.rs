//! Background responses: the request returns at once with the response `in_progress`, the
//! generation runs on a task and stores its result, and `POST /v1/responses/{id}/cancel` stops
//! it. The tasks of this process are kept here (bounded, with a gauge) so a cancel can abort one;
//! aborting drops the generation stream, which cancels the engine's work.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::task::AbortHandle;

use crate::error::ApiError;

/// Background responses one process runs at most.
pub const MAX_RUNNING: usize = 4096;

/// The running background responses, by `tenant/id`.
#[derive(Debug, Default)]
pub struct Running {
    tasks: Mutex<HashMap<String, AbortHandle>>,
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

    /// Keeps the task of `tenant`'s response `id`.
    pub fn insert(&self, tenant: &str, id: &str, task: AbortHandle) {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.insert(key(tenant, id), task);
        gauge(tasks.len());
    }

    /// Forgets the task (it ended); returns it when it was kept.
    pub fn remove(&self, tenant: &str, id: &str) -> Option<AbortHandle> {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let task = tasks.remove(&key(tenant, id));
        gauge(tasks.len());
        task
    }
}
