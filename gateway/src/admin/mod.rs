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
//!
//! A store that goes back (Redis restarted empty, or from an older snapshot: its revision is
//! below the one a replica holds) is never committed on: the replica that sees it says so
//! (an error log, `turnpike_admin_state_regressed`, `/ready`'s body) and puts the newest state
//! it holds back ([`restore`]), at the revision after its own, so every replica converges on
//! it and nothing made through the API is lost. A replica keeps its state on disk too
//! (`admin.state_file`), so this holds when every replica restarted with the store.
//!
//! The audit log is a keyed chain anchored in the record ([`audit`]).

pub mod audit;
pub mod changes;
pub mod error;
pub mod record;
mod restore;
pub mod settings;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use audit::{Anchor, AuditEntry, AuditQuery, ChainBreak, check_chain, digest};
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

/// The admin state in force here (and, as it is, in `admin.state_file`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Its revision (0: none committed yet).
    pub revision: u64,
    /// The state.
    pub doc: AdminDoc,
    /// The audit chain's newest entry when this revision was made.
    #[serde(default)]
    pub audit: Option<Anchor>,
}

/// What an audit read found.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRead {
    /// The entries asked for, oldest first.
    pub entries: Vec<AuditEntry>,
    /// Where the chain of the entries kept breaks (none: intact).
    pub breaks: Vec<ChainBreak>,
    /// The record's revision the chain was checked against.
    pub revision: u64,
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
    /// The store was seen behind the state held here and is not restored yet.
    regressed: AtomicBool,
    /// One recovery at a time (see [`restore`]).
    restoring: tokio::sync::Mutex<()>,
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
            regressed: AtomicBool::new(false),
            restoring: tokio::sync::Mutex::new(()),
        })
    }

    /// Installs the state this replica kept on disk (`admin.state_file`), if any: the store
    /// may have lost it while every replica was down. One that no longer validates here is
    /// logged and left.
    pub fn load_state_file(&self) {
        let Some(path) = &self.settings.state_file else {
            return;
        };
        match record::load(path) {
            Ok(None) => {}
            Ok(Some(kept)) => match self.install(kept) {
                Ok(()) => {
                    let revision = self.snapshot().revision;
                    tracing::info!(revision, file = %path.display(), "admin state read from the state file")
                }
                Err(e) => {
                    tracing::error!(error = %e, file = %path.display(), "the admin state file does not validate here; not used")
                }
            },
            Err(e) => tracing::error!(error = %e, "the admin state file cannot be read; not used"),
        }
    }

    /// Whether the store was seen behind the state held here and is not restored yet.
    pub fn is_regressed(&self) -> bool {
        self.regressed.load(Ordering::Relaxed)
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

    fn install(&self, snapshot: Snapshot) -> Result<(), String> {
        let doc = &snapshot.doc;
        self.registry.check_map(&doc.models)?;
        self.tenancy
            .install_managed(Arc::new(doc.directory.clone()))?;
        self.registry.set_map(doc.models.clone())?;
        let revision = snapshot.revision;
        if let Some(path) = &self.settings.state_file
            && let Err(e) = record::save(path, &snapshot)
        {
            tracing::error!(error = %e, file = %path.display(), revision, "admin state not written to the state file");
        }
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(snapshot);
        metrics::admin_revision(revision);
        Ok(())
    }

    /// Installs a newer revision read from the store.
    fn adopt(&self, snapshot: Snapshot) -> Result<(), AdminError> {
        let revision = snapshot.revision;
        self.install(snapshot)
            .map_err(|e| AdminError::Invalid(format!("admin state revision {revision}: {e}")))?;
        tracing::info!(target: "turnpike::audit", event = "admin_state_installed", revision, "admin state installed from the shared store");
        Ok(())
    }

    /// The newest committed state in the store.
    async fn read(&self) -> Result<Snapshot, AdminError> {
        let Some(found) = self.tenancy.store().read_revision(STATE_KEY).await? else {
            return Ok(Snapshot::default());
        };
        record::decode(found.number, &found.value).map_err(|e| {
            AdminError::Internal(format!(
                "admin state revision {} is unreadable: {e}",
                found.number
            ))
        })
    }

    /// Installs the store's newest revision if it is newer than the one in force, or puts the
    /// state held here back if the store went behind it; whether the state changed.
    pub async fn sync(&self) -> Result<bool, AdminError> {
        let newest = self.tenancy.store().revision(STATE_KEY).await?;
        let held = self.snapshot().revision;
        if newest < held {
            self.recover().await?;
            return Ok(true);
        }
        if newest == held {
            return Ok(false);
        }
        let snapshot = self.read().await?;
        if snapshot.revision <= self.snapshot().revision {
            return Ok(false);
        }
        self.adopt(snapshot)?;
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
            Err(AdminError::Restoring { .. }) => "restoring",
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
        for _ in 0..TRIES {
            let current = self.read().await?;
            if current.revision < self.snapshot().revision {
                // Never commit on a store that went back: wait until the newest state is back
                // in it, then make the change on that.
                self.recover().await?;
                continue;
            }
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
            let target = match &applied {
                Applied::Key(_, record) => record.id.clone(),
                Applied::State => change.target(),
            };
            let previous = self.previous_hash(&current).await?;
            let entry = self.entry(
                &current,
                &doc,
                current.revision + 1,
                previous,
                (actor, change.action(), target),
            )?;
            let next = Snapshot {
                revision: entry.revision,
                doc,
                audit: Some(Anchor::of(&entry)),
            };
            let committed = self.commit(current.revision, &entry, &next, false).await?;
            if !committed {
                continue;
            }
            self.record(&entry);
            // The commit stands; if this replica cannot install it, its sync says why.
            if let Err(e) = self.install(next) {
                tracing::error!(error = %e, revision = entry.revision, "committed admin state not installed here");
            }
            return Ok((entry.revision, applied));
        }
        Err(AdminError::Contended)
    }

    /// Commits `next` against the store's `expected` revision, with its audit `entry`
    /// appended to the log (or starting it again, `restart_log`), in one step; whether it
    /// committed.
    async fn commit(
        &self,
        expected: u64,
        entry: &AuditEntry,
        next: &Snapshot,
        restart_log: bool,
    ) -> Result<bool, AdminError> {
        let internal = |e: serde_json::Error| AdminError::Internal(e.to_string());
        let commit = Commit {
            key: STATE_KEY,
            expected,
            number: next.revision,
            value: record::encode(next).map_err(internal)?,
            log: AUDIT_KEY,
            entry: serde_json::to_vec(entry).map_err(internal)?,
            restart_log,
            keep: self.settings.audit_keep,
        };
        Ok(self.tenancy.store().commit(commit).await?)
    }

    /// The MAC the next entry after `current` names: the record's anchor, or for a record
    /// written before it had one, the log's newest entry.
    async fn previous_hash(&self, current: &Snapshot) -> Result<String, AdminError> {
        if let Some(anchor) = &current.audit {
            return Ok(anchor.hash.clone());
        }
        Ok(self
            .tenancy
            .store()
            .log_tail(AUDIT_KEY, 1)
            .await?
            .first()
            .and_then(|e| serde_json::from_slice::<AuditEntry>(e).ok())
            .map(|e| e.hash)
            .unwrap_or_default())
    }

    /// The signed audit entry of a change from `current` to `doc`, made revision `revision`.
    fn entry(
        &self,
        current: &Snapshot,
        doc: &AdminDoc,
        revision: u64,
        previous: String,
        (actor, action, target): (&Actor, &str, String),
    ) -> Result<AuditEntry, AdminError> {
        let json =
            |d: &AdminDoc| serde_json::to_vec(d).map_err(|e| AdminError::Internal(e.to_string()));
        let now = crate::clock::unix_now() as i64;
        let mut entry = AuditEntry {
            revision,
            at: crate::tenancy::keys_file::format_time(now),
            actor: actor.name.clone(),
            certificate: actor.certificate.clone(),
            action: action.to_string(),
            target,
            before: digest(&json(&current.doc)?),
            after: digest(&json(doc)?),
            previous,
            key_id: String::new(),
            hash: String::new(),
        };
        self.settings.audit_keys.sign(&mut entry);
        Ok(entry)
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

    /// The audit entries `query` asks for, oldest first, and where the chain of the entries
    /// kept breaks (an entry that cannot be read is such a break, not a failure).
    pub async fn audit(&self, query: &AuditQuery) -> Result<AuditRead, AdminError> {
        let store = self.tenancy.store();
        // The record and the log are read apart: read again if a change landed between.
        let mut tries = 0;
        let (raw, record) = loop {
            let before = self.read().await?;
            let raw = store.log_tail(AUDIT_KEY, self.settings.audit_keep).await?;
            let after = store.revision(STATE_KEY).await?;
            tries += 1;
            if after == before.revision || tries == 3 {
                break (raw, before);
            }
        };
        let (entries, breaks) = check_chain(&raw, &self.settings.audit_keys, record.audit.as_ref());
        let limit = query.limit.unwrap_or(100).clamp(1, 1000);
        let entries = entries
            .into_iter()
            .filter(|e| e.matches(query))
            .take(limit)
            .collect();
        Ok(AuditRead {
            entries,
            breaks,
            revision: record.revision,
        })
    }
}
