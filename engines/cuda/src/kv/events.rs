//! KV-cache events (`kv_events`): the prefix cache reports each full block it starts holding
//! and each block it drops, with the block's hash as vLLM computes it for the same token ids
//! (see `turnpike-kv-events`), so KV-aware routers see what this engine holds. The log is
//! filled by the prefix index and drained by the worker after each step into a ZeroMQ
//! publisher; a log that is not drained in time is cut to one `AllBlocksCleared` (consumers
//! then forget this engine's blocks, which is safe), so it stays bounded.

use serde::Deserialize;
use turnpike_kv_events::hash::{self, BlockHash, DEFAULT_SEED};
use turnpike_kv_events::{BlockHasher, Event};

/// Where and how a model publishes its KV events.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsSettings {
    /// The PUB socket's address (`tcp://*:5557`, `tcp://127.0.0.1:5557`).
    pub endpoint: String,
    /// The topic of every batch (vLLM's `topic`; llm-d names `kv@<pod>@<model>`).
    #[serde(default)]
    pub topic: String,
    /// The seed of the first block's parent hash: vLLM's `PYTHONHASHSEED`, or its default.
    #[serde(default = "default_seed")]
    pub hash_seed: String,
    /// Batches waiting to be sent at most (and per subscriber); more are dropped, counted.
    #[serde(default = "default_queue")]
    pub queue: usize,
}

fn default_seed() -> String {
    DEFAULT_SEED.into()
}
fn default_queue() -> usize {
    10_000
}

/// Events waiting in a log at most before it is cut to `AllBlocksCleared`.
const MAX_PENDING: usize = 1 << 16;

/// The events since the last drain.
#[derive(Debug, Clone)]
pub struct EventLog {
    hasher: BlockHasher,
    block_size: usize,
    pending: Vec<Event>,
}

impl EventLog {
    /// A log for blocks of `block_size` tokens, hashed from `seed`.
    pub fn new(seed: &str, block_size: usize) -> Self {
        Self {
            hasher: BlockHasher::new(seed),
            block_size,
            // Whoever listened before this engine started forgets what it held.
            pending: vec![Event::AllBlocksCleared],
        }
    }

    /// A full block of `tokens` after the block hashed `parent` entered the cache; its hash
    /// (`None` for a partial block, which vLLM does not hash).
    pub(super) fn stored(
        &mut self,
        parent: Option<&BlockHash>,
        tokens: &[u32],
    ) -> Option<BlockHash> {
        if tokens.len() != self.block_size {
            return None;
        }
        let full = self.hasher.block(parent, tokens);
        let (id, parent_id) = (hash::external(&full), parent.map(hash::external));
        // Consecutive blocks of one chain go in one event, as vLLM sends them.
        if let Some(Event::BlockStored {
            block_hashes,
            token_ids,
            ..
        }) = self.pending.last_mut()
            && block_hashes.last().copied() == parent_id
            && parent_id.is_some()
        {
            block_hashes.push(id);
            token_ids.extend_from_slice(tokens);
        } else {
            self.push(Event::BlockStored {
                block_hashes: vec![id],
                parent_block_hash: parent_id,
                token_ids: tokens.to_vec(),
                block_size: self.block_size as u32,
            });
        }
        Some(full)
    }

    /// The block hashed `full` left the cache.
    pub(super) fn removed(&mut self, full: &BlockHash) {
        let id = hash::external(full);
        if let Some(Event::BlockRemoved { block_hashes }) = self.pending.last_mut() {
            block_hashes.push(id);
        } else {
            self.push(Event::BlockRemoved {
                block_hashes: vec![id],
            });
        }
    }

    fn push(&mut self, event: Event) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.clear();
            self.pending.push(Event::AllBlocksCleared);
        }
        self.pending.push(event);
    }

    /// The events since the last call.
    pub fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.pending)
    }
}
