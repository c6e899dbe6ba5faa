//! Shared request state behind one trait, [`Store`]: rate buckets, token budgets,
//! concurrency leases, idempotency records, stored values (responses kept for
//! `previous_response_id`), and revisioned records with their append-only logs (the admin API's
//! state and its audit trail).
//!
//! Two backends: [`memory::MemoryStore`] (the default, one process) and [`redis::RedisStore`]
//! (shared by every gateway replica). The trait is small and speaks plain data (keys, numbers,
//! byte records) so the limit and idempotency logic above it is the same on both, and every
//! Redis operation is one server-side script: a check and its update are one atomic step, never
//! a read-modify-write from the gateway, so replicas cannot race each other past a limit.
//!
//! Buckets are token buckets: a [`Window`] of capacity `c` refills `c` units evenly over its
//! period. A request-rate window takes 1 per request, a token window takes prompt plus maximum
//! completion tokens, and gives back what went unused when the generation ends
//! ([`Settlement`]). Spend budgets use [`Tally`] counters instead, which do not refill but
//! start again each calendar period.

mod gauges;
pub mod health;
pub mod memory;
pub mod redis;
pub mod revisions;
pub mod settle;
pub mod tally;
pub mod usage;
mod values;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use settle::{GiveBack, Record, Refund, Settlement};
pub use tally::{Charge, Tally};
pub use usage::{Drained, UsageEntry};

/// A boxed future of a store operation.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store operation failed (the backend is unreachable or answered nonsense).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state store: {0}")]
pub struct StoreError(pub String);

/// A token bucket: `capacity` units, refilled evenly over `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// Most units the bucket holds.
    pub capacity: u64,
    /// Time to refill from empty.
    pub period: Duration,
}

/// A bucket after an operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    /// The window.
    pub window: Window,
    /// Whole units left.
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset: Duration,
}

/// The outcome of taking units from several windows at once (all or none).
#[derive(Debug, Clone, PartialEq)]
pub struct Take {
    /// Whether the units were taken from every window.
    pub allowed: bool,
    /// Each window's level afterwards, in the order given.
    pub levels: Vec<Level>,
    /// When refused: how long until the amount fits.
    pub retry_after: Duration,
    /// When refused: the amount is larger than some window's capacity, so waiting never helps.
    pub never: bool,
}

/// The outcome of starting an idempotent request.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// No record existed; the caller owns it now and must finish or abandon it.
    Started,
    /// The same request is running (here or on another replica).
    Running,
    /// The same request finished; its recorded response.
    Done(Vec<u8>),
    /// The key was used with a different request.
    Conflict,
}

/// One revision of a revisioned record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// Its number, counting from 1.
    pub number: u64,
    /// Its value.
    pub value: Vec<u8>,
}

/// A change to a revisioned record and the log entry that records it, committed together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit<'a> {
    /// The record.
    pub key: &'a str,
    /// The revision the change was made against (0: none yet); the commit fails if the record
    /// is at another one.
    pub expected: u64,
    /// The new revision's number: `expected + 1`, or more when a state the store lost is put
    /// back at the revision after the one a replica held.
    pub number: u64,
    /// The new value.
    pub value: Vec<u8>,
    /// The log the entry is appended to.
    pub log: &'a str,
    /// The entry.
    pub entry: Vec<u8>,
    /// Whether the entry replaces the log's entries instead of following them (a restore: the
    /// entries the store holds belong to the history it went back to).
    pub restart_log: bool,
    /// How many of the log's newest entries are kept.
    pub keep: usize,
}

