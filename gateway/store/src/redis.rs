//! The Redis store: state shared by every gateway replica. Each operation is one Lua script run
//! by the server (`EVALSHA`, loaded again after a Redis restart), so a check and its update are
//! atomic across replicas. Scripts read the clock with `TIME` on the Redis server, so replicas
//! with skewed clocks still agree. Bucket takes, budget charges and requests' ends are grouped:
//! the calls that arrive while one is on its way go together in the next ([`batch`]); takes and
//! charges share one script, so a request's token reservation and budget charge go in one call
//! ([`admit`]).
//!
//! The connection manager reconnects by itself; every call is bounded by the configured
//! timeout, so a Redis that vanishes costs a request at most that long before the caller's
//! failure mode (open or closed) applies. A call refused at connect is tried once more within
//! the same timeout (nothing was sent). A plain command (get, set, delete, ping: each safe to
//! repeat) that finds its connection dropped is sent once more too; a script is not, since
//! Redis may have run it before the connection dropped, and running `take` or `begin` twice is
//! not the same as once. The health probe (see [`super::health`]) keeps the connection re-made
//! while Redis is away, so the first script after Redis returns finds a live connection.

mod admit;
mod batch;
mod journal;
mod settle;
mod ship;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use super::usage::Drained;
use super::{
    Begin, Charge, Commit, Revision, Settlement, Store, StoreError, StoreFuture, Take, Tally,
    Window,
};

/// State in Redis.
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    timeout: Duration,
    scripts: std::sync::Arc<Scripts>,
    batches: std::sync::Arc<Batches>,
    /// The usage journal records go through, when configured (see [`journal`]).
    journal: Option<std::sync::Arc<journal::Journal>>,
}

/// The queues of grouped calls (see [`batch`]).
#[derive(Debug, Default)]
struct Batches {
    settles: batch::Queue<settle::Settles>,
    admits: batch::Queue<admit::Admits>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

struct Scripts {
    admit: Script,
    acquire: Script,
    renew: Script,
    begin: Script,
    owned: Script,
    commit: Script,
    raise: Script,
    settle: Script,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn bucket_keys(key: &str, windows: &[Window]) -> Vec<String> {
    windows
        .iter()
        .map(|w| format!("{key}:{}:{}", ms(w.period), w.capacity))
        .collect()
}

/// The arguments of the bucket scripts: the amount, then each window's capacity and period.
fn bucket_args(amount: u64, windows: &[Window]) -> Vec<Vec<u8>> {
    let mut args = vec![amount.to_string().into_bytes()];
    for w in windows {
        args.push(w.capacity.to_string().into_bytes());
        args.push(ms(w.period).to_string().into_bytes());
    }
    args
}

/// Whether `e` says the connection was gone or refused (a Redis that restarted): the connection
/// manager is reconnecting, and a command that is safe to repeat may be sent again.
fn broken(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_connection_refusal()
}

/// The usage log (a stream) and its consumer group; in the `{usage}` hash slot with the sums.
const USAGE_LOG: &str = "tp:{usage}:log";
const USAGE_GROUP: &str = "export";

/// `(id, record)` of each entry of a stream reply (`[[id, [field, value, ...]], ...]`).
fn stream_entries(value: &Value) -> Drained {
    let Value::Array(entries) = value else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let (Some(id), Some(Value::Array(fields))) = (parts.first(), parts.get(1)) else {
                return None;
            };
            let id = match id {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            match fields.get(1) {
                Some(Value::BulkString(record)) => Some((id, record.clone())),
                _ => None,
            }
        })
        .collect()
}

fn integer(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(i) => Ok(*i),
        other => Err(StoreError(format!("unexpected script reply {other:?}"))),
    }
}

