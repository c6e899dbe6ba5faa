//! A bounded list of ids in one revisioned record of the state store: a tenant's files, its
//! batches, the batches still open. Each change is a compare-and-set on the record's
//! revision, retried when another replica changed it first, so replicas sharing Redis never
//! lose each other's additions. The record's log keeps only the newest change (the store's
//! commits append one), so nothing grows without bound.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::{Commit, Store, StoreError};

/// Attempts at a compare-and-set before giving up (many replicas writing one list at once).
const ATTEMPTS: usize = 32;

/// A list kept under one key.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    store: Arc<dyn Store>,
    key: String,
    log: String,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IndexError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The record holds something that is not the list.
    #[error("the list `{0}` cannot be read")]
    Corrupt(String),
    /// Other writers kept changing it.
    #[error("the list `{0}` kept changing")]
    Busy(String),
    /// The change itself refused (the list is full, say).
    #[error("{0}")]
    Refused(String),
}

impl Index {
    /// The list under `key`.
    pub(crate) fn new(store: Arc<dyn Store>, key: String) -> Self {
        let log = format!("{key}:log");
        Self { store, key, log }
    }

    /// The list and its revision (0 and empty when none was written).
    pub(crate) async fn read<T: DeserializeOwned + Default>(&self) -> Result<(u64, T), IndexError> {
        match self.store.read_revision(&self.key).await? {
            None => Ok((0, T::default())),
            Some(rev) => serde_json::from_slice(&rev.value)
                .map(|list| (rev.number, list))
                .map_err(|_| IndexError::Corrupt(self.key.clone())),
        }
    }

    /// The revision alone: a cheap check whether the list changed.
    pub(crate) async fn revision(&self) -> Result<u64, IndexError> {
        Ok(self.store.revision(&self.key).await?)
    }

    /// Applies `change` to the newest list and writes it, retrying when another writer got
    /// there first; `change` refuses with a message, or returns whether it changed anything.
    pub(crate) async fn update<T, F>(&self, mut change: F) -> Result<T, IndexError>
    where
        T: DeserializeOwned + Serialize + Default,
        F: FnMut(&mut T) -> Result<bool, String>,
    {
        for _ in 0..ATTEMPTS {
            let (number, mut list) = self.read::<T>().await?;
            if !change(&mut list).map_err(IndexError::Refused)? {
                return Ok(list);
            }
            let value =
                serde_json::to_vec(&list).map_err(|_| IndexError::Corrupt(self.key.clone()))?;
            let committed = self
                .store
                .commit(Commit {
                    key: &self.key,
                    expected: number,
                    number: number + 1,
                    value,
                    log: &self.log,
                    entry: Vec::new(),
                    restart_log: true,
                    keep: 1,
                })
                .await?;
            if committed {
                return Ok(list);
            }
            tokio::time::sleep(std::time::Duration::from_millis(fastrand::u64(1..10))).await;
        }
        Err(IndexError::Busy(self.key.clone()))
    }
}

/// Where a page of `ids` starts: after the id `after`, or at the start when it is absent or
/// not listed (any more).
pub(crate) fn page_start(ids: &[String], after: Option<&str>) -> usize {
    after
        .and_then(|a| ids.iter().position(|i| i == a))
        .map_or(0, |at| at + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::{MemoryLimits, MemoryStore};

    #[tokio::test]
    async fn concurrent_additions_are_all_kept_and_a_refusal_changes_nothing() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryLimits {
            max_records: 100,
            max_bytes: 1 << 20,
        }));
        let index = Index::new(store, "list".into());
        let mut tasks = Vec::new();
        for n in 0..20u32 {
            let index = index.clone();
            tasks.push(tokio::spawn(async move {
                index
                    .update(|list: &mut Vec<u32>| {
                        list.push(n);
                        Ok(true)
                    })
                    .await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let (_, mut list): (u64, Vec<u32>) = index.read().await.unwrap();
        list.sort_unstable();
        assert_eq!(list, (0..20).collect::<Vec<_>>());
        let refused = index
            .update(|_: &mut Vec<u32>| Err("full".to_string()))
            .await;
        assert!(matches!(refused, Err(IndexError::Refused(m)) if m == "full"));
    }
}
