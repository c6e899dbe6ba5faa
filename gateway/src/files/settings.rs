//! `[files]` as written and validated.
//!
//! ```toml
//! [files]
//! dir = "/var/lib/turnpike/files"   # where uploaded and result files are kept, or:
//! # url = "s3://bucket/prefix"      # an S3-compatible bucket (credentials: AWS_* variables)
//! # endpoint = "http://minio:9000"  # the bucket's server when it is not AWS
//! # region = "us-east-1"
//! max_bytes = 209715200             # largest upload (200 MiB)
//! keep_days = 30                    # how long a file is kept
//! max_per_tenant = 10000            # most files a tenant keeps at once
//! ```
//!
//! Without `dir` or `url` the gateway keeps no files, and `/v1/files` and `/v1/batches` say
//! so. Replicas that share a Redis state store must share the files too: one bucket, or one
//! directory all of them mount.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// `[files]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFiles {
    #[serde(default)]
    dir: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    keep_days: Option<u64>,
    #[serde(default)]
    max_per_tenant: Option<usize>,
}

/// Where file bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Storage {
    /// Nowhere: files are off.
    #[default]
    Off,
    /// A directory.
    Dir(PathBuf),
    /// An S3-compatible bucket.
    S3 {
        /// `s3://bucket/prefix`.
        url: String,
        /// The server, when not AWS.
        endpoint: Option<String>,
        /// The region.
        region: Option<String>,
    },
}

/// Where and how long files are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesSettings {
    /// Where the bytes go.
    pub storage: Storage,
    /// Largest upload, in bytes.
    pub max_bytes: u64,
    /// How long a file is kept after it is written.
    pub keep: Duration,
    /// Most files a tenant keeps at once (uploads and results).
    pub max_per_tenant: usize,
}

impl Default for FilesSettings {
    fn default() -> Self {
        Self {
            storage: Storage::Off,
            max_bytes: DEFAULT_MAX_BYTES,
            keep: Duration::from_secs(30 * 86_400),
            max_per_tenant: 10_000,
        }
    }
}

/// The default upload limit (200 MiB, OpenAI's limit for a batch's input file).
const DEFAULT_MAX_BYTES: u64 = 200 << 20;

impl RawFiles {
    /// Validates; a relative `dir` is taken relative to `base`.
    pub fn validate(self, base: &Path) -> Result<FilesSettings, String> {
        let defaults = FilesSettings::default();
        let max_bytes = self.max_bytes.unwrap_or(defaults.max_bytes);
        if max_bytes == 0 {
            return Err("files.max_bytes: must be positive".into());
        }
        let keep_days = self.keep_days.unwrap_or(30);
        if !(1..=3650).contains(&keep_days) {
            return Err("files.keep_days: must be from 1 to 3650".into());
        }
        let max_per_tenant = self.max_per_tenant.unwrap_or(defaults.max_per_tenant);
        if !(1..=1_000_000).contains(&max_per_tenant) {
            return Err("files.max_per_tenant: must be from 1 to 1000000".into());
        }
        let storage = match (self.dir, self.url) {
            (Some(_), Some(_)) => {
                return Err("files: set `dir` or `url`, not both".into());
            }
            (Some(dir), None) if dir.trim().is_empty() => {
                return Err("files.dir: must name a directory".into());
            }
            (Some(dir), None) => Storage::Dir(base.join(dir)),
            (None, Some(url)) if !url.starts_with("s3://") => {
                return Err(format!(
                    "files.url: `{url}` is not an s3://bucket/prefix URL"
                ));
            }
            (None, Some(url)) => Storage::S3 {
                url,
                endpoint: self.endpoint,
                region: self.region,
            },
            (None, None) if self.endpoint.is_some() || self.region.is_some() => {
                return Err("files: `endpoint` and `region` go with an s3:// `url`".into());
            }
            (None, None) => Storage::Off,
        };
        Ok(FilesSettings {
            storage,
            max_bytes,
            keep: Duration::from_secs(keep_days * 86_400),
            max_per_tenant,
        })
    }
}
