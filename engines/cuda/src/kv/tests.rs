#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// Allocates blocks for `tokens` and registers its full blocks like a sequence would.
fn fill(bm: &mut BlockManager, tokens: &[u32]) -> (Vec<BlockId>, Vec<u64>) {
    let bs = bm.block_size();
    let mut table = Vec::new();
    let mut hashes: Vec<u64> = Vec::new();
    for chunk in tokens.chunks(bs) {
        let b = bm.allocate().unwrap();
        table.push(b);
        if chunk.len() == bs {
            hashes.push(bm.register_full(b, hashes.last().copied(), chunk));
        }
    }
    (table, hashes)
}

fn release_all(bm: &mut BlockManager, table: &[BlockId]) {
    for &b in table.iter().rev() {
        bm.release(b);
    }
}

fn check_counts(bm: &BlockManager) {
    let s = bm.stats();
    assert_eq!(s.used + s.cached + s.free, s.total);
    assert_eq!(bm.available() + s.used, s.total);
    assert!(bm.entries() <= s.total);
}

#[test]
fn allocate_release_and_ref_counts() {
    let mut bm = BlockManager::new(4, 2);
    assert_eq!(
        (bm.num_blocks(), bm.block_size(), bm.available()),
        (4, 2, 4)
    );
    let blocks: Vec<_> = (0..4).map(|_| bm.allocate().unwrap()).collect();
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 1, 2, 3]);
    assert_eq!(bm.allocate(), None);
    assert_eq!(bm.available(), 0);
    bm.retain(blocks[0]);
    assert_eq!(bm.ref_count(blocks[0]), 2);
    bm.release(blocks[0]);
    assert_eq!(bm.ref_count(blocks[0]), 1);
    assert_eq!(bm.available(), 0);
    bm.release(blocks[0]);
    assert_eq!(bm.ref_count(blocks[0]), 0);
    assert_eq!(bm.available(), 1);
    bm.release(blocks[0]); // double release is ignored
    assert_eq!(bm.available(), 1);
    assert_eq!(bm.allocate(), Some(blocks[0]));
    bm.release(99); // unknown ids are ignored
    assert_eq!(bm.ref_count(99), 0);
    check_counts(&bm);
}

