//! The admin API's service: tenants, plans, keys and the model map changed while serving,
//! shared by every replica through the state store, with an audit log.
//!
//! # Design
//!
//! The admin state is one document ([`AdminDoc`]): plans, tenants and keys shaped exactly as a
//! keys file holds them, and the model map. It is a third layer over the configuration and the
//! keys file, and [`crate::tenancy::keys_file::compose`] validates it the same way, so an API
//! change is checked by the code that checks a config file.
//!
//! The document lives in the state store as a revisioned record. A change reads the newest
//! revision, edits a copy ([`Change::apply`]), validates the whole copy, and commits it with its
//! audit entry in one atomic step ([`crate::store::Store::commit`]) that fails if another writer
//! committed first (then the change is tried again on the newer revision). A request sees the
//! directory before a change or after it, never part of one: the tenant directory and the model
//! map are swapped whole.
//!
//! Every replica checks the record's revision every `admin.sync_interval_ms` and installs a
//! newer one, so a change reaches every replica sharing the store within that interval plus one
//! store round trip (`bench/run-admin.sh` measures it). A revision a replica cannot validate
//! (its own configuration differs) is refused there, logged and counted; it keeps the last one.

pub mod audit;
pub mod changes;
pub mod error;
pub mod settings;

use std::sync::{Arc, RwLock};

use audit::{AuditEntry, AuditQuery, chain_intact, digest};
pub use changes::{AdminDoc, Applied, Change, KeySpec};
pub use error::AdminError;
pub use settings::AdminSettings;

use crate::engine_host::ModelRegistry;
use crate::observability::metrics;
use crate::store::Commit;
use crate::tenancy::Tenancy;

/// The record holding the admin state.
const STATE_KEY: &str = "tp:admin:state";
/// The audit log.
const AUDIT_KEY: &str = "tp:admin:audit";
/// Tries of a change against a state other replicas keep changing.
const TRIES: usize = 8;

/// Who makes a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// `key:<id>` or `token:<subject>`, with the tenant.
    pub name: String,
    /// The SHA-256 of the client certificate the call came with.
    pub certificate: Option<String>,
}

/// The admin state in force here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Its revision (0: none committed yet).
    pub revision: u64,
    /// The state.
    pub doc: AdminDoc,
}

/// The admin service.
#[derive(Debug)]
pub struct Admin {
    settings: AdminSettings,
    tenancy: Arc<Tenancy>,
    registry: Arc<ModelRegistry>,
    current: RwLock<Arc<Snapshot>>,
    /// One change at a time from this replica (others are ordered by the store's commit).
    writer: tokio::sync::Mutex<()>,
}

/// The directory's names outside the admin state.
struct Outside<'a>(&'a crate::tenancy::Directory, &'a AdminDoc);

impl changes::Elsewhere for Outside<'_> {
    fn tenant(&self, name: &str) -> bool {
        self.0.tenants.contains_key(name) && !self.1.directory.tenants.contains_key(name)
    }
    fn key(&self, id: &str) -> bool {
        self.0.keys.contains_key(id) && !self.1.directory.keys.iter().any(|k| k.id == id)
    }
}

impl Admin {
    /// The service over `tenancy`'s directory and store, and `registry`'s model map.
    pub fn new(
        settings: AdminSettings,
        tenancy: Arc<Tenancy>,
        registry: Arc<ModelRegistry>,
    ) -> Arc<Self> {
        Arc::new(Self {
            settings,
            tenancy,
            registry,
            current: RwLock::default(),
            writer: tokio::sync::Mutex::new(()),
        })
    }

    /// Its settings.
    pub fn settings(&self) -> &AdminSettings {
        &self.settings
    }

