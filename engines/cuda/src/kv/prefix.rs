//! The prefix-cache index: one entry per distinct full-block prefix, keyed by chain hash.
//!
//! An entry stores its parent's key and its own tokens, and a lookup compares both, so a key
//! names one exact token prefix. Entries live while at least one block *carries* them (the
//! registered holder, cached or in use, and in-use duplicates of it); when the last carrier goes,
//! the entry and all its descendants are removed. Hence a live entry's parent key always denotes
//! the entry it was created under, which makes the verification complete. On a collision (key
//! taken by a different prefix) the next key is probed with [`rehash`].

use std::collections::HashMap;

use turnpike_kv_events::hash::BlockHash;

use super::events::EventLog;
use super::{BlockId, chain_hash, rehash};

/// What a block carries: the key of its entry and the entry's serial (so a stale tag of a removed
/// entry is never confused with a later entry under the same key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tag {
    pub(super) key: u64,
    serial: u64,
}

/// One distinct prefix.
#[derive(Debug, Clone)]
struct Entry {
    parent: Option<u64>,
    tokens: Box<[u32]>,
    /// The block that can be matched (absent once evicted while duplicates still carry it).
    holder: Option<BlockId>,
    /// Blocks carrying this entry: the holder plus in-use duplicates.
    carriers: u32,
    children: Vec<u64>,
    serial: u64,
    /// Its hash as vLLM computes it (only while KV events are on, and only for full blocks).
    vllm: Option<BlockHash>,
}

/// Where `(parent, tokens)` lives or would live.
enum Slot {
    Found(u64),
    Vacant(u64),
    /// Every probe hit another prefix (not reachable in practice).
    Exhausted,
}

/// Result of [`PrefixIndex::register`].
pub(super) struct Registered {
    /// Tag for the block, `None` when it could not be registered.
    pub(super) tag: Option<Tag>,
    /// Key to hand back to the sequence as the parent of its next block.
    pub(super) key: u64,
}

/// The chain hash function (replaceable in tests to force collisions).
pub(super) type HashFn = fn(Option<u64>, &[u32]) -> u64;

/// Map from chain key to prefix entry; at most one entry per block, so bounded by the block count.
#[derive(Debug, Clone)]
pub(super) struct PrefixIndex {
    entries: HashMap<u64, Entry>,
    /// Entries of a sequence's first block (their parent is `None`).
    roots: Vec<u64>,
    next_serial: u64,
    hash: HashFn,
    /// KV events, when they are on.
    events: Option<EventLog>,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self::with_hash(chain_hash)
    }
}

impl PrefixIndex {
    /// An empty index keyed by `hash`.
    pub(super) fn with_hash(hash: HashFn) -> Self {
        Self {
            entries: HashMap::new(),
            roots: Vec::new(),
            next_serial: 0,
            hash,
            events: None,
        }
    }

    /// Reports stored and removed blocks into `log` from now on.
    pub(super) fn enable_events(&mut self, log: EventLog) {
        self.events = Some(log);
    }

    /// The events since the last call (none when events are off).
    pub(super) fn take_events(&mut self) -> Vec<turnpike_kv_events::Event> {
        self.events.as_mut().map(EventLog::take).unwrap_or_default()
    }

    /// The unprobed key of `(parent, tokens)`.
    pub(super) fn hash(&self, parent: Option<u64>, tokens: &[u32]) -> u64 {
        (self.hash)(parent, tokens)
    }

    fn slot(&self, parent: Option<u64>, tokens: &[u32]) -> Slot {
        let mut key = self.hash(parent, tokens);
        for _ in 0..=self.entries.len() {
            match self.entries.get(&key) {
                None => return Slot::Vacant(key),
                Some(e) if e.parent == parent && *e.tokens == *tokens => return Slot::Found(key),
                Some(_) => key = rehash(key),
            }
        }
        Slot::Exhausted
    }

    /// The key and current holder of the entry for exactly `(parent, tokens)`.
    pub(super) fn lookup(&self, parent: Option<u64>, tokens: &[u32]) -> Option<(u64, BlockId)> {
        match self.slot(parent, tokens) {
            Slot::Found(key) => {
                let holder = self.entries.get(&key)?.holder?;
                Some((key, holder))
            }
            Slot::Vacant(_) | Slot::Exhausted => None,
        }
    }