/// The state backend.
pub trait Store: Send + Sync + Debug {
    /// Counts one request against every window of `key`, or against none.
    fn hit<'a>(&'a self, key: &'a str, windows: &'a [Window]) -> StoreFuture<'a, Take>;

    /// Takes `amount` from every window of `key`, or from none.
    fn take<'a>(
        &'a self,
        key: &'a str,
        windows: &'a [Window],
        amount: u64,
    ) -> StoreFuture<'a, Take>;

    /// Holds one of `limit` concurrency leases of `key` under the id `lease`; `false` when all
    /// are held. A lease not renewed within `ttl` lapses (a replica that died returns its leases).
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        lease: &'a str,
        limit: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;

    /// Extends a lease by `ttl`.
    fn renew<'a>(&'a self, key: &'a str, lease: &'a str, ttl: Duration) -> StoreFuture<'a, ()>;

    /// Returns a lease.
    fn release<'a>(&'a self, key: &'a str, lease: &'a str) -> StoreFuture<'a, ()>;

    /// Starts the idempotent request `key` with body `fingerprint`, owned by `owner` for at most
    /// `lease` unless renewed.
    fn begin<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a str,
        owner: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Begin>;

    /// Extends the running record's lease (only its owner can).
    fn keep<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, ()>;

    /// Stores the finished response of a running record, kept for `ttl`.
    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> StoreFuture<'a, ()>;

    /// Forgets a running record (it failed or was cancelled), so a retry runs anew.
    fn abandon<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, ()>;

    /// Keeps `value` under `key` for `ttl`, replacing what was there (stored responses).
    fn put<'a>(&'a self, key: &'a str, value: Vec<u8>, ttl: Duration) -> StoreFuture<'a, ()>;

    /// The value under `key`, unless it expired or was evicted.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>>;

    /// Removes `key`; whether it was there.
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool>;

    /// The revision number of the record `key` (0: none yet): a cheap read for polling.
    fn revision<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64>;

    /// The newest revision of the record `key`.
    fn read_revision<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Revision>>;

    /// Writes revision `commit.number` and appends its log entry in one atomic step, only if
    /// the record is still at `commit.expected`; `false` when another writer got there first.
    fn commit<'a>(&'a self, commit: Commit<'a>) -> StoreFuture<'a, bool>;

    /// Raises the number under `key` to `value` unless it holds more (or holds it and then
    /// keeps it another `ttl`); what it holds after. An expired number counts as 0.
    fn raise<'a>(&'a self, key: &'a str, value: u64, ttl: Duration) -> StoreFuture<'a, u64>;

    /// Adds `amount` to every tally, or to none when one would pass its limit.
    fn charge<'a>(&'a self, tallies: &'a [Tally], amount: u64) -> StoreFuture<'a, Charge>;

    /// Ends a request: gives back its unused tokens, refunds its unused spend and writes its
    /// usage record, whichever of them it has, in one atomic step (see [`settle`]).
    fn settle(&self, settlement: Settlement) -> StoreFuture<'_, ()>;

    /// Waits up to `within` for what this process wrote locally to reach the shared state (a
    /// usage journal's records); whether it all did. Nothing to wait for by default.
    fn flush(&self, within: Duration) -> StoreFuture<'_, bool> {
        let _ = within;
        Box::pin(std::future::ready(Ok(true)))
    }

    /// A day's usage sums (`day`: `YYYYMMDD`).
    fn usage_sums<'a>(&'a self, day: &'a str) -> StoreFuture<'a, Vec<(String, u64)>>;

    /// Up to `count` usage records to export, for `consumer` (records another consumer took
    /// long ago and never acknowledged come back too).
    fn usage_drain<'a>(&'a self, consumer: &'a str, count: usize) -> StoreFuture<'a, Drained>;

    /// Acknowledges exported records: they leave the log.
    fn usage_ack<'a>(&'a self, ids: &'a [String]) -> StoreFuture<'a, ()>;

    /// The newest `count` entries of `log`, oldest first.
    fn log_tail<'a>(&'a self, log: &'a str, count: usize) -> StoreFuture<'a, Vec<Vec<u8>>>;

    /// Whether the backend answers.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Whether other processes share this state, so a lease a crashed holder never returned must
    /// lapse, and live leases must be renewed.
    fn shared(&self) -> bool;
}

/// Bucket arithmetic shared by the in-memory store and mirrored by the Redis scripts: the level
/// of a bucket last at `level` `elapsed` ago.
pub fn refill(window: Window, level: f64, elapsed: Duration) -> f64 {
    let cap = window.capacity as f64;
    let period = window.period.as_secs_f64().max(1e-9);
    (level + elapsed.as_secs_f64() * cap / period).min(cap)
}

/// The time for a bucket at `level` to hold `amount`.
pub fn time_to(window: Window, level: f64, amount: f64) -> Duration {
    if level >= amount || window.capacity == 0 {
        return Duration::ZERO;
    }
    let rate = window.capacity as f64 / window.period.as_secs_f64().max(1e-9);
    Duration::from_secs_f64((amount - level) / rate)
}

/// A bucket's level as reported.
pub fn level_of(window: Window, level: f64) -> Level {
    Level {
        window,
        remaining: level.max(0.0).floor() as u64,
        reset: time_to(window, level, window.capacity as f64),
    }
}

/// What a feature does when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Let the request through unlimited (availability first).
    Open,
    /// Refuse with 503 (the limit first).
    Closed,
}

/// Failure modes per feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureModes {
    /// Request rates.
    pub requests: FailureMode,
    /// Token budgets.
    pub tokens: FailureMode,
    /// Concurrent generations.
    pub concurrency: FailureMode,
    /// Idempotency records.
    pub idempotency: FailureMode,
}
