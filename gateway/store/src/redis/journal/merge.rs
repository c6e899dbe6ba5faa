//! A journal batch merged into as few settlements as it takes: the ends of many requests of
//! the same tenants touch the same few buckets, tallies and sums, so one give-back per bucket,
//! one refund per tally and one sum per name do in one step what the requests did one by one.
//!
//! The same result, because within one script call the clock stands still: giving back `a`
//! then `b` to a bucket is `min(cap, level + a + b)` either way (capping `level + a` first
//! changes nothing, since `b` only adds), and refunding `a` then `b` from a tally is
//! `max(0, count - a - b)` either way. Sums only add. Records the export log keeps are
//! appended each in order.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{GiveBack, Record, Refund, Settlement, Tally, UsageEntry, Window};

/// `batch` as merged settlements.
pub(crate) fn merge(batch: Vec<Settlement>) -> Vec<Settlement> {
    let mut give_backs: HashMap<(String, Vec<Window>), u64> = HashMap::new();
    let mut refunds: HashMap<String, u64> = HashMap::new();
    let mut days: HashMap<String, HashMap<String, u64>> = HashMap::new();
    let mut out = Vec::new();
    for s in batch {
        if let Some(g) = s.give_back {
            *give_backs.entry((g.key, g.windows)).or_default() += g.amount;
        }
        if let Some(r) = s.refund {
            for t in r.tallies.iter() {
                *refunds.entry(t.key.clone()).or_default() += r.amount;
            }
        }
        if let Some(r) = s.record {
            let sums = days.entry(r.entry.day.clone()).or_default();
            for (name, amount) in r.entry.sums {
                *sums.entry(name).or_default() += amount;
            }
            if r.keep_log {
                let entry = UsageEntry {
                    sums: Vec::new(),
                    ..r.entry
                };
                out.push(recorded(entry, true));
            }
        }
    }
    out.extend(give_backs.into_iter().map(|((key, windows), amount)| {
        let give_back = GiveBack {
            key,
            windows,
            amount,
        };
        Settlement::from(give_back)
    }));
    out.extend(refunds.into_iter().map(|(key, amount)| {
        let tallies = Arc::from([Tally {
            key,
            limit: None,
            lapses_at: None,
        }]);
        Settlement {
            refund: Some(Refund { tallies, amount }),
            ..Settlement::default()
        }
    }));
    out.extend(days.into_iter().map(|(day, sums)| {
        let entry = UsageEntry {
            record: Vec::new(),
            day,
            sums: sums.into_iter().collect(),
        };
        recorded(entry, false)
    }));
    out
}

fn recorded(entry: UsageEntry, keep_log: bool) -> Settlement {
    Settlement {
        record: Some(Record { entry, keep_log }),
        ..Settlement::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn end(n: u64, logged: bool) -> Settlement {
        Settlement {
            give_back: Some(GiveBack {
                key: "tp:{a}:tk".into(),
                windows: vec![Window {
                    capacity: 100,
                    period: Duration::from_secs(60),
                }],
                amount: n,
            }),
            refund: Some(Refund {
                tallies: Arc::from([Tally {
                    key: "tp:{a}:sp:t".into(),
                    limit: Some(9),
                    lapses_at: None,
                }]),
                amount: 2 * n,
            }),
            record: Some(Record {
                entry: UsageEntry {
                    record: format!("{n}").into_bytes(),
                    day: "20261130".into(),
                    sums: vec![("a\t-\tm\trequests".into(), 1)],
                },
                keep_log: logged,
            }),
        }
    }

    #[test]
    fn one_step_per_bucket_tally_and_day_and_each_logged_record_in_order() {
        let merged = merge(vec![end(1, true), end(2, false), end(3, true)]);
        let logged: Vec<_> = merged
            .iter()
            .filter_map(|s| s.record.as_ref().filter(|r| r.keep_log))
            .map(|r| r.entry.record.clone())
            .collect();
        assert_eq!(logged, [b"1".to_vec(), b"3".to_vec()]);
        let give_backs: Vec<_> = merged.iter().filter_map(|s| s.give_back.as_ref()).collect();
        assert_eq!(give_backs.len(), 1);
        assert_eq!(give_backs[0].amount, 6);
        let refunds: Vec<_> = merged.iter().filter_map(|s| s.refund.as_ref()).collect();
        assert_eq!((refunds.len(), refunds[0].amount), (1, 12));
        let sums: Vec<_> = merged
            .iter()
            .filter_map(|s| s.record.as_ref().filter(|r| !r.keep_log))
            .collect();
        assert_eq!(sums.len(), 1);
        assert_eq!(
            sums[0].entry.sums,
            vec![("a\t-\tm\trequests".to_string(), 3)]
        );
    }
}
