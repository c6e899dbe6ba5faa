//! The end of a request as one store step, [`Settlement`]: what its token reservation did not
//! use goes back to its buckets, what its spend hold did not cost goes back to its tallies, and
//! its usage record is written. Each part is optional. On Redis the three are one script, so a
//! request's end costs one round trip however many of them it has; the gateway awaits it only
//! when it carries a record (a response is complete once its record is durable).

use std::sync::Arc;

use crate::{Tally, UsageEntry, Window};

/// Unused reserved tokens going back to a bucket's windows (never above capacity; a bucket
/// that lapsed meanwhile is left alone).
#[derive(Debug, Clone, PartialEq)]
pub struct GiveBack {
    /// The bucket's key.
    pub key: String,
    /// Its windows.
    pub windows: Vec<Window>,
    /// The units going back.
    pub amount: u64,
}

/// An unused spend hold taken back from every tally it was charged to that has not lapsed
/// (never below zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The tallies (shared with the hold that charged them: a caller's tallies are built once
    /// a day, not per request).
    pub tallies: Arc<[Tally]>,
    /// The amount taken back from each.
    pub amount: u64,
}

/// A usage record to write: added to its day's sums and, with `keep_log`, appended to the
/// usage log for export, in one atomic step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record and its sums.
    pub entry: UsageEntry,
    /// Whether the export log keeps it.
    pub keep_log: bool,
}

/// Everything a request gives back and writes when it ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settlement {
    /// Its unused tokens.
    pub give_back: Option<GiveBack>,
    /// Its unused spend.
    pub refund: Option<Refund>,
    /// Its usage record.
    pub record: Option<Record>,
}

impl Settlement {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.give_back.is_none() && self.refund.is_none() && self.record.is_none()
    }
}

impl From<GiveBack> for Settlement {
    fn from(give_back: GiveBack) -> Self {
        Self {
            give_back: Some(give_back),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Store;
    use crate::memory::{MemoryLimits, MemoryStore};

    fn now<T>(f: crate::StoreFuture<'_, T>) -> T {
        futures_util::FutureExt::now_or_never(f)
            .expect("the memory store answers at once")
            .expect("the memory store does not fail")
    }

    #[test]
    fn one_settlement_gives_back_refunds_and_records() {
        let store = MemoryStore::new(MemoryLimits {
            max_records: 10,
            max_bytes: 10_000,
        });
        let windows = vec![Window {
            capacity: 1000,
            period: Duration::from_secs(3600),
        }];
        let tallies = vec![Tally {
            key: "tp:{acme}:sp:t".into(),
            limit: Some(500),
            lapses_at: None,
        }];
        assert!(now(store.take("tp:{acme}:tk", &windows, 800)).allowed);
        assert!(now(store.charge(&tallies, 400)).allowed);
        let settlement = Settlement {
            give_back: Some(GiveBack {
                key: "tp:{acme}:tk".into(),
                windows: windows.clone(),
                amount: 700,
            }),
            refund: Some(Refund {
                tallies: tallies.clone().into(),
                amount: 300,
            }),
            record: Some(Record {
                entry: UsageEntry {
                    record: b"{}".to_vec(),
                    day: "20261130".into(),
                    sums: vec![("acme\t-\tm\trequests".into(), 1)],
                },
                keep_log: true,
            }),
        };
        assert!(!settlement.is_empty());
        now(store.settle(settlement));
        // 900 of the bucket's 1000 are free again: 900 fit, 1000 do not.
        assert!(!now(store.take("tp:{acme}:tk", &windows, 1000)).allowed);
        assert!(now(store.take("tp:{acme}:tk", &windows, 900)).allowed);
        // 100 stay charged: 400 more fit the limit of 500, 401 would not.
        assert!(!now(store.charge(&tallies, 401)).allowed);
        assert!(now(store.charge(&tallies, 400)).allowed);
        assert_eq!(
            now(store.usage_sums("20261130")),
            vec![("acme\t-\tm\trequests".to_string(), 1)]
        );
        assert_eq!(now(store.usage_drain("c", 5)).len(), 1);
        assert!(Settlement::default().is_empty());
    }
}
