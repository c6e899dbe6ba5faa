//! Waiting queue ordering: priority levels, then weighted fair queuing between tenants.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::SeqId;

/// Fixed-point scale of virtual times (one token at weight 1 adds `SCALE`).
const SCALE: u128 = 1 << 32;

/// Most idle tenants whose virtual time is remembered (those ahead of every active tenant).
const IDLE_CAP: usize = 1024;

/// Waiting sequences of one priority level: tenant -> (arrival, id).
type Level = BTreeMap<String, BTreeSet<(u64, SeqId)>>;

/// State of a tenant with at least one sequence.
#[derive(Debug, Clone)]
struct Tenant {
    vt: u128,
    seqs: usize,
}

/// Tenant virtual times and the waiting queue.
///
/// Active tenants (with a waiting or running sequence) have a virtual time that grows by
/// `tokens / weight` for every planned chunk. A tenant that becomes active starts at
/// `max(its own vt, min vt of the active tenants)`, so idling banks no credit; when no tenant is
/// active, the last minimum (the system virtual time, `floor`) stands in for it. Tenants without
/// sequences are dropped; the vt of a dropped tenant is remembered only while it is ahead of the
/// system virtual time (otherwise the `max` ignores it), and at most [`IDLE_CAP`] of them.
#[derive(Debug, Clone, Default)]
pub(super) struct Fair {
    tenants: BTreeMap<String, Tenant>,
    idle: BTreeMap<String, u128>,
    /// Minimum vt of the active tenants when it was last computed; never decreases.
    floor: u128,
    /// Priority (highest first) -> tenant -> (arrival, id).
    waiting: BTreeMap<Reverse<i32>, Level>,
    waiting_len: usize,
}

impl Fair {
    fn min_active_vt(&self) -> Option<u128> {
        self.tenants.values().map(|t| t.vt).min()
    }

    /// A sequence of `tenant` appeared (added or forked).
    pub(super) fn activate(&mut self, tenant: &str) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.seqs += 1;
            return;
        }
        let own = self.idle.remove(tenant).unwrap_or(0);
        let min = self.min_active_vt().unwrap_or(0).max(self.floor);
        self.floor = min;
        self.idle.retain(|_, vt| *vt > min);
        let vt = own.max(min);
        self.tenants
            .insert(tenant.to_owned(), Tenant { vt, seqs: 1 });
    }

    /// A sequence of `tenant` is gone (finished or cancelled).
    pub(super) fn deactivate(&mut self, tenant: &str) {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return;
        };
        t.seqs = t.seqs.saturating_sub(1);
        if t.seqs > 0 {
            return;
        }
        let vt = t.vt;
        self.tenants.remove(tenant);
        self.floor = self.floor.max(self.min_active_vt().unwrap_or(vt));
        if vt > self.floor {
            if self.idle.len() >= IDLE_CAP {
                let lowest = self
                    .idle
                    .iter()
                    .min_by_key(|(_, v)| **v)
                    .map(|(k, _)| k.clone());
                if let Some(lowest) = lowest {
                    self.idle.remove(&lowest);
                }
            }
            self.idle.insert(tenant.to_owned(), vt);
        }
    }

    /// Virtual time of an active tenant (0 for an unknown one).
    pub(super) fn vt(&self, tenant: &str) -> u128 {
        self.tenants.get(tenant).map_or(0, |t| t.vt)
    }

    /// `tokens` were planned for a sequence of `tenant` with `weight`.
    pub(super) fn charge(&mut self, tenant: &str, tokens: usize, weight: u32) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            let cost = tokens as u128 * SCALE / u128::from(weight.max(1));
            t.vt = t.vt.saturating_add(cost);
        }
    }

    /// Number of waiting sequences.
    pub(super) fn waiting_len(&self) -> usize {
        self.waiting_len
    }

    /// Queues `id`.
    pub(super) fn push_waiting(&mut self, priority: i32, tenant: &str, arrival: u64, id: SeqId) {
        let inserted = self
            .waiting
            .entry(Reverse(priority))
            .or_default()
            .entry(tenant.to_owned())
            .or_default()
            .insert((arrival, id));
        if inserted {
            self.waiting_len += 1;
        }
    }

    /// Takes `id` out of the waiting queue; false when it was not there.
    pub(super) fn remove_waiting(
        &mut self,
        priority: i32,
        tenant: &str,
        arrival: u64,
        id: SeqId,
    ) -> bool {
        let Some(level) = self.waiting.get_mut(&Reverse(priority)) else {
            return false;
        };
        let Some(queue) = level.get_mut(tenant) else {
            return false;
        };
        let removed = queue.remove(&(arrival, id));
        if queue.is_empty() {
            level.remove(tenant);
        }
        if level.is_empty() {
            self.waiting.remove(&Reverse(priority));
        }
        if removed {
            self.waiting_len -= 1;
        }
        removed
    }

    /// The highest priority among waiting sequences.
    pub(super) fn highest_waiting_priority(&self) -> Option<i32> {
        self.waiting.keys().next().map(|Reverse(p)| *p)
    }

    /// The waiting sequence to admit next: highest priority, then the tenant with the lowest
    /// virtual time (ties: earliest head arrival), then arrival order within the tenant.
    pub(super) fn next_waiting(&self) -> Option<SeqId> {
        let (_, level) = self.waiting.iter().next()?;
        level
            .iter()
            .filter_map(|(tenant, queue)| {
                let &(arrival, id) = queue.first()?;
                Some((self.vt(tenant), arrival, id))
            })
            .min()
            .map(|(_, _, id)| id)
    }

    /// Number of tenants with state (active plus remembered idle ones).
    #[cfg(test)]
    pub(super) fn tenant_states(&self) -> usize {
        self.tenants.len() + self.idle.len()
    }
}
