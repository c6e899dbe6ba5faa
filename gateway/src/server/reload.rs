//! Hot reload of the configuration while serving: the config file and the keys file are checked
//! every `auth.reload_interval_ms` and re-read when either changed, and at once on SIGHUP.
//!
//! A new configuration is validated exactly as at startup. One that fails is refused whole: the
//! reason is logged (`config_reload_failed`, target `turnpike::audit`) and the running
//! configuration stays. One that passes replaces the tenant directory (tenants, plans, their
//! limits and keys, from the config and the keys file) in one swap, so a request sees either
//! the old directory or the new one and a request under way finishes on the one it started
//! with. Sections that cannot change under running requests (the listener, `[server]`,
//! `[defaults]`, engines, models, state, idempotency, queues, JWT) are compared and, when they
//! differ, named in a warning: they take effect on restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::config::{Config, ConfigError};
use crate::observability::metrics;
use crate::tenancy::{Directory, Tenancy};

/// Reads the configuration again, the way the server was started.
pub type Loader = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// A config file and how to read it again.
pub struct Source {
    /// The file whose changes trigger a reload.
    pub file: PathBuf,
    /// Reads it (with whatever else the server was started with).
    pub loader: Loader,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// What the watch reads and applies.
pub(super) struct Watch {
    /// The config file, when the server was started from one.
    pub file: Option<PathBuf>,
    /// Reads it.
    pub loader: Loader,
    /// The configuration in force.
    pub current: Config,
    /// Where the directory goes.
    pub tenancy: Arc<Tenancy>,
}

/// Watches until aborted.
pub(super) fn spawn(mut watch: Watch) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut beat = crate::clock::ReloadBeat::new(watch.current.tenancy.reload_interval);
        let mut seen = watch.stamps();
        loop {
            let forced = beat.next().await;
            if watch.stamps() == seen && !forced {
                continue;
            }
            let reason = if forced { "signal" } else { "file_changed" };
            match watch.reload() {
                Ok(()) => metrics::config_reload(true),
                Err(error) => {
                    metrics::config_reload(false);
                    tracing::error!(
                        target: "turnpike::audit",
                        event = "config_reload_failed",
                        trigger = reason,
                        %error,
                        "configuration not reloaded; the running one stays in force"
                    );
                }
            }
            // A reload may have named another keys file.
            seen = watch.stamps();
        }
    })
}

impl Watch {
    /// The config file's and the keys file's modification times.
    fn stamps(&self) -> [Option<SystemTime>; 2] {
        let stamp = |p: Option<&Path>| p.and_then(|p| std::fs::metadata(p).ok()?.modified().ok());
        [
            stamp(self.file.as_deref()),
            stamp(self.current.tenancy.keys_file.as_deref()),
        ]
    }

    /// Reads, validates and applies; the running configuration stays on error.
    fn reload(&mut self) -> Result<(), String> {
        if let Some(file) = &self.file {
            // An empty file (one being rewritten, or emptied by mistake) is never a
            // configuration to serve with: the built-in defaults it would mean drop every
            // tenant.
            let text = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
            if text.iter().all(u8::is_ascii_whitespace) {
                return Err(format!("{}: the file is empty", file.display()));
            }
        }
        let next = (self.loader)().map_err(|e| e.to_string())?;
        let before = fingerprint(&self.tenancy.auth.directory());
        let (tenants, keys) = self.tenancy.install_config(&next.tenancy)?;
        let after = fingerprint(&self.tenancy.auth.directory());
        let restart = needs_restart(&self.current, &next);
        crate::observability::apply(next.metrics, next.logging);
        tracing::info!(
            target: "turnpike::audit",
            event = "config_reloaded",
            tenants,
            keys,
            before = %before,
            after = %after,
            "configuration reloaded: tenant directory replaced"
        );
        if !restart.is_empty() {
            tracing::warn!(
                sections = %restart.join(", "),
                "these settings changed and take effect on restart"
            );
        }
        self.current = next;
        Ok(())
    }
}

/// The sections of `next` that differ from `current` and cannot change while serving.
fn needs_restart(current: &Config, next: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if current.listen != next.listen || current.server != next.server {
        changed.push("server");
    }
    if current.defaults != next.defaults {
        changed.push("defaults");
    }
    if current.engines != next.engines {
        changed.push("engines");
    }
    if current.models != next.models {
        changed.push("models");
    }
    // The tenancy apart from what a reload replaces (the directory, its plans, the keys file).
    let mut fixed = next.tenancy.clone();
    fixed.directory = current.tenancy.directory.clone();
    fixed.plans = current.tenancy.plans.clone();
    fixed.keys_file = current.tenancy.keys_file.clone();
    fixed.allow_empty_directory = current.tenancy.allow_empty_directory;
    if fixed != current.tenancy {
        changed.push("auth/state/idempotency/queue");
    }
    changed
}

/// A short, order-independent hash of a directory (tenants, their limits, key hashes and
/// scopes), for the audit log's before and after.
fn fingerprint(directory: &Directory) -> String {
    let mut tenants: Vec<String> = directory
        .tenants
        .iter()
        .map(|(name, tenant)| format!("{name}={tenant:?}"))
        .collect();
    let mut keys: Vec<String> = directory
        .keys
        .iter()
        .map(|(id, record)| format!("{id}={record:?}"))
        .collect();
    tenants.sort_unstable();
    keys.sort_unstable();
    let mut hasher = Sha256::new();
    for line in tenants.iter().chain(&keys) {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    let digest = hasher.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}
