//! Token ids of the prompts a model saw lately, by their exact text, so a repeated prompt (the
//! same system prompt and question, a retried request, an evaluation run) is not tokenized
//! again. Keyed by the whole text and whether special tokens were added, never by a hash, so a
//! hit is exactly what the tokenizer would return. Bounded by entries and bytes; the oldest
//! entry goes first (insertion order: a cheap FIFO, no bookkeeping on hits).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

/// Prompts longer than this are not kept (long documents are rarely repeated exactly).
pub const MAX_TEXT_BYTES: usize = 64 << 10;

/// A bounded cache of prompt token ids.
#[derive(Debug)]
pub struct PromptCache {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By text, without and with the tokenizer's special tokens added.
    map: [HashMap<Arc<str>, Arc<[u32]>>; 2],
    order: VecDeque<(usize, Arc<str>)>,
    bytes: usize,
}

/// The bytes an entry holds.
fn size(text: &str, ids: &[u32]) -> usize {
    text.len() + ids.len() * 4 + 64
}

impl PromptCache {
    /// A cache of at most `max_entries` prompts and `max_bytes` bytes (0 of either: off).
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            max_entries,
            max_bytes,
            inner: Mutex::default(),
        }
    }

    /// The ids of `text`, if kept.
    pub fn get(&self, text: &str, add_special: bool) -> Option<Arc<[u32]>> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.map[usize::from(add_special)].get(text).cloned()
    }

    /// Keeps `ids` as the tokens of `text`, evicting the oldest entries past the bounds; the
    /// bytes held afterwards.
    pub fn insert(&self, text: &str, add_special: bool, ids: &[u32]) -> usize {
        let bytes = size(text, ids);
        let side = usize::from(add_special);
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = text.len() <= MAX_TEXT_BYTES && bytes <= self.max_bytes && self.max_entries > 0;
        if !kept || inner.map[side].contains_key(text) {
            return inner.bytes;
        }
        while inner.order.len() >= self.max_entries || inner.bytes + bytes > self.max_bytes {
            let Some((old_side, old)) = inner.order.pop_front() else {
                break;
            };
            if let Some(gone) = inner.map[old_side].remove(&old) {
                inner.bytes -= size(&old, &gone);
            }
        }
        let key: Arc<str> = Arc::from(text);
        inner.order.push_back((side, Arc::clone(&key)));
        inner.map[side].insert(key, Arc::from(ids));
        inner.bytes += bytes;
        inner.bytes
    }

    /// Entries and bytes held.
    pub fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (inner.order.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_exact_texts_within_its_bounds() {
        let cache = PromptCache::new(2, 1 << 20);
        cache.insert("a", false, &[1]);
        cache.insert("b", true, &[2, 3]);
        assert_eq!(cache.get("a", false).as_deref(), Some(&[1][..]));
        assert_eq!(cache.get("a", true), None);
        cache.insert("c", false, &[4]);
        // The oldest went.
        assert_eq!(cache.get("a", false), None);
        assert_eq!(cache.held().0, 2);
        let small = PromptCache::new(100, 200);
        small.insert("x", false, &[0; 20]);
        small.insert("y", false, &[0; 20]);
        assert!(small.held().1 <= 200);
        assert_eq!(small.get("x", false), None);
        small.insert(&"z".repeat(MAX_TEXT_BYTES + 1), false, &[1]);
        assert_eq!(small.held().0, 1);
    }
}
