//! `[batches]` as written and validated.
//!
//! ```toml
//! [batches]
//! concurrency = 16           # lines one replica runs at once, across all batches
//! chunk_lines = 16           # lines a replica claims at a time
//! max_lines = 50000          # most lines in one batch
//! max_open_per_tenant = 100  # most batches a tenant has open at once
//! ```

use serde::Deserialize;

/// `[batches]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatches {
    #[serde(default)]
    concurrency: Option<usize>,
    #[serde(default)]
    chunk_lines: Option<usize>,
    #[serde(default)]
    max_lines: Option<u64>,
    #[serde(default)]
    max_open_per_tenant: Option<usize>,
}

/// How batches run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// Lines one replica runs at once, across all batches.
    pub concurrency: usize,
    /// Lines a replica claims at a time (a chunk): the work a replica that dies leaves for
    /// another to run again.
    pub chunk_lines: usize,
    /// Most lines in one batch.
    pub max_lines: u64,
    /// Most batches a tenant has open at once.
    pub max_open_per_tenant: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            chunk_lines: 16,
            max_lines: 50_000,
            max_open_per_tenant: 100,
        }
    }
}

fn within<T: PartialOrd + std::fmt::Display + Copy>(
    name: &str,
    value: Option<T>,
    default: T,
    low: T,
    high: T,
) -> Result<T, String> {
    let value = value.unwrap_or(default);
    if value < low || value > high {
        return Err(format!("batches.{name}: must be from {low} to {high}"));
    }
    Ok(value)
}

impl RawBatches {
    /// Validates.
    pub fn validate(self) -> Result<BatchSettings, String> {
        let d = BatchSettings::default();
        Ok(BatchSettings {
            concurrency: within("concurrency", self.concurrency, d.concurrency, 1, 4096)?,
            chunk_lines: within("chunk_lines", self.chunk_lines, d.chunk_lines, 1, 4096)?,
            max_lines: within("max_lines", self.max_lines, d.max_lines, 1, 1_000_000)?,
            max_open_per_tenant: within(
                "max_open_per_tenant",
                self.max_open_per_tenant,
                d.max_open_per_tenant,
                1,
                100_000,
            )?,
        })
    }
}