impl RedisStore {
    /// A store on `url` (`redis://host:port/db`). Connects lazily: the gateway starts while Redis
    /// is down and uses it once it answers.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| StoreError(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let connection = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| StoreError(e.to_string()))?;
        Ok(Self {
            connection,
            timeout,
            scripts: std::sync::Arc::new(Scripts {
                admit: Script::new(include_str!("scripts/admit.lua")),
                acquire: Script::new(include_str!("scripts/acquire.lua")),
                renew: Script::new(include_str!("scripts/renew.lua")),
                begin: Script::new(include_str!("scripts/begin.lua")),
                owned: Script::new(include_str!("scripts/owned.lua")),
                commit: Script::new(include_str!("scripts/commit.lua")),
                raise: Script::new(include_str!("scripts/raise.lua")),
                settle: Script::new(include_str!("scripts/settle.lua")),
            }),
            batches: std::sync::Arc::default(),
            journal: None,
        })
    }

    async fn run(
        &self,
        script: &Script,
        keys: &[String],
        args: Vec<Vec<u8>>,
    ) -> Result<Value, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut retried = false;
        loop {
            let mut connection = self.connection.clone();
            match tokio::time::timeout_at(deadline, invocation.invoke_async(&mut connection)).await
            {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !retried && e.is_connection_refusal() => retried = true,
                Ok(Err(e)) => return Err(StoreError(e.to_string())),
                Err(_) => {
                    return Err(StoreError(format!(
                        "no answer within {} ms",
                        self.timeout.as_millis()
                    )));
                }
            }
        }
    }

    /// Runs one plain command within the timeout.
    async fn query<T: redis::FromRedisValue>(
        &self,
        command: redis::Cmd,
        what: &str,
    ) -> Result<T, StoreError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut retried = false;
        loop {
            let mut connection = self.connection.clone();
            match tokio::time::timeout_at(deadline, command.query_async::<T>(&mut connection)).await
            {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !retried && broken(&e) => retried = true,
                Ok(Err(e)) => return Err(StoreError(e.to_string())),
                Err(_) => return Err(StoreError(format!("{what} timed out"))),
            }
        }
    }

    async fn take_units(
        &self,
        key: &str,
        windows: &[Window],
        amount: u64,
    ) -> Result<Take, StoreError> {
        let take = admit::Admit::Take {
            key: key.to_string(),
            windows: windows.to_vec(),
            amount,
        };
        self.batched::<admit::Admits>(take).await?.take()
    }

    async fn owned(
        &self,
        key: &str,
        owner: &str,
        action: &str,
        ttl: Duration,
        record: Vec<u8>,
    ) -> Result<(), StoreError> {
        let args = vec![
            owner.as_bytes().to_vec(),
            action.as_bytes().to_vec(),
            ms(ttl).to_string().into_bytes(),
            record,
        ];
        self.run(&self.scripts.owned, &[key.to_string()], args)
            .await
            .map(drop)
    }
}

