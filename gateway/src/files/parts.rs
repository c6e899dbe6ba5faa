//! A batch's chunk results, kept beside the files in the same object store (under the
//! tenant and the batch id, so never listed as files) until the batch ends.

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

use super::Files;
use crate::error::ApiError;

impl Files {
    /// Keeps the results of chunk `k` of batch `batch` (replacing any written before).
    pub(crate) async fn put_part(
        &self,
        tenant: &str,
        batch: &str,
        k: usize,
        bytes: Bytes,
    ) -> Result<(), ApiError> {
        self.objects()?
            .put(&part_path(tenant, batch, k), PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable(e))
    }

    /// The results of chunk `k` of batch `batch`; empty when none were written.
    pub(crate) async fn read_part(
        &self,
        tenant: &str,
        batch: &str,
        k: usize,
    ) -> Result<Bytes, ApiError> {
        match self.objects()?.get(&part_path(tenant, batch, k)).await {
            Ok(got) => got.bytes().await.map_err(|e| self.unavailable(e)),
            Err(object_store::Error::NotFound { .. }) => Ok(Bytes::new()),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    /// Removes a finished batch's chunk results (best effort: they are not listed anywhere).
    pub(crate) async fn delete_parts(&self, tenant: &str, batch: &str, chunks: usize) {
        let Ok(objects) = self.objects() else { return };
        for k in 0..chunks {
            let _ = objects.delete(&part_path(tenant, batch, k)).await;
        }
    }
}

fn part_path(tenant: &str, batch: &str, k: usize) -> ObjectPath {
    ObjectPath::from_iter([tenant, batch, &k.to_string()])
}
