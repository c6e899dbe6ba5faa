//! The in-memory store: one process, no dependencies. Request rates go through `governor`'s
//! GCRA limiters; token budgets are token buckets that can give back unused reservations.
//!
//! Every map is bounded: buckets and leases by the configured tenants (keys come from the
//! tenant directory, never from clients), idempotency records and stored values each by a count
//! and a byte budget, oldest evicted first.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::revisions::Revisions;
use super::tally::{Charge, Tallies, Tally};
use super::usage::{Drained, MemoryUsage};
use super::values::{Values, footprint};
use super::{
    Begin, Commit, Level, Revision, Settlement, Store, StoreError, StoreFuture, Take, Window,
    level_of, refill, time_to,
};
use crate::gauges as metrics;

type Gcra = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// Limits of the in-memory idempotency table and of the stored values, each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most records kept.
    pub max_records: usize,
    /// Most bytes kept, counted as the memory an entry takes ([`footprint`]): its value, its
    /// key (held twice: by the map and the eviction queue) and the bookkeeping around them.
    pub max_bytes: usize,
}

#[derive(Debug)]
enum Record {
    Running { owner: String, until: Instant },
    Done { body: Vec<u8>, until: Instant },
}

#[derive(Debug)]
struct Entry {
    fingerprint: String,
    record: Record,
}

#[derive(Debug, Default)]
struct Records {
    entries: HashMap<String, Entry>,
    /// Keys in insertion order, for eviction (may hold keys already removed).
    order: VecDeque<String>,
    bytes: usize,
}

