//! `[files]` as written and validated.
//!
//! ```toml
//! [files]
//! dir = "/var/lib/turnpike/files"   # where uploaded and result files are kept
//! max_bytes = 209715200             # largest upload (200 MiB)
//! keep_days = 30                    # how long a file is kept
//! max_per_tenant = 10000            # most files a tenant keeps at once
//! ```
//!
//! Without `dir` the gateway keeps no files, and `/v1/files` and `/v1/batches` say so.

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
    max_bytes: Option<u64>,
    #[serde(default)]
    keep_days: Option<u64>,
    #[serde(default)]
    max_per_tenant: Option<usize>,
}

/// Where and how long files are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesSettings {
    /// The directory objects are written to; `None`: files are off.
    pub dir: Option<PathBuf>,
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
            dir: None,
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
        let dir = match self.dir {
            Some(dir) if dir.trim().is_empty() => {
                return Err("files.dir: must name a directory".into());
            }
            Some(dir) => Some(base.join(dir)),
            None => None,
        };
        Ok(FilesSettings {
            dir,
            max_bytes,
            keep: Duration::from_secs(keep_days * 86_400),
            max_per_tenant,
        })
    }
}
