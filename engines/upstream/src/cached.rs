//! Routing by the blocks replicas actually hold: each replica's KV events (vLLM's format over
//! ZeroMQ, as Turnpike nodes with `kv_events` and vLLM with `--kv-events-config` publish them)
//! are followed on a thread of their own, and a request goes to the replica that holds the
//! longest run of its prompt's first blocks, hashed as the publisher hashes them
//! (`turnpike-kv-events`). Hashing prompts (prefix affinity) guesses where a prefix is; this
//! knows, and keeps knowing after evictions, restarts and membership changes.
//!
//! Bounded: a replica's set holds at most `max_blocks` hashes (past it the set is cleared: the
//! replica is then treated as holding nothing, which only costs affinity). A replica whose
//! events cannot be read is retried every second; while it is, nothing is known of it.

use std::collections::{HashMap, HashSet};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;

use turnpike_kv_events::hash::external;
use turnpike_kv_events::zmtp::{self, Incoming};
use turnpike_kv_events::{BlockHasher, Event, EventBatch};

use crate::pool::{Pool, Replica};

/// `kv_events` as written (the plugin's JSON and the picker's TOML alike).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKvEvents {
    #[serde(default)]
    endpoints: HashMap<String, String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    topic: String,
    #[serde(default = "default_block")]
    block_size: usize,
    #[serde(default = "default_seed")]
    hash_seed: String,
    #[serde(default = "default_max_blocks")]
    max_blocks: usize,
}

fn default_block() -> usize {
    16
}
fn default_seed() -> String {
    turnpike_kv_events::hash::DEFAULT_SEED.into()
}
fn default_max_blocks() -> usize {
    1 << 20
}

impl RawKvEvents {
    /// Checks it; replica URLs lose a trailing `/`.
    pub(crate) fn validate(self) -> Result<KvEventsConfig, String> {
        if self.endpoints.is_empty() && self.port.is_none() {
            return Err("give endpoints or port".into());
        }
        if self.block_size == 0 || self.max_blocks == 0 {
            return Err("block_size and max_blocks must be positive".into());
        }
        Ok(KvEventsConfig {
            endpoints: self
                .endpoints
                .into_iter()
                .map(|(url, e)| (url.trim_end_matches('/').to_string(), e))
                .collect(),
            port: self.port,
            topic: self.topic,
            block_size: self.block_size,
            hash_seed: self.hash_seed,
            max_blocks: self.max_blocks,
        })
    }
}

/// How a pool follows its replicas' KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KvEventsConfig {
    /// Each replica's events endpoint by its base URL (`tcp://host:port`).
    pub endpoints: HashMap<String, String>,
    /// Otherwise this port on each replica's host.
    pub port: Option<u16>,
    /// The topic prefix subscribed to.
    pub topic: String,
    /// The publishers' block size and hash seed.
    pub block_size: usize,
    pub hash_seed: String,
    /// Hashes kept per replica at most.
    pub max_blocks: usize,
}

/// What is known of one replica's cache.
#[derive(Debug, Default)]
struct Held {
    blocks: Mutex<HashSet<u64>>,
    /// Set when the replica left the pool (its thread ends).
    gone: AtomicBool,
}

/// The pool's view of its replicas' caches.
#[derive(Debug)]
pub(crate) struct CacheView {
    config: KvEventsConfig,
    hasher: BlockHasher,
    held: Mutex<HashMap<String, Arc<Held>>>,
    /// Requests routed to the replica holding their prefix.
    pub routed: AtomicU64,
}

impl CacheView {
    pub(crate) fn new(config: KvEventsConfig) -> Self {
        Self {
            hasher: BlockHasher::new(&config.hash_seed),
            config,
            held: Mutex::default(),
            routed: AtomicU64::new(0),
        }
    }

