//! Putting the admin state back into a store that went behind it.
//!
//! A replica holds revision R. When the store's record is at S < R (missing: S = 0), the store
//! lost changes every replica already serves, and no replica commits on it. Each replica that
//! sees it raises a claim in the store to the revision it holds ([`crate::store::Store::raise`]:
//! the claim only rises) and waits a few sync intervals, time for every replica to see it
//! too. The one whose revision is the claim then commits the state it holds as revision R + 1
//! against S, with a `state.restore` audit entry that follows its own newest entry and starts
//! the store's log again (the entries the store kept belong to the history it went back to).
//! The others, holding less, wait for it and install it, so the newest state wins and a
//! replica that held an older one cannot put it back over the newer. A change asked of a
//! replica meanwhile waits for the restore, then applies on the restored state. Changes
//! committed on the emptied store before any replica noticed (only a replica that held nothing
//! could make them) are named in the error log, entry by entry, as they are replaced.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::audit::{Anchor, AuditEntry};
use super::{AUDIT_KEY, Actor, Admin, AdminError, Snapshot};
use crate::observability::metrics;

/// The claim: the newest revision a replica that saw the store behind it holds.
const CLAIM_KEY: &str = "tp:admin:restore_claim";

impl Admin {
    /// Returns once the store is at or past the revision held here: restored from here when
    /// this replica holds the newest state, or installed from the replica that does. Fails
    /// when neither happens in time (503: the caller retries).
    pub(super) async fn recover(&self) -> Result<(), AdminError> {
        let _one = self.restoring.lock().await;
        let interval = self.settings.sync_interval;
        let settle = interval * 3;
        let ttl = (interval * 10).max(Duration::from_secs(2));
        let deadline = Instant::now() + (interval * 30).max(Duration::from_secs(5));
        let store = Arc::clone(self.tenancy.store());
        let mut newest_since: Option<Instant> = None;
        loop {
            let current = self.read().await?;
            let held = self.snapshot();
            if current.revision >= held.revision {
                if current.revision > held.revision {
                    self.adopt(current)?;
                }
                self.regression_over();
                return Ok(());
            }
            self.regression_seen(&current, &held);
            let claimed = store.raise(CLAIM_KEY, held.revision, ttl).await?;
            if claimed > held.revision {
                // Another replica holds a newer state: it puts that back.
                newest_since = None;
            } else {
                let since = *newest_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= settle && self.restore_from(&current, &held).await? {
                    self.regression_over();
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(AdminError::Restoring {
                    store: current.revision,
                    held: held.revision,
                });
            }
            tokio::time::sleep(interval).await;
        }
    }

    fn regression_seen(&self, current: &Snapshot, held: &Snapshot) {
        if !self.regressed.swap(true, Ordering::Relaxed) {
            metrics::admin_state_regressed(true);
            tracing::error!(
                target: "turnpike::audit",
                event = "admin_store_regressed",
                store_revision = current.revision,
                held_revision = held.revision,
                "the state store went back behind the admin state this replica holds; no change is committed on it until the newest state is back"
            );
        }
    }

    fn regression_over(&self) {
        if self.regressed.swap(false, Ordering::Relaxed) {
            metrics::admin_state_regressed(false);
            tracing::warn!(
                target: "turnpike::audit",
                event = "admin_store_recovered",
                revision = self.snapshot().revision,
                "the state store holds the newest admin state again"
            );
        }
    }

    /// Commits the state `held` here over the store's `current`; whether it committed.
    async fn restore_from(&self, current: &Snapshot, held: &Snapshot) -> Result<bool, AdminError> {
        self.name_replaced(current).await;
        let actor = Actor {
            name: "replica".into(),
            certificate: None,
        };
        let previous = held
            .audit
            .as_ref()
            .map(|a| a.hash.clone())
            .unwrap_or_default();
        let revision = held.revision + 1;
        let target = format!("revision {} over {}", held.revision, current.revision);
        let entry = self.entry(
            current,
            &held.doc,
            revision,
            previous,
            (&actor, "state.restore", target),
        )?;
        let next = Snapshot {
            revision,
            doc: held.doc.clone(),
            audit: Some(Anchor::of(&entry)),
        };
        let committed = self.commit(current.revision, &entry, &next, true).await?;
        if !committed {
            // Another writer moved the store on; the caller looks again.
            return Ok(false);
        }
        self.record(&entry);
        if let Err(e) = self.install(next) {
            tracing::error!(error = %e, revision, "restored admin state not installed here");
        }
        metrics::admin_state_restored();
        tracing::warn!(
            target: "turnpike::audit",
            event = "admin_store_restored",
            revision,
            "the admin state this replica held is back in the state store"
        );
        Ok(true)
    }

    /// Logs the entries of the changes the store holds past where it went back, which the
    /// restore replaces.
    async fn name_replaced(&self, current: &Snapshot) {
        if current.revision == 0 {
            return;
        }
        let count = usize::try_from(current.revision).unwrap_or(usize::MAX);
        let raw = match self.tenancy.store().log_tail(AUDIT_KEY, count).await {
            Ok(raw) => raw,
            Err(e) => {
                tracing::error!(error = %e, "the changes the restore replaces could not be read");
                return;
            }
        };
        for bytes in raw {
            let shown = serde_json::from_slice::<AuditEntry>(&bytes).map_or_else(
                |_| String::from_utf8_lossy(&bytes).into_owned(),
                |e| {
                    format!(
                        "revision {} {} {} by {} at {}",
                        e.revision, e.action, e.target, e.actor, e.at
                    )
                },
            );
            tracing::error!(
                target: "turnpike::audit",
                event = "admin_change_replaced",
                change = %shown,
                "a change made on the emptied state store is replaced by the restore"
            );
        }
    }
}
