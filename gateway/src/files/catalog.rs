//! A tenant's list of files: the one index record each tenant's ids live in (bounded by
//! `files.max_per_tenant`), read for listing and changed on every write and delete.

use super::index::{self, Index, IndexError};
use super::{FileMeta, Files, meta_key, object_path};
use crate::error::ApiError;
use object_store::ObjectStoreExt;

impl Files {
    fn index(&self, tenant: &str) -> Index {
        Index::new(
            std::sync::Arc::clone(&self.store),
            format!("turnpike:files:{tenant}"),
        )
    }

    fn index_error(&self, e: IndexError) -> ApiError {
        self.list_error(e, self.retry_after)
    }

    /// A list change's failure as the client sees it: a refusal (a list full) is 429 with
    /// `retry_after`, anything else the store's 503.
    pub(crate) fn list_error(&self, e: IndexError, retry_after: std::time::Duration) -> ApiError {
        match e {
            IndexError::Refused(message) => ApiError::Overloaded {
                message,
                retry_after,
            },
            other => self.unavailable(other),
        }
    }

    /// Records a written file's metadata and lists it, or refuses when the tenant keeps too
    /// many (files that lapsed are forgotten first).
    pub(super) async fn keep(&self, tenant: &str, meta: &FileMeta) -> Result<(), ApiError> {
        let value = serde_json::to_vec(meta).map_err(|e| self.unavailable(e))?;
        self.store
            .put(&meta_key(tenant, &meta.id), value, self.settings.keep)
            .await
            .map_err(|e| self.unavailable(e))?;
        let (_, ids): (u64, Vec<String>) = self
            .index(tenant)
            .read()
            .await
            .map_err(|e| self.index_error(e))?;
        let mut lapsed = Vec::new();
        if ids.len() >= self.settings.max_per_tenant {
            for id in &ids {
                if self.find(tenant, id).await?.is_none() {
                    lapsed.push(id.clone());
                }
            }
        }
        let max = self.settings.max_per_tenant;
        let id = meta.id.clone();
        self.index(tenant)
            .update(|ids: &mut Vec<String>| {
                ids.retain(|i| !lapsed.contains(i));
                if ids.len() >= max {
                    return Err(format!(
                        "This tenant keeps {max} files, the most allowed; delete some first."
                    ));
                }
                ids.push(id.clone());
                Ok(true)
            })
            .await
            .map_err(|e| self.index_error(e))?;
        Ok(())
    }

    /// A tenant's files, newest first (or oldest with `ascending`), after the id `after`, at
    /// most `limit`; and whether more follow.
    pub(crate) async fn list(
        &self,
        tenant: &str,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: usize,
        ascending: bool,
    ) -> Result<(Vec<FileMeta>, bool), ApiError> {
        self.objects()?;
        let (_, mut ids): (u64, Vec<String>) = self
            .index(tenant)
            .read()
            .await
            .map_err(|e| self.index_error(e))?;
        if !ascending {
            ids.reverse();
        }
        let start = index::page_start(&ids, after);
        let mut out = Vec::new();
        for id in &ids[start..] {
            let Some(meta) = self.find(tenant, id).await? else {
                continue;
            };
            if purpose.is_some_and(|p| p != meta.purpose) {
                continue;
            }
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push(meta);
        }
        Ok((out, false))
    }

    /// Deletes a file; 404 when this tenant has none by that id.
    pub(crate) async fn delete(&self, tenant: &str, id: &str) -> Result<(), ApiError> {
        self.meta(tenant, id).await?;
        match self.objects()?.delete(&object_path(tenant, id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.unavailable(e)),
        }
        self.store
            .delete(&meta_key(tenant, id))
            .await
            .map_err(|e| self.unavailable(e))?;
        let gone = id.to_string();
        self.index(tenant)
            .update(|ids: &mut Vec<String>| {
                let before = ids.len();
                ids.retain(|i| *i != gone);
                Ok(ids.len() != before)
            })
            .await
            .map_err(|e| self.index_error(e))?;
        Ok(())
    }
}