    /// Follows the events of `pool`'s replicas that are not followed yet, and stops following
    /// those that left.
    pub(crate) fn follow(self: &Arc<Self>, pool: &Pool) {
        let urls: Vec<String> = pool.replicas().iter().map(|r| r.url.clone()).collect();
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|url, h| {
            let stays = urls.contains(url);
            if !stays {
                h.gone.store(true, Ordering::Relaxed);
            }
            stays
        });
        for url in urls {
            if held.contains_key(&url) {
                continue;
            }
            let Some(endpoint) = self.endpoint(&url) else {
                continue;
            };
            let h = Arc::new(Held::default());
            held.insert(url, Arc::clone(&h));
            let (topic, max) = (self.config.topic.clone(), self.config.max_blocks);
            let _ = std::thread::Builder::new()
                .name("upstream-kv-events".into())
                .spawn(move || subscribe_forever(&endpoint, &topic, &h, max));
        }
    }

    /// [`CacheView::follow`] the pool `pool(owner)` every `every`, until the runtime stops.
    pub(crate) async fn follow_every<O>(
        self: Arc<Self>,
        every: Duration,
        owner: Arc<O>,
        pool: fn(&O) -> &Pool,
    ) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            self.follow(pool(&owner));
        }
    }

    fn endpoint(&self, url: &str) -> Option<String> {
        if let Some(e) = self.config.endpoints.get(url) {
            return Some(e.trim_start_matches("tcp://").to_string());
        }
        let port = self.config.port?;
        let authority = url.trim_start_matches("http://");
        let host = authority.rsplit_once(':').map_or(authority, |(h, p)| {
            if p.contains(']') { authority } else { h }
        });
        Some(format!("{host}:{port}"))
    }

    /// The replica (not of `tried`) holding the longest run of `prompt`'s first blocks, when
    /// one holds any and would take a request now.
    pub(crate) fn best(
        &self,
        pool: &Pool,
        prompt: &[u32],
        tried: &[Arc<Replica>],
    ) -> Option<Arc<Replica>> {
        // Blocks are hashed one at a time, and only while some replica still holds every
        // block so far: a prompt nobody holds costs one hash, not one per block.
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mut holders: Vec<_> = held
            .iter()
            .filter(|(url, _)| !tried.iter().any(|t| t.url == **url))
            .map(|(url, h)| (url, h.blocks.lock().unwrap_or_else(PoisonError::into_inner)))
            .collect();
        let mut best: Option<&String> = None;
        let mut parent = None;
        for block in prompt.chunks_exact(self.config.block_size) {
            let full = self.hasher.block(parent.as_ref(), block);
            let id = external(&full);
            holders.retain(|(_, blocks)| blocks.contains(&id));
            match holders.first() {
                Some((url, _blocks)) => best = Some(*url),
                None => break,
            }
            parent = Some(full);
        }
        let url = best?;
        let replica = pool.member(url)?;
        if !replica.admits_now() {
            return None;
        }
        self.routed.fetch_add(1, Ordering::Relaxed);
        Some(replica)
    }

    /// Hashes known per replica (for `stats`).
    pub(crate) fn known(&self, url: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(url).map_or(0, |h| {
            h.blocks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
        })
    }
}

/// Reads `endpoint`'s events into `held` until the replica leaves, reconnecting each second.
fn subscribe_forever(endpoint: &str, topic: &str, held: &Held, max_blocks: usize) {
    while !held.gone.load(Ordering::Relaxed) {
        let _ = follow_once(endpoint, topic, held, max_blocks);
        // Whatever was known may be stale now.
        held.blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn follow_once(endpoint: &str, topic: &str, held: &Held, max_blocks: usize) -> std::io::Result<()> {
    let address = endpoint.parse().or_else(|_| {
        std::net::ToSocketAddrs::to_socket_addrs(endpoint)?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))
    })?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    zmtp::handshake(&mut stream, "SUB")?;
    zmtp::subscribe(&mut stream, topic.as_bytes())?;
    // Idle publishers send nothing, so reads wait without a limit (a timeout mid-frame would
    // lose the framing); a replica that left is noticed at its next batch.
    stream.set_read_timeout(None)?;
    while !held.gone.load(Ordering::Relaxed) {
        let Incoming::Message(frames) = zmtp::read(&mut stream, false)? else {
            continue;
        };
        let Some(Ok(batch)) = frames.get(2).map(|p| EventBatch::decode(p)) else {
            continue;
        };
        let mut blocks = held.blocks.lock().unwrap_or_else(PoisonError::into_inner);
        for event in batch.events {
            match event {
                Event::BlockStored { block_hashes, .. } => {
                    if blocks.len() + block_hashes.len() > max_blocks {
                        blocks.clear();
                    }
                    blocks.extend(block_hashes);
                }
                Event::BlockRemoved { block_hashes } => {
                    for h in &block_hashes {
                        blocks.remove(h);
                    }
                }
                Event::AllBlocksCleared => blocks.clear(),
            }
        }
    }
    Ok(())
}