    /// The holder of the entry after `parent` (`None`: a first block) whose tokens share the
    /// longest start with `rest`, and the length of that start (at least 1): a full or partial
    /// block that holds the first tokens of `rest`, perhaps followed by others.
    pub(super) fn lookup_longest(
        &self,
        parent: Option<u64>,
        rest: &[u32],
    ) -> Option<(BlockId, usize)> {
        let children = match parent {
            Some(p) => &self.entries.get(&p)?.children,
            None => &self.roots,
        };
        children
            .iter()
            .filter_map(|key| {
                let e = self.entries.get(key)?;
                let common = e
                    .tokens
                    .iter()
                    .zip(rest)
                    .take_while(|(a, b)| a == b)
                    .count();
                (e.parent == parent && common > 0).then_some((e.holder?, common))
            })
            .max_by_key(|&(_, common)| common)
    }

    /// Whether `tag` still names a live entry.
    pub(super) fn is_live(&self, tag: Tag) -> bool {
        self.entries
            .get(&tag.key)
            .is_some_and(|e| e.serial == tag.serial)
    }

    /// Whether `b` is the live holder of `tag`'s entry.
    pub(super) fn is_holder(&self, tag: Tag, b: BlockId) -> bool {
        self.entries
            .get(&tag.key)
            .is_some_and(|e| e.serial == tag.serial && e.holder == Some(b))
    }

    /// Makes `b` carry the entry `(parent, tokens)`, creating it if needed; `b` becomes the
    /// holder when the entry has none. A parent that is not a live entry cannot be verified, so
    /// nothing is registered then.
    pub(super) fn register(
        &mut self,
        parent: Option<u64>,
        tokens: &[u32],
        b: BlockId,
    ) -> Registered {
        let unregistered = Registered {
            tag: None,
            key: self.hash(parent, tokens),
        };
        if parent.is_some_and(|p| !self.entries.contains_key(&p)) {
            return unregistered;
        }
        match self.slot(parent, tokens) {
            Slot::Found(key) => match self.entries.get_mut(&key) {
                Some(e) => {
                    e.carriers = e.carriers.saturating_add(1);
                    if e.holder.is_none() {
                        e.holder = Some(b);
                    }
                    Registered {
                        tag: Some(Tag {
                            key,
                            serial: e.serial,
                        }),
                        key,
                    }
                }
                None => unregistered,
            },
            Slot::Vacant(key) => {
                let serial = self.next_serial;
                self.next_serial += 1;
                let vllm = match (&mut self.events, parent) {
                    (Some(log), None) => log.stored(None, tokens),
                    (Some(log), Some(p)) => match self.entries.get(&p).and_then(|e| e.vllm) {
                        Some(parent_hash) => log.stored(Some(&parent_hash), tokens),
                        None => None,
                    },
                    (None, _) => None,
                };
                self.entries.insert(
                    key,
                    Entry {
                        parent,
                        tokens: tokens.into(),
                        holder: Some(b),
                        carriers: 1,
                        children: Vec::new(),
                        serial,
                        vllm,
                    },
                );
                match parent.and_then(|p| self.entries.get_mut(&p)) {
                    Some(p) => p.children.push(key),
                    None => self.roots.push(key),
                }
                Registered {
                    tag: Some(Tag { key, serial }),
                    key,
                }
            }
            Slot::Exhausted => unregistered,
        }
    }

    /// The holder `b` of `tag` is evicted: it stops being the holder and stops carrying the
    /// entry. Holders of removed entries are appended to `dropped`.
    pub(super) fn evict_holder(&mut self, tag: Tag, b: BlockId, dropped: &mut Vec<BlockId>) {
        if let Some(e) = self.entries.get_mut(&tag.key)
            && e.serial == tag.serial
            && e.holder == Some(b)
        {
            e.holder = None;
        }
        self.drop_carrier(tag, dropped);
    }

    /// One carrier of `tag` is gone; at zero carriers the entry and its descendants are removed
    /// and the holders of the removed entries are appended to `dropped`. Stale tags are
    /// ignored.
    pub(super) fn drop_carrier(&mut self, tag: Tag, dropped: &mut Vec<BlockId>) {
        let Some(e) = self.entries.get_mut(&tag.key) else {
            return;
        };
        if e.serial != tag.serial {
            return;
        }
        e.carriers = e.carriers.saturating_sub(1);
        if e.carriers > 0 {
            return;
        }
        let parent = e.parent;
        match parent.and_then(|p| self.entries.get_mut(&p)) {
            Some(p) => p.children.retain(|&c| c != tag.key),
            None => self.roots.retain(|&c| c != tag.key),
        }
        let mut stack = vec![tag.key];
        while let Some(key) = stack.pop() {
            if let Some(e) = self.entries.remove(&key) {
                if let (Some(log), Some(h)) = (&mut self.events, &e.vllm) {
                    log.removed(h);
                }
                dropped.extend(e.holder);
                stack.extend(e.children);
            }
        }
    }

    /// Number of live entries.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}
