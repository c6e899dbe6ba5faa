//! Usage records: one per finished request, appended to a log and added to its day's sums in
//! one atomic step, so the sums always equal the records. The log is read back once for export
//! ([`Store::usage_drain`](crate::Store::usage_drain), then acknowledged), the sums by day for
//! reports. On Redis the log is a stream (its consumer group lets any replica export what a
//! killed one had read but not acknowledged); in memory, a bounded queue.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// One record and what it adds to its day's sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEntry {
    /// The record (a JSON line; empty when the log does not keep it).
    pub record: Vec<u8>,
    /// Its day, `YYYYMMDD` (UTC).
    pub day: String,
    /// Sum name → amount (tenant, key, model and metric in the name).
    pub sums: Vec<(String, u64)>,
}

/// Records taken for export: (id, record), to acknowledge once written.
pub type Drained = Vec<(String, Vec<u8>)>;

/// How long a day's sums are kept (a little over a year).
pub const KEEP_DAYS: u64 = 400;

/// Most records the log holds before the oldest unexported ones are dropped (counted).
pub const MAX_LOG: usize = 1_000_000;

/// The in-memory usage log and sums.
#[derive(Debug, Default)]
pub(crate) struct MemoryUsage {
    days: BTreeMap<String, HashMap<String, u64>>,
    log: VecDeque<(u64, Vec<u8>)>,
    next_id: u64,
    /// Records handed out for export and not yet acknowledged.
    taken: BTreeMap<u64, Vec<u8>>,
}

impl MemoryUsage {
    pub(crate) fn record(&mut self, entry: UsageEntry, keep_log: bool) {
        let day = self.days.entry(entry.day).or_default();
        for (name, amount) in entry.sums {
            *day.entry(name).or_default() += amount;
        }
        while self.days.len() > KEEP_DAYS as usize {
            self.days.pop_first();
        }
        if keep_log {
            let full = self.log.len() + self.taken.len() >= MAX_LOG;
            if full {
                self.log.pop_front();
            }
            self.next_id += 1;
            self.log.push_back((self.next_id, entry.record));
            crate::gauges::usage_log(self.log.len() + self.taken.len(), full);
        }
    }

    pub(crate) fn sums(&self, day: &str) -> Vec<(String, u64)> {
        self.days
            .get(day)
            .map(|sums| sums.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    pub(crate) fn drain(&mut self, count: usize) -> Drained {
        let mut out: Drained = self
            .taken
            .iter()
            .take(count)
            .map(|(id, r)| (id.to_string(), r.clone()))
            .collect();
        while out.len() < count {
            let Some((id, record)) = self.log.pop_front() else {
                break;
            };
            out.push((id.to_string(), record.clone()));
            self.taken.insert(id, record);
        }
        out
    }

    pub(crate) fn ack(&mut self, ids: &[String]) {
        for id in ids {
            if let Ok(id) = id.parse() {
                self.taken.remove(&id);
            }
        }
        crate::gauges::usage_log(self.log.len() + self.taken.len(), false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> UsageEntry {
        UsageEntry {
            record: n.to_string().into_bytes(),
            day: "20261129".into(),
            sums: vec![
                ("acme\tk\tm\trequests".into(), 1),
                ("acme\tk\tm\tinput".into(), n),
            ],
        }
    }

    #[test]
    fn sums_follow_records_and_an_unacknowledged_export_comes_back() {
        let mut u = MemoryUsage::default();
        for n in 1..=3 {
            u.record(entry(n), true);
        }
        let mut sums = u.sums("20261129");
        sums.sort();
        assert_eq!(sums[0], ("acme\tk\tm\tinput".into(), 6));
        assert_eq!(sums[1], ("acme\tk\tm\trequests".into(), 3));
        let first = u.drain(2);
        assert_eq!(first.len(), 2);
        // Not acknowledged: handed out again, then the rest.
        let again = u.drain(3);
        assert_eq!(again.len(), 3);
        u.ack(&again.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>());
        assert!(u.drain(3).is_empty());
    }
}