    /// The state in force here.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn check(&self, doc: &AdminDoc) -> Result<(), AdminError> {
        self.tenancy
            .check_managed(&doc.directory)
            .map_err(AdminError::Invalid)?;
        self.registry
            .check_map(&doc.models)
            .map_err(AdminError::Invalid)
    }

    fn install(&self, revision: u64, doc: AdminDoc) -> Result<(), String> {
        self.registry.check_map(&doc.models)?;
        self.tenancy
            .install_managed(Arc::new(doc.directory.clone()))?;
        self.registry.set_map(doc.models.clone())?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(Snapshot { revision, doc });
        metrics::admin_revision(revision);
        Ok(())
    }

    /// The newest committed state in the store.
    async fn read(&self) -> Result<Snapshot, AdminError> {
        let Some(found) = self.tenancy.store().read_revision(STATE_KEY).await? else {
            return Ok(Snapshot::default());
        };
        let doc = serde_json::from_slice(&found.value).map_err(|e| {
            AdminError::Internal(format!(
                "admin state revision {} is unreadable: {e}",
                found.number
            ))
        })?;
        Ok(Snapshot {
            revision: found.number,
            doc,
        })
    }

    /// Installs the store's newest revision if it is newer than the one in force; whether it
    /// did.
    pub async fn sync(&self) -> Result<bool, AdminError> {
        let newest = self.tenancy.store().revision(STATE_KEY).await?;
        if newest <= self.snapshot().revision {
            return Ok(false);
        }
        let snapshot = self.read().await?;
        if snapshot.revision <= self.snapshot().revision {
            return Ok(false);
        }
        let revision = snapshot.revision;
        self.install(revision, snapshot.doc)
            .map_err(|e| AdminError::Invalid(format!("admin state revision {revision}: {e}")))?;
        tracing::info!(target: "turnpike::audit", event = "admin_state_installed", revision, "admin state installed from the shared store");
        Ok(true)
    }

    /// Checks the store every `sync_interval` until the task is aborted.
    pub fn spawn_sync(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let admin = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(admin.settings.sync_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing: Option<String> = None;
            loop {
                tick.tick().await;
                match admin.sync().await {
                    Ok(_) => failing = None,
                    Err(e) => {
                        metrics::admin_sync_failed();
                        let text = e.to_string();
                        // Log a failure once, not on every tick.
                        if failing.as_deref() != Some(text.as_str()) {
                            tracing::error!(error = %text, "admin state not synced; the one in force stays");
                            failing = Some(text);
                        }
                    }
                }
            }
        })
    }

    /// Makes `change` as `actor`, against revision `if_match` when given; the new revision and
    /// what the change made.
    pub async fn change(
        &self,
        actor: &Actor,
        change: &Change,
        if_match: Option<u64>,
    ) -> Result<(u64, Applied), AdminError> {
        let action = change.action();
        let result = self.try_change(actor, change, if_match).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(AdminError::Invalid(_)) => "invalid",
            Err(AdminError::NotFound { .. }) => "not_found",
            Err(AdminError::Conflict(_) | AdminError::Contended | AdminError::Stale { .. }) => {
                "conflict"
            }
            Err(AdminError::Forbidden { .. }) => "forbidden",
            Err(AdminError::Store(_) | AdminError::Internal(_)) => "error",
        };
        metrics::admin_change(action, label);
        result
    }

    async fn try_change(
        &self,
        actor: &Actor,
        change: &Change,
        if_match: Option<u64>,
    ) -> Result<(u64, Applied), AdminError> {
        let _one = self.writer.lock().await;
        let store = Arc::clone(self.tenancy.store());
        for _ in 0..TRIES {
            let current = self.read().await?;
            if let Some(expected) = if_match.filter(|e| *e != current.revision) {
                return Err(AdminError::Stale {
                    expected,
                    current: current.revision,
                });
            }
            let mut doc = current.doc.clone();
            let directory = self.tenancy.auth.directory();
            let now = crate::clock::unix_now() as i64;
            let applied = change.apply(&mut doc, now, &Outside(&directory, &current.doc))?;
            self.check(&doc)?;
            let before = serde_json::to_vec(&current.doc)
                .map_err(|e| AdminError::Internal(e.to_string()))?;
            let value =
                serde_json::to_vec(&doc).map_err(|e| AdminError::Internal(e.to_string()))?;
            let previous = store
                .log_tail(AUDIT_KEY, 1)
                .await?
                .first()
                .and_then(|e| serde_json::from_slice::<AuditEntry>(e).ok())
                .map(|e| e.hash)
                .unwrap_or_default();
            let target = match &applied {
                Applied::Key(_, record) => record.id.clone(),
                Applied::State => change.target(),
            };
            let mut entry = AuditEntry {
                revision: current.revision + 1,
                at: crate::tenancy::keys_file::format_time(now),
                actor: actor.name.clone(),
                certificate: actor.certificate.clone(),
                action: change.action().to_string(),
                target,
                before: digest(&before),
                after: digest(&value),
                previous,
                hash: String::new(),
            };
            entry.hash = entry.compute_hash();
            let line =
                serde_json::to_vec(&entry).map_err(|e| AdminError::Internal(e.to_string()))?;
            let committed = store
                .commit(Commit {
                    key: STATE_KEY,
                    expected: current.revision,
                    value,
                    log: AUDIT_KEY,
                    entry: line,
                    keep: self.settings.audit_keep,
                })
                .await?;
            if !committed {
                continue;
            }
            self.record(&entry);
            // The commit stands; if this replica cannot install it, its sync says why.
            if let Err(e) = self.install(entry.revision, doc) {
                tracing::error!(error = %e, revision = entry.revision, "committed admin state not installed here");
            }
            return Ok((entry.revision, applied));
        }
        Err(AdminError::Contended)
    }

    fn record(&self, entry: &AuditEntry) {
        tracing::info!(
            target: "turnpike::audit",
            event = "admin_change",
            revision = entry.revision,
            actor = %entry.actor,
            action = %entry.action,
            target = %entry.target,
            before = %entry.before,
            after = %entry.after,
            "admin change committed"
        );
        if let Some(path) = &self.settings.audit_file
            && let Err(e) = audit::append_to_file(path, entry)
        {
            tracing::error!(error = %e, file = %path.display(), "audit entry not written to the audit file");
        }
    }

    /// The audit entries `query` asks for, oldest first, and whether the chain of the entries
    /// kept is intact.
    pub async fn audit(&self, query: &AuditQuery) -> Result<(Vec<AuditEntry>, bool), AdminError> {
        let raw = self
            .tenancy
            .store()
            .log_tail(AUDIT_KEY, self.settings.audit_keep)
            .await?;
        let entries: Vec<AuditEntry> = raw
            .iter()
            .map(|e| serde_json::from_slice(e))
            .collect::<Result<_, _>>()
            .map_err(|e| AdminError::Internal(format!("an audit entry is unreadable: {e}")))?;
        let intact = chain_intact(&entries);
        let limit = query.limit.unwrap_or(100).clamp(1, 1000);
        let found = entries
            .into_iter()
            .filter(|e| e.matches(query))
            .take(limit)
            .collect();
        Ok((found, intact))
    }
}
