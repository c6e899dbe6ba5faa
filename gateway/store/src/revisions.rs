//! Revisioned records and their logs in this process (the in-memory store's half of
//! [`super::Store::commit`]), and raised numbers ([`super::Store::raise`]). The admin API keeps
//! one record, one log and one number, so the maps hold a handful of keys; each log keeps only
//! its newest `keep` entries.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Commit, Revision};

/// Records and logs, behind one lock so a commit is one step.
#[derive(Debug, Default)]
pub struct Revisions {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    records: HashMap<String, Revision>,
    logs: HashMap<String, VecDeque<Vec<u8>>>,
    numbers: HashMap<String, (u64, Instant)>,
}

impl Revisions {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update below is complete before the guard drops; a poisoned lock holds
        // consistent data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The record's revision number (0: none).
    pub fn number(&self, key: &str) -> u64 {
        self.state().records.get(key).map_or(0, |r| r.number)
    }

    /// The record's newest revision.
    pub fn read(&self, key: &str) -> Option<Revision> {
        self.state().records.get(key).cloned()
    }

    /// Commits, if the record is still at the expected revision.
    pub fn commit(&self, commit: Commit<'_>) -> bool {
        let mut state = self.state();
        let current = state.records.get(commit.key).map_or(0, |r| r.number);
        if current != commit.expected {
            return false;
        }
        state.records.insert(
            commit.key.to_string(),
            Revision {
                number: commit.number,
                value: commit.value,
            },
        );
        let log = state.logs.entry(commit.log.to_string()).or_default();
        if commit.restart_log {
            log.clear();
        }
        log.push_back(commit.entry);
        while log.len() > commit.keep.max(1) {
            log.pop_front();
        }
        true
    }

    /// Raises the number `key` to `value` unless it holds more (see [`super::Store::raise`]).
    pub fn raise(&self, key: &str, value: u64, now: Instant, ttl: Duration) -> u64 {
        let mut state = self.state();
        state.numbers.retain(|_, (_, until)| *until > now);
        let current = state.numbers.get(key).map_or(0, |(n, _)| *n);
        if value < current {
            return current;
        }
        state.numbers.insert(key.to_string(), (value, now + ttl));
        value
    }

    /// The log's newest `count` entries, oldest first.
    pub fn tail(&self, log: &str, count: usize) -> Vec<Vec<u8>> {
        let state = self.state();
        let Some(entries) = state.logs.get(log) else {
            return Vec::new();
        };
        entries
            .iter()
            .skip(entries.len().saturating_sub(count))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit<'a>(expected: u64, value: &str, keep: usize) -> Commit<'a> {
        Commit {
            key: "state",
            expected,
            number: expected + 1,
            value: value.as_bytes().to_vec(),
            log: "audit",
            entry: format!("entry {value}").into_bytes(),
            restart_log: false,
            keep,
        }
    }

    #[test]
    fn a_commit_against_a_stale_revision_fails_and_changes_nothing() {
        let r = Revisions::default();
        assert_eq!(r.number("state"), 0);
        assert!(r.commit(commit(0, "a", 10)));
        assert!(r.commit(commit(1, "b", 10)));
        assert!(!r.commit(commit(1, "c", 10)));
        let newest = r.read("state").unwrap();
        assert_eq!((newest.number, newest.value), (2, b"b".to_vec()));
        assert_eq!(
            r.tail("audit", 10),
            vec![b"entry a".to_vec(), b"entry b".to_vec()]
        );
    }

    #[test]
    fn a_restore_jumps_the_revision_and_restarts_the_log() {
        let r = Revisions::default();
        assert!(r.commit(commit(0, "a", 10)));
        let restore = Commit {
            number: 516,
            restart_log: true,
            ..commit(1, "held", 10)
        };
        assert!(r.commit(restore));
        assert_eq!(r.number("state"), 516);
        assert_eq!(r.tail("audit", 10), vec![b"entry held".to_vec()]);
        assert!(r.commit(commit(516, "next", 10)));
        assert_eq!(r.number("state"), 517);
    }

    #[test]
    fn a_number_rises_only_and_expires() {
        let r = Revisions::default();
        let (now, ttl) = (Instant::now(), Duration::from_secs(1));
        assert_eq!(r.raise("claim", 5, now, ttl), 5);
        assert_eq!(r.raise("claim", 3, now, ttl), 5);
        assert_eq!(r.raise("claim", 9, now, ttl), 9);
        assert_eq!(
            r.raise("claim", 4, now + 2 * ttl, ttl),
            4,
            "an expired number counts as 0"
        );
    }

    #[test]
    fn a_log_keeps_its_newest_entries() {
        let r = Revisions::default();
        for (i, v) in ["a", "b", "c"].into_iter().enumerate() {
            assert!(r.commit(commit(i as u64, v, 2)));
        }
        assert_eq!(
            r.tail("audit", 10),
            vec![b"entry b".to_vec(), b"entry c".to_vec()]
        );
        assert_eq!(r.tail("audit", 1), vec![b"entry c".to_vec()]);
        assert!(r.tail("other", 5).is_empty());
    }
}