impl Store for RedisStore {
    fn hit<'a>(&'a self, key: &'a str, windows: &'a [Window]) -> StoreFuture<'a, Take> {
        Box::pin(self.take_units(key, windows, 1))
    }

    fn take<'a>(
        &'a self,
        key: &'a str,
        windows: &'a [Window],
        amount: u64,
    ) -> StoreFuture<'a, Take> {
        Box::pin(self.take_units(key, windows, amount))
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        lease: &'a str,
        limit: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let args = vec![
                lease.as_bytes().to_vec(),
                limit.to_string().into_bytes(),
                ms(ttl).to_string().into_bytes(),
            ];
            let reply = self
                .run(&self.scripts.acquire, &[key.to_string()], args)
                .await?;
            Ok(integer(&reply)? == 1)
        })
    }

    fn renew<'a>(&'a self, key: &'a str, lease: &'a str, ttl: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let args = vec![lease.as_bytes().to_vec(), ms(ttl).to_string().into_bytes()];
            self.run(&self.scripts.renew, &[key.to_string()], args)
                .await
                .map(drop)
        })
    }

    fn release<'a>(&'a self, key: &'a str, lease: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let command = redis::cmd("ZREM").arg(key).arg(lease).to_owned();
            match tokio::time::timeout(self.timeout, command.query_async::<i64>(&mut connection))
                .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(StoreError(e.to_string())),
                Err(_) => Err(StoreError("release timed out".into())),
            }
        })
    }

    fn begin<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a str,
        owner: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Begin> {
        Box::pin(async move {
            let args = vec![
                fingerprint.as_bytes().to_vec(),
                owner.as_bytes().to_vec(),
                ms(lease).to_string().into_bytes(),
            ];
            let reply = self
                .run(&self.scripts.begin, &[key.to_string()], args)
                .await?;
            let Value::Array(items) = reply else {
                return Err(StoreError(format!("unexpected begin reply {reply:?}")));
            };
            let text = |v: Option<&Value>| match v {
                Some(Value::BulkString(b)) => Some(b.clone()),
                Some(Value::SimpleString(s)) => Some(s.clone().into_bytes()),
                _ => None,
            };
            match text(items.first()).as_deref() {
                Some(b"started") => Ok(Begin::Started),
                Some(b"running") => Ok(Begin::Running),
                Some(b"conflict") => Ok(Begin::Conflict),
                Some(b"done") => Ok(Begin::Done(text(items.get(1)).unwrap_or_default())),
                _ => Err(StoreError(format!("unexpected begin reply {items:?}"))),
            }
        })
    }

    fn keep<'a>(&'a self, key: &'a str, owner: &'a str, lease: Duration) -> StoreFuture<'a, ()> {
        Box::pin(self.owned(key, owner, "keep", lease, Vec::new()))
    }

    fn finish<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.owned(key, owner, "finish", ttl, record))
    }

    fn abandon<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(self.owned(key, owner, "abandon", Duration::ZERO, Vec::new()))
    }

    fn put<'a>(&'a self, key: &'a str, value: Vec<u8>, ttl: Duration) -> StoreFuture<'a, ()> {
        let command = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(ms(ttl).max(1))
            .to_owned();
        Box::pin(async move { self.query::<()>(command, "put").await })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        let command = redis::cmd("GET").arg(key).to_owned();
        Box::pin(async move { self.query::<Option<Vec<u8>>>(command, "get").await })
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        let command = redis::cmd("DEL").arg(key).to_owned();
        Box::pin(async move { self.query::<i64>(command, "delete").await.map(|n| n > 0) })
    }

    fn revision<'a>(&'a self, key: &'a str) -> StoreFuture<'a, u64> {
        let command = redis::cmd("HGET").arg(key).arg("rev").to_owned();
        Box::pin(async move {
            Ok(self
                .query::<Option<u64>>(command, "revision")
                .await?
                .unwrap_or(0))
        })
    }

    fn read_revision<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Revision>> {
        let command = redis::cmd("HMGET")
            .arg(key)
            .arg("rev")
            .arg("val")
            .to_owned();
        Box::pin(async move {
            let (number, value) = self
                .query::<(Option<u64>, Option<Vec<u8>>)>(command, "read_revision")
                .await?;
            Ok(number
                .zip(value)
                .map(|(number, value)| Revision { number, value }))
        })
    }

    fn commit<'a>(&'a self, commit: Commit<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let keys = [commit.key.to_string(), commit.log.to_string()];
            let args = vec![
                commit.expected.to_string().into_bytes(),
                commit.value,
                commit.entry,
                commit.keep.max(1).to_string().into_bytes(),
                commit.number.to_string().into_bytes(),
                if commit.restart_log {
                    b"1".to_vec()
                } else {
                    b"0".to_vec()
                },
            ];
            let reply = self.run(&self.scripts.commit, &keys, args).await?;
            Ok(integer(&reply)? == 1)
        })
    }

    fn raise<'a>(&'a self, key: &'a str, value: u64, ttl: Duration) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let keys = [key.to_string()];
            let args = vec![
                value.to_string().into_bytes(),
                ms(ttl).to_string().into_bytes(),
            ];
            let reply = self.run(&self.scripts.raise, &keys, args).await?;
            u64::try_from(integer(&reply)?).map_err(|e| StoreError(e.to_string()))
        })
    }

    fn charge<'a>(&'a self, tallies: &'a [Tally], amount: u64) -> StoreFuture<'a, Charge> {
        let charge = admit::Admit::Charge {
            tallies: tallies.to_vec(),
            amount,
        };
        Box::pin(async move { self.batched::<admit::Admits>(charge).await?.charge() })
    }

    fn settle(&self, settlement: Settlement) -> StoreFuture<'_, ()> {
        match self.journaled(settlement) {
            Some(settlement) => {
                Box::pin(async move { self.batched::<settle::Settles>(settlement).await })
            }
            None => Box::pin(std::future::ready(Ok(()))),
        }
    }

    fn flush(&self, within: Duration) -> StoreFuture<'_, bool> {
        Box::pin(async move { Ok(self.flush_journal(within).await) })
    }

    fn usage_sums<'a>(&'a self, day: &'a str) -> StoreFuture<'a, Vec<(String, u64)>> {
        let command = redis::cmd("HGETALL")
            .arg(format!("tp:{{usage}}:d:{day}"))
            .to_owned();
        Box::pin(async move {
            self.query::<Vec<(String, u64)>>(command, "usage_sums")
                .await
        })
    }

    fn usage_drain<'a>(&'a self, consumer: &'a str, count: usize) -> StoreFuture<'a, Drained> {
        Box::pin(async move {
            let create = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(USAGE_LOG)
                .arg(USAGE_GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .to_owned();
            if let Err(e) = self.query::<Value>(create, "usage_drain").await
                && !e.0.contains("BUSYGROUP")
            {
                return Err(e);
            }
            // Records a consumer read 10 s ago and never acknowledged (it died) first.
            let claim = redis::cmd("XAUTOCLAIM")
                .arg(USAGE_LOG)
                .arg(USAGE_GROUP)
                .arg(consumer)
                .arg(10_000)
                .arg("0-0")
                .arg("COUNT")
                .arg(count)
                .to_owned();
            let claimed = self.query::<Value>(claim, "usage_drain").await?;
            let mut out = match &claimed {
                Value::Array(parts) if parts.len() >= 2 => stream_entries(&parts[1]),
                _ => Vec::new(),
            };
            if out.len() < count {
                let read = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(USAGE_GROUP)
                    .arg(consumer)
                    .arg("COUNT")
                    .arg(count - out.len())
                    .arg("STREAMS")
                    .arg(USAGE_LOG)
                    .arg(">")
                    .to_owned();
                if let Value::Array(streams) = self.query::<Value>(read, "usage_drain").await? {
                    for stream in &streams {
                        if let Value::Array(pair) = stream
                            && pair.len() == 2
                        {
                            out.extend(stream_entries(&pair[1]));
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    fn usage_ack<'a>(&'a self, ids: &'a [String]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(());
            }
            let ack = redis::cmd("XACK")
                .arg(USAGE_LOG)
                .arg(USAGE_GROUP)
                .arg(ids)
                .to_owned();
            self.query::<Value>(ack, "usage_ack").await?;
            let delete = redis::cmd("XDEL").arg(USAGE_LOG).arg(ids).to_owned();
            self.query::<Value>(delete, "usage_ack").await.map(drop)
        })
    }

    fn log_tail<'a>(&'a self, log: &'a str, count: usize) -> StoreFuture<'a, Vec<Vec<u8>>> {
        let start = -i64::try_from(count.max(1)).unwrap_or(i64::MAX);
        let command = redis::cmd("LRANGE").arg(log).arg(start).arg(-1).to_owned();
        Box::pin(async move { self.query::<Vec<Vec<u8>>>(command, "log_tail").await })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let command = redis::cmd("PING");
            match tokio::time::timeout(self.timeout, command.query_async::<String>(&mut connection))
                .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(StoreError(e.to_string())),
                Err(_) => Err(StoreError("ping timed out".into())),
            }
        })
    }

    fn shared(&self) -> bool {
        true
    }
}
