//! Tallies: counters that only a limit stops, each lapsing at a fixed time (the end of a
//! calendar day or month) or never. Spend budgets charge them: a charge adds one amount to
//! every tally of a request (its tenant's and its key's, per period) only if every one stays
//! within its limit, and a refund takes back what a settled request did not use. Unlike the
//! refilling [`crate::Window`]s, a tally does not drain over time: it starts again from zero
//! when its period ends, because its key names the period.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One counter and its limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tally {
    /// Its key; the period is part of it (`…:d:20261129`), so a new period is a new counter.
    pub key: String,
    /// Most it may hold; `None` counts without a limit.
    pub limit: Option<u64>,
    /// Unix seconds when the counter lapses (`None`: never).
    pub lapses_at: Option<u64>,
}

/// The outcome of a charge to several tallies at once (all or none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// Whether the amount was added to every tally.
    pub allowed: bool,
    /// Each tally's count afterwards (when refused, as it stays), in the order given.
    pub totals: Vec<u64>,
}

impl Charge {
    /// The first tally that would have passed its limit, when refused.
    pub fn refused_by(&self, tallies: &[Tally], amount: u64) -> Option<usize> {
        if self.allowed {
            return None;
        }
        tallies.iter().zip(&self.totals).position(|(t, total)| {
            t.limit
                .is_some_and(|limit| total.saturating_add(amount) > limit)
        })
    }
}

/// Unix seconds now.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The milliseconds until `lapses_at` (at least 1), for Redis' `PEXPIREAT`-free scripts.
pub(crate) fn ttl_ms(lapses_at: Option<u64>) -> u64 {
    lapses_at.map_or(0, |at| {
        Duration::from_secs(at.saturating_sub(now_secs()))
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX)
            .max(1)
    })
}

/// The in-memory tallies. Keys come from the tenant directory and the calendar, never from
/// clients; a lapsed counter is dropped on the next charge, so the map holds at most the live
/// periods of the configured tenants and keys, and at most `max` counters at all (past it a
/// charge with a new key is refused, and counted by the caller as a store failure).
#[derive(Debug, Default)]
pub(crate) struct Tallies {
    counts: HashMap<String, (u64, Option<u64>)>,
}

impl Tallies {
    fn sweep(&mut self, now: u64) {
        self.counts
            .retain(|_, (_, lapses)| lapses.is_none_or(|at| at > now));
    }

    fn count(&self, key: &str, now: u64) -> u64 {
        match self.counts.get(key) {
            Some((count, lapses)) if lapses.is_none_or(|at| at > now) => *count,
            _ => 0,
        }
    }

    /// Adds `amount` to every tally, or to none; `None` when the table is full.
    pub(crate) fn charge(&mut self, tallies: &[Tally], amount: u64, max: usize) -> Option<Charge> {
        let now = now_secs();
        let totals: Vec<u64> = tallies.iter().map(|t| self.count(&t.key, now)).collect();
        let fits = tallies
            .iter()
            .zip(&totals)
            .all(|(t, total)| t.limit.is_none_or(|l| total.saturating_add(amount) <= l));
        if !fits {
            return Some(Charge {
                allowed: false,
                totals,
            });
        }
        let new = tallies
            .iter()
            .filter(|t| !self.counts.contains_key(&t.key))
            .count();
        if self.counts.len() + new > max {
            self.sweep(now);
            if self.counts.len() + new > max {
                return None;
            }
        }
        let totals = tallies
            .iter()
            // A live counter is found by reference; only a new one copies its key.
            .map(|t| match self.counts.get_mut(&t.key) {
                Some(entry) => {
                    if entry.1.is_some_and(|at| at <= now) {
                        *entry = (0, t.lapses_at);
                    }
                    entry.0 = entry.0.saturating_add(amount);
                    entry.0
                }
                None => {
                    self.counts.insert(t.key.clone(), (amount, t.lapses_at));
                    amount
                }
            })
            .collect();
        Some(Charge {
            allowed: true,
            totals,
        })
    }

    /// Takes `amount` back from every tally that still counts (never below zero).
    pub(crate) fn refund(&mut self, tallies: &[Tally], amount: u64) {
        let now = now_secs();
        for t in tallies {
            if let Some((count, lapses)) = self.counts.get_mut(&t.key)
                && lapses.is_none_or(|at| at > now)
            {
                *count = count.saturating_sub(amount);
            }
        }
    }

    /// How many counters are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(key: &str, limit: Option<u64>) -> Tally {
        Tally {
            key: key.into(),
            limit,
            lapses_at: None,
        }
    }

    #[test]
    fn a_charge_is_all_or_nothing_and_refunds_stop_at_zero() {
        let mut t = Tallies::default();
        let both = [tally("day", Some(100)), tally("total", Some(150))];
        assert!(t.charge(&both, 60, 10).unwrap().allowed);
        let refused = t.charge(&both, 60, 10).unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.totals, vec![60, 60]);
        assert_eq!(refused.refused_by(&both, 60), Some(0));
        t.refund(&both, 100);
        assert_eq!(t.charge(&both, 100, 10).unwrap().totals, vec![100, 100]);
        assert_eq!(
            t.charge(&both, 1, 10).unwrap().refused_by(&both, 1),
            Some(0)
        );
    }

    #[test]
    fn a_lapsed_period_starts_from_zero_and_the_table_is_bounded() {
        let mut t = Tallies::default();
        let past = Tally {
            key: "old".into(),
            limit: Some(10),
            lapses_at: Some(1),
        };
        assert!(
            t.charge(std::slice::from_ref(&past), 10, 2)
                .unwrap()
                .allowed
        );
        // Lapsed at once (1970): counts from zero again.
        assert!(
            t.charge(std::slice::from_ref(&past), 10, 2)
                .unwrap()
                .allowed
        );
        assert!(t.charge(&[tally("a", None)], 1, 2).is_some());
        // "old" is swept to make room; a fourth key does not fit.
        assert!(t.charge(&[tally("b", None)], 1, 2).is_some());
        assert!(t.charge(&[tally("c", None)], 1, 2).is_none());
        assert_eq!(t.len(), 2);
    }
}
