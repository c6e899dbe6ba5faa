//! Files: what a tenant uploads for the Batch API, and the result files batches write.
//!
//! A file's bytes live in an object store (the `object_store` crate: a directory, or an
//! S3-compatible bucket, [`s3`]), its metadata in the state store under a key that holds
//! the tenant, so one tenant's ids are never found by another and every replica sharing Redis
//! sees the same files. Each tenant's ids are listed in one [`index::Index`] record (bounded).
//!
//! A batch input file is checked line by line at upload ([`lines`]): a bad file is refused with
//! its first bad line named, before any batch can read it.

mod catalog;
pub(crate) mod index;
pub(crate) mod lines;
mod parts;
mod s3;
pub mod settings;
mod sweep;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::unix_now;
use crate::error::ApiError;
use crate::store::{Store, StoreError};
pub use settings::{FilesSettings, Storage};

/// Purposes a client may upload with.
pub(crate) const UPLOAD_PURPOSES: [&str; 1] = ["batch"];

/// A file's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileMeta {
    /// `file-…`.
    pub id: String,
    /// Its size.
    pub bytes: u64,
    /// Unix seconds when it was written.
    pub created_at: u64,
    /// Unix seconds when it lapses.
    pub expires_at: u64,
    /// The name it was uploaded with.
    pub filename: String,
    /// `batch`, `batch_output`.
    pub purpose: String,
    /// Its lines, for a batch input file.
    #[serde(default)]
    pub lines: u64,
}

impl FileMeta {
    /// The file object as OpenAI returns it.
    pub(crate) fn wire(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }
}

/// The files of every tenant.
#[derive(Debug, Clone)]
pub struct Files {
    objects: Option<Arc<dyn ObjectStore>>,
    store: Arc<dyn Store>,
    settings: FilesSettings,
    retry_after: Duration,
}

fn meta_key(tenant: &str, id: &str) -> String {
    format!("turnpike:file:{tenant}:{id}")
}

fn object_path(tenant: &str, id: &str) -> ObjectPath {
    ObjectPath::from_iter([tenant, id])
}

/// The 404 for a file id this caller does not have.
pub(crate) fn not_found(id: &str, param: Option<&str>) -> ApiError {
    ApiError::NotFound {
        param: param.map(str::to_string),
        code: "file_not_found",
        message: format!("No file with id '{id}' found."),
    }
}