#[test]
fn second_sequence_matches_shared_full_blocks() {
    let mut bm = BlockManager::new(16, 2);
    let (t1, h1) = fill(&mut bm, &[1, 2, 3, 4, 5]);
    assert_eq!(h1.len(), 2);
    let m = bm.match_prefix(&[1, 2, 3, 4, 9, 9]);
    assert_eq!(m.blocks, t1[..2].to_vec());
    assert_eq!(m.hashes, h1);
    assert_eq!(bm.ref_count(t1[0]), 2);
    assert_eq!(bm.ref_count(t1[2]), 1);
    release_all(&mut bm, &m.blocks);
    // Still matchable once the owner is gone (cached).
    release_all(&mut bm, &t1);
    assert_eq!(bm.stats().cached, 2);
    let m = bm.match_prefix(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(m.blocks.len(), 2);
    assert_eq!(bm.stats().cached, 0);
    assert_eq!(h1[0], chain_hash(None, &[1, 2]));
    assert_eq!(h1[1], chain_hash(Some(h1[0]), &[3, 4]));
    check_counts(&bm);
}

#[test]
fn same_block_after_another_prefix_does_not_match() {
    let mut bm = BlockManager::new(16, 2);
    let (t1, _) = fill(&mut bm, &[1, 2, 3, 4]);
    assert!(bm.match_prefix(&[7, 7, 3, 4]).blocks.is_empty());
    let (t2, _) = fill(&mut bm, &[7, 7, 3, 4]);
    let m = bm.match_prefix(&[1, 2, 3, 4]);
    assert_eq!(m.blocks, t1);
    let m2 = bm.match_prefix(&[7, 7, 3, 4]);
    assert_eq!(m2.blocks, t2);
    assert_ne!(chain_hash(None, &[3, 4]), chain_hash(Some(1), &[3, 4]));
    check_counts(&bm);
}

#[test]
fn eviction_is_lru_of_release_time() {
    let mut bm = BlockManager::new(3, 1);
    let (x, _) = fill(&mut bm, &[10]);
    let (y, _) = fill(&mut bm, &[20]);
    let (z, _) = fill(&mut bm, &[30]);
    bm.release(y[0]);
    bm.release(x[0]);
    bm.release(z[0]);
    assert_eq!(bm.stats().cached, 3);
    assert_eq!(bm.allocate(), Some(y[0]));
    assert_eq!(bm.stats().evictions, 1);
    assert!(bm.match_prefix(&[20]).blocks.is_empty());
    // Matching x refreshes nothing in the LRU (it leaves it); z is next.
    assert_eq!(bm.match_prefix(&[10]).blocks, x);
    assert_eq!(bm.allocate(), Some(z[0]));
    assert_eq!(bm.allocate(), None);
    check_counts(&bm);
}

#[test]
fn plain_free_blocks_go_before_cached_ones() {
    let mut bm = BlockManager::new(3, 1);
    let (a, _) = fill(&mut bm, &[5]);
    bm.release(a[0]);
    assert_eq!(bm.available(), 3);
    let b1 = bm.allocate().unwrap();
    let b2 = bm.allocate().unwrap();
    assert!(b1 != a[0] && b2 != a[0]);
    assert_eq!(bm.stats().evictions, 0);
    assert_eq!(bm.match_prefix(&[5]).blocks, a);
    bm.release(a[0]);
    assert_eq!(bm.allocate(), Some(a[0]));
    assert_eq!(bm.stats().evictions, 1);
    check_counts(&bm);
}

#[test]
fn copy_on_write_only_when_shared() {
    let mut bm = BlockManager::new(2, 4);
    let a = bm.allocate().unwrap();
    assert_eq!(bm.make_writable(a), Ok(None));
    bm.retain(a);
    let copy = bm.make_writable(a).unwrap().unwrap();
    assert_eq!(copy.src, a);
    assert_ne!(copy.dst, a);
    assert_eq!((bm.ref_count(a), bm.ref_count(copy.dst)), (1, 1));
    assert_eq!(bm.make_writable(copy.dst), Ok(None));
    bm.retain(a);
    assert_eq!(bm.make_writable(a), Err(OutOfBlocks));
    assert_eq!(bm.ref_count(a), 2);
    assert_eq!(OutOfBlocks.to_string(), "no free KV-cache block");
    check_counts(&bm);
}

#[test]
fn stats_and_hit_rate() {
    let mut bm = BlockManager::new(8, 2);
    assert_eq!(bm.stats().prefix_hit_rate(), 0.0);
    let (t, _) = fill(&mut bm, &[1, 2, 3, 4]);
    let m = bm.match_prefix(&[1, 2, 3, 4, 5]); // 2 full blocks queried, 2 hit
    let n = bm.match_prefix(&[9, 9, 3, 4]); // 2 queried, 0 hit
    assert!(n.blocks.is_empty());
    let s = bm.stats();
    assert_eq!((s.prefix_queried_tokens, s.prefix_hit_tokens), (8, 4));
    assert!((s.prefix_hit_rate() - 0.5).abs() < 1e-12);
    assert_eq!((s.used, s.cached, s.free), (2, 0, 6));
    release_all(&mut bm, &m.blocks);
    release_all(&mut bm, &t);
    let s = bm.stats();
    assert_eq!((s.used, s.cached, s.free), (0, 2, 6));
    let peek = bm.peek_prefix(&[1, 2, 3, 4]);
    assert_eq!((peek.blocks, peek.idle), (2, 2));
    assert_eq!(bm.stats(), s, "peek changes nothing");
    check_counts(&bm);
}

#[test]
fn duplicate_registration_stays_plain() {
    let mut bm = BlockManager::new(8, 2);
    let (t1, h1) = fill(&mut bm, &[1, 2]);
    let (t2, h2) = fill(&mut bm, &[1, 2]);
    assert_eq!(h1, h2);
    release_all(&mut bm, &t2);
    assert_eq!((bm.stats().cached, bm.stats().free), (0, 7));
    release_all(&mut bm, &t1);
    assert_eq!(bm.stats().cached, 1);
    assert_eq!(bm.entries(), 1);
    check_counts(&bm);
}

fn constant_hash(_: Option<u64>, _: &[u32]) -> u64 {
    42
}

#[test]
fn collisions_compare_tokens_and_parents() {
    // Every chain hash collides: identities must still be told apart.
    let mut bm = BlockManager::with_hash(16, 2, constant_hash);
    let (a, ha) = fill(&mut bm, &[1, 2, 3, 4]);
    let (b, hb) = fill(&mut bm, &[3, 4]);
    assert_ne!(ha[1], hb[0]);
    assert_eq!(bm.match_prefix(&[3, 4]).blocks, b);
    assert_eq!(bm.match_prefix(&[1, 2, 3, 4]).blocks, a);
    assert!(bm.match_prefix(&[5, 6]).blocks.is_empty());
    assert!(bm.match_prefix(&[3, 4, 3, 4]).blocks.len() == 1);
    check_counts(&bm);
}

#[test]
fn evicting_a_parent_drops_its_cached_descendants() {
    let mut bm = BlockManager::with_hash(2, 2, constant_hash);
    let (t, _) = fill(&mut bm, &[1, 2, 3, 4]);
    // Release the first block first: it is evicted first.
    bm.release(t[0]);
    bm.release(t[1]);
    assert_eq!(bm.entries(), 2);
    let a = bm.allocate().unwrap();
    assert_eq!(a, t[0]);
    let s = bm.stats();
    assert_eq!((s.evictions, s.cached, s.free, bm.entries()), (2, 0, 1, 0));
    // A different first block may now take the same key; the old child must not match after it.
    let h = bm.register_full(a, None, &[5, 6]);
    assert_eq!(h, 42);
    assert_eq!(bm.match_prefix(&[5, 6, 3, 4]).blocks, vec![a]);
    check_counts(&bm);
}

#[test]
fn register_needs_a_live_parent_and_a_full_block() {
    let mut bm = BlockManager::new(4, 2);
    let b = bm.allocate().unwrap();
    bm.register_full(b, Some(12345), &[1, 2]);
    bm.release(b);
    assert_eq!(bm.stats().cached, 0, "unverifiable parent: not cached");
    let b = bm.allocate().unwrap();
    bm.register_full(b, None, &[1]);
    bm.release(b);
    assert_eq!(bm.stats().cached, 0, "partial block: not cached");
    let free = bm.allocate().unwrap();
    bm.release(free);
    bm.register_full(free, None, &[1, 2]);
    assert_eq!(bm.entries(), 0, "free block: not registered");
    check_counts(&bm);
}

#[test]
fn dup_keeps_entry_alive_and_can_become_holder() {
    let mut bm = BlockManager::new(3, 1);
    let (a, ha) = fill(&mut bm, &[7]);
    let (d, hd) = fill(&mut bm, &[7]); // duplicate carrier
    assert_eq!(ha, hd);
    bm.release(a[0]); // cached holder
    let x = bm.allocate().unwrap(); // plain block
    let y = bm.allocate().unwrap(); // evicts the holder
    assert_eq!(y, a[0]);
    assert!(bm.match_prefix(&[7]).blocks.is_empty(), "no holder left");
    assert_eq!(bm.entries(), 1, "the duplicate still carries the entry");
    // The duplicate's child registers under the live entry.
    bm.release(x);
    let c = bm.allocate().unwrap();
    let hc = bm.register_full(c, Some(hd[0]), &[8]);
    assert_eq!(hc, chain_hash(Some(hd[0]), &[8]));
    assert_eq!(bm.entries(), 2);
    bm.release(d[0]); // last carrier of the parent: parent and child entries go
    assert_eq!(bm.entries(), 0);
    bm.release(c);
    bm.release(y);
    assert_eq!(bm.stats().free, 3);
    check_counts(&bm);
}

#[test]
fn reuse_is_token_granular_below_the_block() {
    let mut bm = BlockManager::new(8, 4);
    let (t, _) = fill(&mut bm, &[1, 2, 3, 4, 5, 6, 7, 8]);
    release_all(&mut bm, &t);
    // Full blocks, then 5, 6: the second cached block begins with them.
    let prompt = [1, 2, 3, 4, 5, 6];
    let peek = bm.peek_reusable(&prompt);
    assert_eq!((peek.blocks, peek.idle, peek.tokens), (2, 2, 6));
    let m = bm.match_reusable(&prompt);
    assert_eq!(
        (m.blocks.clone(), m.hashes.len(), m.tokens),
        (t.clone(), 1, 6)
    );
    // Another continuation shares what it shares, also in a sequence's first block.
    assert_eq!(bm.peek_reusable(&[1, 2, 3, 4, 5, 9]).tokens, 5);
    assert_eq!(bm.peek_reusable(&[1, 2]).tokens, 2);
    assert_eq!(bm.peek_reusable(&[7, 2]).tokens, 0);
    // Writing goes to a copy; the cached block returns to the cache untouched.
    let copy = bm.copy_for_write(t[1]).unwrap();
    assert_eq!(copy.src, t[1]);
    assert_ne!(copy.dst, t[1]);
    release_all(&mut bm, &[m.blocks[0], copy.dst]);
    assert_eq!(bm.stats().cached, 2);
    check_counts(&bm);
}

#[test]
fn the_partial_last_block_of_a_finished_sequence_is_reused() {
    let mut bm = BlockManager::new(8, 4);
    // Six tokens: one full block and a partial one holding 5, 6.
    let a = bm.allocate().unwrap();
    let b = bm.allocate().unwrap();
    let key = bm.register_full(a, None, &[1, 2, 3, 4]);
    bm.register_partial(b, Some(key), &[5, 6]);
    release_all(&mut bm, &[a, b]);
    assert_eq!(bm.stats().cached, 2);
    // The same prompt, and one that diverges inside the partial block.
    let m = bm.match_reusable(&[1, 2, 3, 4, 5, 6]);
    assert_eq!((m.blocks.clone(), m.tokens), (vec![a, b], 6));
    release_all(&mut bm, &m.blocks);
    assert_eq!(bm.peek_reusable(&[1, 2, 3, 4, 5, 7, 8]).tokens, 5);
    // A shared block or a full one is not registered as partial.
    let c = bm.allocate().unwrap();
    bm.retain(c);
    bm.register_partial(c, Some(key), &[9]);
    release_all(&mut bm, &[c, c]);
    assert_eq!(bm.peek_reusable(&[1, 2, 3, 4, 9]).tokens, 4);
    check_counts(&bm);
}

#[test]
fn kv_events_name_stored_and_evicted_blocks_with_vllms_hashes() {
    use turnpike_kv_events::hash::external;
    use turnpike_kv_events::{BlockHasher, Event};

    let mut bm = BlockManager::new(3, 2);
    bm.enable_events(events::EventLog::new("vllm-none-hash", 2));
    let (table, _) = fill(&mut bm, &[1, 2, 3, 4, 5]);
    // A partial block is not stored; the two full ones are one event, in chain order.
    let chain: Vec<u64> = BlockHasher::default()
        .chain(&[1, 2, 3, 4], 2)
        .iter()
        .map(external)
        .collect();
    assert_eq!(
        bm.take_events(),
        [
            Event::AllBlocksCleared,
            Event::BlockStored {
                block_hashes: chain.clone(),
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
            }
        ]
    );
    release_all(&mut bm, &table);
    // Another prefix takes every block: the cached ones are evicted, and said so.
    let (other, _) = fill(&mut bm, &[9, 9, 8, 8, 7]);
    let events = bm.take_events();
    let removed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::BlockRemoved { block_hashes } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(removed.len(), 2);
    assert!(removed.iter().all(|h| chain.contains(h)));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::BlockStored { token_ids, .. } if token_ids[..2] == [9, 9]))
    );
    release_all(&mut bm, &other);
    assert!(bm.take_events().is_empty());
}
