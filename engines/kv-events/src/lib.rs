//! `turnpike-kv-events`: KV-cache events in vLLM's format, so KV-aware routers (llm-d's
//! precise prefix scorer, Dynamo, Turnpike's own upstream plugin) see which blocks an engine
//! holds.
//!
//! - [`hash`]: block hashes as vLLM computes them with `prefix_caching_hash_algo = "sha256_cbor"`
//!   (the algorithm vLLM offers for consumers outside Python): each block's hash is SHA-256 of
//!   the canonical CBOR of `(parent hash, token ids, None)`, chained from a seed's hash, and
//!   events carry its low 64 bits as an integer (vLLM's `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).
//! - [`event`]: `BlockStored`, `BlockRemoved` and `AllBlocksCleared` in a `KVEventBatch`,
//!   msgpack in vLLM's array layout, and back.
//! - [`zmtp`]: the ZeroMQ wire (ZMTP 3.0, NULL security, TCP) for a PUB socket that binds and a
//!   SUB socket that connects: three-frame messages (topic, 8-byte big-endian sequence
//!   number, payload), as vLLM's publisher sends them.
//! - [`publisher`]: a bounded queue and a thread that serves subscribers.
//!
//! Std only (threads and blocking sockets), so an engine without an async runtime can publish.

pub mod event;
pub mod hash;
pub mod publisher;
pub mod zmtp;

pub use event::{Event, EventBatch};
pub use hash::BlockHasher;
pub use publisher::{Publisher, PublisherStats};