impl Files {
    /// The files kept as `settings` say, their metadata in `store`.
    pub fn new(
        settings: FilesSettings,
        store: Arc<dyn Store>,
        retry_after: Duration,
    ) -> Result<Self, String> {
        let objects: Option<Arc<dyn ObjectStore>> = match &settings.storage {
            Storage::Off => None,
            Storage::S3 {
                url,
                endpoint,
                region,
            } => Some(s3::open(url, endpoint.as_deref(), region.as_deref())?),
            Storage::Dir(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("files.dir `{}`: {e}", dir.display()))?;
                let local = LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| format!("files.dir `{}`: {e}", dir.display()))?;
                Some(Arc::new(local))
            }
        };
        Ok(Self {
            objects,
            store,
            settings,
            retry_after,
        })
    }

    /// No files kept: every call says so.
    pub fn off(store: Arc<dyn Store>, retry_after: Duration) -> Self {
        Self {
            objects: None,
            store,
            settings: FilesSettings::default(),
            retry_after,
        }
    }

    /// Whether files are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.objects.is_some()
    }

    /// Largest upload.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.settings.max_bytes
    }

    /// `Ok` when files are kept, the error that says they are not otherwise.
    pub(crate) fn enabled_or_err(&self) -> Result<(), ApiError> {
        self.objects().map(|_| ())
    }

    fn objects(&self) -> Result<&Arc<dyn ObjectStore>, ApiError> {
        self.objects.as_ref().ok_or_else(|| {
            ApiError::unsupported(
                "file",
                "This gateway keeps no files: its operator has not set [files] dir (or url).",
            )
        })
    }

    pub(crate) fn unavailable(&self, detail: impl std::fmt::Display) -> ApiError {
        ApiError::StateUnavailable {
            detail: format!("files: {detail}"),
            retry_after: self.retry_after,
        }
    }

    /// Uploads a client's file: a batch file is checked line by line first.
    pub(crate) async fn upload(
        &self,
        tenant: &str,
        filename: &str,
        purpose: &str,
        bytes: Bytes,
    ) -> Result<FileMeta, ApiError> {
        self.objects()?;
        if !UPLOAD_PURPOSES.contains(&purpose) {
            return Err(ApiError::invalid(
                "purpose",
                format!("'purpose' must be one of {UPLOAD_PURPOSES:?}, got {purpose:?}"),
            ));
        }
        if bytes.len() as u64 > self.settings.max_bytes {
            return Err(ApiError::PayloadTooLarge {
                limit: usize::try_from(self.settings.max_bytes).unwrap_or(usize::MAX),
            });
        }
        let checked = lines::check(&bytes).map_err(|m| ApiError::invalid("file", m))?;
        let mut meta = self.describe(filename, purpose, bytes.len() as u64);
        meta.lines = checked.lines;
        let objects = self.objects()?;
        objects
            .put(&object_path(tenant, &meta.id), PutPayload::from(bytes))
            .await
            .map_err(|e| self.unavailable(e))?;
        self.keep(tenant, &meta).await?;
        Ok(meta)
    }

    fn describe(&self, filename: &str, purpose: &str, bytes: u64) -> FileMeta {
        let now = unix_now();
        FileMeta {
            id: crate::ids::new_id("file-"),
            bytes,
            created_at: now,
            expires_at: now + self.settings.keep.as_secs(),
            filename: filename.to_string(),
            purpose: purpose.to_string(),
            lines: 0,
        }
    }

    /// Writes a result file (a batch's output or errors) from `parts`, streamed to the object
    /// store.
    pub(crate) async fn write(
        &self,
        tenant: &str,
        filename: &str,
        purpose: &str,
        parts: impl futures_core::Stream<Item = Result<Bytes, ApiError>>,
    ) -> Result<FileMeta, ApiError> {
        let objects = self.objects()?;
        let mut meta = self.describe(filename, purpose, 0);
        let upload = objects
            .put_multipart(&object_path(tenant, &meta.id))
            .await
            .map_err(|e| self.unavailable(e))?;
        let mut writer = WriteMultipart::new(upload);
        let mut parts = std::pin::pin!(parts);
        while let Some(part) = parts.next().await {
            match part {
                Ok(bytes) => {
                    meta.bytes += bytes.len() as u64;
                    writer.put(bytes);
                }
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            }
        }
        writer.finish().await.map_err(|e| self.unavailable(e))?;
        self.keep(tenant, &meta).await?;
        Ok(meta)
    }

    /// A file's metadata, if this tenant has it.
    pub(crate) async fn find(&self, tenant: &str, id: &str) -> Result<Option<FileMeta>, ApiError> {
        let Some(bytes) = self
            .store
            .get(&meta_key(tenant, id))
            .await
            .map_err(|e: StoreError| self.unavailable(e))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| self.unavailable(format!("file {id} cannot be read: {e}")))
    }

    /// A file's metadata, or 404.
    pub(crate) async fn meta(&self, tenant: &str, id: &str) -> Result<FileMeta, ApiError> {
        self.objects()?;
        self.find(tenant, id)
            .await?
            .ok_or_else(|| not_found(id, None))
    }

    /// A file's bytes, streamed.
    pub(crate) async fn content(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, object_store::Error>>, ApiError> {
        let meta = self.meta(tenant, id).await?;
        let got = self
            .objects()?
            .get(&object_path(tenant, &meta.id))
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(got.into_stream())
    }

    /// Bytes `start..end` of a file; 404 when its bytes are gone.
    pub(crate) async fn range(
        &self,
        tenant: &str,
        id: &str,
        start: u64,
        end: u64,
    ) -> Result<Bytes, ApiError> {
        match self
            .objects()?
            .get_range(&object_path(tenant, id), start..end)
            .await
        {
            Ok(bytes) => Ok(bytes),
            Err(object_store::Error::NotFound { .. }) => Err(not_found(id, None)),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    /// A whole file's bytes (a batch's input, bounded by the upload limit).
    pub(crate) async fn read(&self, tenant: &str, id: &str) -> Result<Bytes, ApiError> {
        let got = self
            .objects()?
            .get(&object_path(tenant, id))
            .await
            .map_err(|e| self.unavailable(e))?;
        got.bytes().await.map_err(|e| self.unavailable(e))
    }
}