/// State in this process only.
#[derive(Debug)]
pub struct MemoryStore {
    limits: MemoryLimits,
    clock: DefaultClock,
    gcras: Mutex<HashMap<(String, Window), Arc<Gcra>>>,
    buckets: Mutex<HashMap<(String, Window), (f64, Instant)>>,
    leases: Mutex<HashMap<String, HashMap<String, Instant>>>,
    records: Mutex<Records>,
    values: Mutex<Values>,
    revisions: Revisions,
    tallies: Mutex<Tallies>,
    usage: Mutex<MemoryUsage>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (every update is one
    // assignment), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl MemoryStore {
    /// An empty store.
    pub fn new(limits: MemoryLimits) -> Self {
        Self {
            limits,
            clock: DefaultClock::default(),
            gcras: Mutex::default(),
            buckets: Mutex::default(),
            leases: Mutex::default(),
            records: Mutex::default(),
            values: Mutex::default(),
            revisions: Revisions::default(),
            tallies: Mutex::default(),
            usage: Mutex::default(),
        }
    }

    fn gcra(&self, key: &str, window: Window) -> Option<Arc<Gcra>> {
        let burst = NonZeroU32::new(u32::try_from(window.capacity).unwrap_or(u32::MAX))?;
        let mut map = lock(&self.gcras);
        let gcra = map.entry((key.to_string(), window)).or_insert_with(|| {
            let quota = Quota::with_period(window.period / burst.get())
                .unwrap_or_else(|| Quota::per_second(burst))
                .allow_burst(burst);
            Arc::new(RateLimiter::direct_with_clock(quota, self.clock.clone()).with_middleware())
        });
        Some(Arc::clone(gcra))
    }

    /// One request against every window, shortest first. GCRA cannot give back, so a window
    /// refusing after shorter ones allowed leaves those charged; refusals come from the
    /// shortest windows in practice, whose units return within their period.
    fn hit_now(&self, key: &str, windows: &[Window]) -> Take {
        let mut order: Vec<usize> = (0..windows.len()).collect();
        order.sort_by_key(|&i| windows[i].period);
        let mut levels: Vec<Option<Level>> = vec![None; windows.len()];
        for i in order {
            let window = windows[i];
            let Some(gcra) = self.gcra(key, window) else {
                return refused(windows, i, Duration::MAX, true);
            };
            match gcra.check() {
                Ok(snapshot) => {
                    let remaining = u64::from(snapshot.remaining_burst_capacity());
                    levels[i] = Some(level_of(window, remaining as f64));
                }
                Err(not_until) => {
                    let wait = not_until.wait_time_from(self.clock.now());
                    return refused(windows, i, wait, window.capacity == 0);
                }
            }
        }
        Take {
            allowed: true,
            levels: levels
                .into_iter()
                .zip(windows)
                .map(|(l, w)| l.unwrap_or_else(|| level_of(*w, 0.0)))
                .collect(),
            retry_after: Duration::ZERO,
            never: false,
        }
    }

    fn take_now(&self, key: &str, windows: &[Window], amount: u64) -> Take {
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        let mut current = Vec::with_capacity(windows.len());
        let (mut allowed, mut never, mut wait) = (true, false, Duration::ZERO);
        for window in windows {
            let level = buckets
                .get(&(key.to_string(), *window))
                .map_or(window.capacity as f64, |(level, at)| {
                    refill(*window, *level, now.duration_since(*at))
                });
            if amount > window.capacity {
                (allowed, never) = (false, true);
            } else if level < amount as f64 {
                allowed = false;
                wait = wait.max(time_to(*window, level, amount as f64));
            }
            current.push(level);
        }
        if allowed {
            for (window, level) in windows.iter().zip(current.iter_mut()) {
                *level -= amount as f64;
                buckets.insert((key.to_string(), *window), (*level, now));
            }
        }
        Take {
            allowed,
            levels: windows
                .iter()
                .zip(current)
                .map(|(w, l)| level_of(*w, l))
                .collect(),
            retry_after: if never { Duration::MAX } else { wait },
            never,
        }
    }

    fn give_back_now(&self, key: &str, windows: &[Window], amount: u64) {
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        for window in windows {
            if let Some((level, at)) = buckets.get_mut(&(key.to_string(), *window)) {
                *level = (refill(*window, *level, now.duration_since(*at)) + amount as f64)
                    .min(window.capacity as f64);
                *at = now;
            }
        }
    }

    fn acquire_now(&self, key: &str, lease: &str, limit: u64, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut leases = lock(&self.leases);
        let held = leases.entry(key.to_string()).or_default();
        held.retain(|_, until| *until > now);
        if held.len() as u64 >= limit {
            return false;
        }
        held.insert(lease.to_string(), now + ttl);
        true
    }

    fn begin_now(&self, key: &str, fingerprint: &str, owner: &str, lease: Duration) -> Begin {
        let now = Instant::now();
        let mut records = lock(&self.records);
        let expired = records.entries.get(key).is_some_and(|e| match &e.record {
            Record::Running { until, .. } | Record::Done { until, .. } => *until <= now,
        });
        if expired {
            remove(&mut records, key);
        }
        if let Some(entry) = records.entries.get(key) {
            if entry.fingerprint != fingerprint {
                return Begin::Conflict;
            }
            return match &entry.record {
                Record::Running { .. } => Begin::Running,
                Record::Done { body, .. } => Begin::Done(body.clone()),
            };
        }
        let size = footprint(key, fingerprint.len() + owner.len());
        self.make_room(&mut records, size, now);
        records.entries.insert(
            key.to_string(),
            Entry {
                fingerprint: fingerprint.to_string(),
                record: Record::Running {
                    owner: owner.to_string(),
                    until: now + lease,
                },
            },
        );
        records.bytes += size;
        records.order.push_back(key.to_string());
        metrics::idempotency_records(records.entries.len(), records.bytes);
        Begin::Started
    }

    /// Evicts expired records, then the oldest, until one more record of `adding` bytes fits.
    fn make_room(&self, records: &mut Records, adding: usize, now: Instant) {
        let mut scanned = records.order.len();
        while scanned > 0
            && (records.entries.len() >= self.limits.max_records
                || records.bytes + adding > self.limits.max_bytes)
        {
            scanned -= 1;
            let Some(key) = records.order.pop_front() else {
                break;
            };
            if let Some(entry) = records.entries.get(&key) {
                // A running record is kept unless its lease lapsed: evicting it would let a
                // retry run the request twice.
                let evictable = match &entry.record {
                    Record::Running { until, .. } => *until <= now,
                    Record::Done { .. } => true,
                };
                if evictable {
                    remove(records, &key);
                } else {
                    records.order.push_back(key);
                }
            }
        }
        // Drop queue entries whose records are gone (finished requests that failed, or whose
        // clients left, are forgotten), so the queue stays bounded too.
        if records.order.len() > 2 * records.entries.len() + 16 {
            let entries = &records.entries;
            records.order.retain(|k| entries.contains_key(k));
        }
    }

    fn with_running(&self, key: &str, owner: &str, f: impl FnOnce(&mut Records)) {
        let mut records = lock(&self.records);
        let owned = records
            .entries
            .get(key)
            .is_some_and(|e| matches!(&e.record, Record::Running { owner: o, .. } if o == owner));
        if owned {
            f(&mut records);
        }
        metrics::idempotency_records(records.entries.len(), records.bytes);
    }
}

/// The bytes a record holds beyond its key and fingerprint.
fn held_bytes(record: &Record) -> usize {
    match record {
        Record::Running { owner, .. } => owner.len(),
        Record::Done { body, .. } => body.len(),
    }
}

fn remove(records: &mut Records, key: &str) {
    if let Some(entry) = records.entries.remove(key) {
        records.bytes -= footprint(key, entry.fingerprint.len() + held_bytes(&entry.record));
    }
}

fn refused(windows: &[Window], at: usize, wait: Duration, never: bool) -> Take {
    Take {
        allowed: false,
        levels: windows
            .iter()
            .enumerate()
            .map(|(i, w)| level_of(*w, if i == at { 0.0 } else { w.capacity as f64 }))
            .collect(),
        retry_after: wait,
        never,
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok::<T, StoreError>(value)))
}

impl Store for MemoryStore {
    fn hit<'a>(&'a self, key: &'a str, windows: &'a [Window]) -> StoreFuture<'a, Take> {
        ready(self.hit_now(key, windows))
    }

    fn take<'a>(
        &'a self,
        key: &'a str,
        windows: &'a [Window],
        amount: u64,
    ) -> StoreFuture<'a, Take> {
        ready(self.take_now(key, windows, amount))
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        lease: &'a str,
        limit: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        ready(self.acquire_now(key, lease, limit, ttl))
    }

    fn renew<'a>(&'a self, key: &'a str, lease: &'a str, ttl: Duration) -> StoreFuture<'a, ()> {
        if let Some(until) = lock(&self.leases)
            .get_mut(key)
            .and_then(|held| held.get_mut(lease))
        {
            *until = Instant::now() + ttl;
        }
        ready(())
    }

    fn release<'a>(&'a self, key: &'a str, lease: &'a str) -> StoreFuture<'a, ()> {
        let mut leases = lock(&self.leases);
        if let Some(held) = leases.get_mut(key) {
            held.remove(lease);
            if held.is_empty() {
                leases.remove(key);
            }
        }
        ready(())
    }

    fn begin<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a str,
        owner: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Begin> {
        ready(self.begin_now(key, fingerprint, owner, lease))
    }

    fn keep<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, ()> {
        self.with_running(key, owner, |records| {
            if let Some(Entry {
                record: Record::Running { until, .. },
                ..
            }) = records.entries.get_mut(key)
            {
                *until = Instant::now() + lease;
            }
        });
        ready(())
    }

    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        let max_bytes = self.limits.max_bytes;
        self.with_running(key, owner, |records| {
            let now = Instant::now();
            if record.len() > max_bytes {
                remove(records, key);
                return;
            }
            self.make_room(records, record.len(), now);
            if let Some(entry) = records.entries.get_mut(key) {
                let added = record.len();
                let before = std::mem::replace(
                    &mut entry.record,
                    Record::Done {
                        body: record,
                        until: now + ttl,
                    },
                );
                records.bytes = records.bytes + added - held_bytes(&before);
            }
        });
        ready(())
    }

    fn abandon<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, ()> {
        self.with_running(key, owner, |records| remove(records, key));
        ready(())
    }

    fn put<'a>(&'a self, key: &'a str, value: Vec<u8>, ttl: Duration) -> StoreFuture<'a, ()> {
        let now = Instant::now();
        let mut values = lock(&self.values);
        values.remove(key);
        let size = footprint(key, value.len());
        if size <= self.limits.max_bytes {
            values.make_room(self.limits, size, now);
            values.bytes += size;
            values.entries.insert(key.to_string(), (value, now + ttl));
            values.order.push_back(key.to_string());
        }
        metrics::stored_values(values.entries.len(), values.bytes);
        ready(())
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        let now = Instant::now();
        let values = lock(&self.values);
        let found = values
            .entries
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(value, _)| value.clone());
        ready(found)
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        let mut values = lock(&self.values);
        let removed = values.remove(key);
        metrics::stored_values(values.entries.len(), values.bytes);
        ready(removed)
    }

    fn revision<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64> {
        ready(self.revisions.number(key))
    }

    fn read_revision<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Revision>> {
        ready(self.revisions.read(key))
    }

    fn commit<'a>(&'a self, commit: Commit<'a>) -> StoreFuture<'a, bool> {
        ready(self.revisions.commit(commit))
    }

    fn raise<'a>(&'a self, key: &'a str, value: u64, ttl: Duration) -> StoreFuture<'a, u64> {
        ready(self.revisions.raise(key, value, Instant::now(), ttl))
    }

    fn log_tail<'a>(&'a self, log: &'a str, count: usize) -> StoreFuture<'a, Vec<Vec<u8>>> {
        ready(self.revisions.tail(log, count))
    }

    fn charge<'a>(&'a self, tallies: &'a [Tally], amount: u64) -> StoreFuture<'a, Charge> {
        let charged = lock(&self.tallies).charge(tallies, amount, self.limits.max_records);
        Box::pin(async move {
            charged.ok_or_else(|| {
                StoreError(format!(
                    "the in-memory spend counters are full ({} kept)",
                    self.limits.max_records
                ))
            })
        })
    }

    fn settle(&self, settlement: Settlement) -> StoreFuture<'_, ()> {
        if let Some(g) = settlement.give_back {
            self.give_back_now(&g.key, &g.windows, g.amount);
        }
        if let Some(r) = settlement.refund {
            lock(&self.tallies).refund(&r.tallies, r.amount);
        }
        if let Some(r) = settlement.record {
            lock(&self.usage).record(r.entry, r.keep_log);
        }
        ready(())
    }

    fn usage_sums<'a>(&'a self, day: &'a str) -> StoreFuture<'a, Vec<(String, u64)>> {
        ready(lock(&self.usage).sums(day))
    }

    fn usage_drain<'a>(&'a self, _consumer: &'a str, count: usize) -> StoreFuture<'a, Drained> {
        ready(lock(&self.usage).drain(count))
    }

    fn usage_ack<'a>(&'a self, ids: &'a [String]) -> StoreFuture<'a, ()> {
        lock(&self.usage).ack(ids);
        ready(())
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        ready(())
    }

    fn shared(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max_records: usize, max_bytes: usize) -> MemoryStore {
        MemoryStore::new(MemoryLimits {
            max_records,
            max_bytes,
        })
    }

    fn get(s: &MemoryStore, key: &str) -> Option<Vec<u8>> {
        futures_util::FutureExt::now_or_never(s.get(key))
            .and_then(Result::ok)
            .flatten()
    }

    fn run<T>(f: StoreFuture<'_, T>) -> Option<T> {
        futures_util::FutureExt::now_or_never(f).and_then(Result::ok)
    }

    #[test]
    fn values_are_kept_replaced_removed_and_expire() {
        let s = store(10, 1000);
        run(s.put("a", b"one".to_vec(), Duration::from_secs(60)));
        run(s.put("a", b"two".to_vec(), Duration::from_secs(60)));
        assert_eq!(get(&s, "a"), Some(b"two".to_vec()));
        assert_eq!(
            lock(&s.values).bytes,
            footprint("a", 3),
            "the key's and entry's too"
        );
        assert_eq!(run(s.delete("a")), Some(true));
        assert_eq!(run(s.delete("a")), Some(false));
        assert_eq!(get(&s, "a"), None);
        run(s.put("b", b"x".to_vec(), Duration::ZERO));
        assert_eq!(get(&s, "b"), None, "expired");
    }

    #[test]
    fn values_are_bounded_by_count_and_bytes_oldest_first() {
        let budget = 2 * footprint("a", 5);
        let s = store(2, budget);
        for key in ["a", "b", "c"] {
            run(s.put(key, b"1234".to_vec(), Duration::from_secs(60)));
        }
        assert_eq!(get(&s, "a"), None);
        assert!(get(&s, "b").is_some() && get(&s, "c").is_some());
        run(s.put("d", b"12345678".to_vec(), Duration::from_secs(60)));
        let values = lock(&s.values);
        assert!(
            values.bytes <= budget && values.entries.len() <= 2,
            "{values:?}"
        );
        drop(values);
        assert!(get(&s, "d").is_some());
        run(s.put("huge", vec![0; budget], Duration::from_secs(60)));
        assert_eq!(get(&s, "huge"), None, "larger than the whole budget");
    }

    #[test]
    fn forgotten_records_leave_no_trace_in_the_eviction_queue() {
        let s = store(1000, 1 << 20);
        for i in 0..10_000 {
            let key = format!("k{i}");
            let begun = run(s.begin(&key, "fp", "me", Duration::from_secs(60)));
            assert!(matches!(begun, Some(Begin::Started)));
            run(s.abandon(&key, "me"));
        }
        let records = lock(&s.records);
        assert!(records.entries.is_empty() && records.bytes == 0);
        assert!(records.order.len() <= 16 + 1, "{}", records.order.len());
    }
}
