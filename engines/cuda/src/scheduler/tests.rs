#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::*;

pub(super) fn config(budget: usize, max_running: usize, bs: u32, blocks: u32) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens: budget,
        max_running,
        max_waiting: 1000,
        block_size: bs,
        num_blocks: blocks,
    }
}

pub(super) fn new_seq(
    id: SeqId,
    tokens: Vec<u32>,
    priority: i32,
    tenant: &str,
    weight: u32,
) -> NewSequence {
    NewSequence {
        id,
        tokens,
        priority,
        tenant: tenant.into(),
        weight,
    }
}

/// A prompt sharing no block with other ids' prompts.
pub(super) fn prompt(id: SeqId, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| id as u32 * 1000 + i).collect()
}

/// Block accounting invariants.
pub(super) fn check(s: &Scheduler) {
    let kv = s.stats().kv;
    assert_eq!(s.blocks.available() + kv.used, kv.total);
    assert_eq!(kv.used + kv.cached + kv.free, kv.total);
    let mut refs: BTreeMap<BlockId, u32> = BTreeMap::new();
    for (id, seq) in &s.seqs {
        if !s.running.contains(id) {
            assert!(
                seq.table.is_empty() && seq.computed == 0,
                "waiting {id} holds blocks"
            );
        }
        assert!(seq.hashes.len() <= seq.table.len());
        for &b in &seq.table {
            *refs.entry(b).or_default() += 1;
        }
    }
    assert_eq!(
        refs.len(),
        kv.used,
        "used blocks are exactly those in tables"
    );
    for (b, n) in refs {
        assert_eq!(s.blocks.ref_count(b), n, "ref count of block {b}");
    }
    assert_eq!(s.stats().waiting + s.stats().running, s.seqs.len());
}

/// Plan invariants.
pub(super) fn check_plan(s: &Scheduler, plan: &StepPlan) {
    assert!(plan.num_tokens() <= s.config.max_batch_tokens);
    let bs = s.blocks.block_size();
    let mut seen = BTreeSet::new();
    for c in &plan.chunks {
        assert!(seen.insert(c.seq), "one chunk per sequence");
        assert!(!c.tokens.is_empty());
        let all = s.tokens(c.seq).unwrap();
        let real = c.tokens.len() - c.drafts;
        assert!(real >= 1, "a chunk computes at least one real token");
        assert_eq!(&all[c.start..c.start + real], &c.tokens[..real]);
        assert!(c.block_table.len() * bs >= c.start + c.tokens.len());
        assert_eq!(c.sample, c.start + real == all.len());
        assert!(
            c.drafts == 0 || c.sample,
            "drafts follow a sequence's last token"
        );
    }
}

/// One engine step: schedule, complete, append a token to sampled sequences.
pub(super) fn step(s: &mut Scheduler, next: &mut u32) -> StepPlan {
    let plan = s.schedule();
    check_plan(s, &plan);
    s.complete(&plan);
    for c in plan.chunks.iter().filter(|c| c.sample) {
        *next += 1;
        s.append(c.seq, 900_000 + *next);
    }
    check(s);
    plan
}

/// Runs up to `steps` steps, removing a sequence once it generated `gen` tokens, and calls `each`
/// with every plan. Returns whether the scheduler became idle.
pub(super) fn run(
    s: &mut Scheduler,
    max_gen: usize,
    steps: usize,
    mut each: impl FnMut(&Scheduler, &StepPlan),
) -> bool {
    let mut next = 0;
    let mut generated: HashMap<SeqId, usize> = HashMap::new();
    for _ in 0..steps {
        if s.is_idle() {
            return true;
        }
        let plan = step(s, &mut next);
        each(s, &plan);
        for c in plan.chunks.iter().filter(|c| c.sample) {
            let g = generated.entry(c.seq).or_default();
            *g += 1;
            if *g >= max_gen {
                s.remove(c.seq);
            }
        }
        check(s);
    }
    s.is_idle()
}

/// [`run`] until idle.
pub(super) fn drive(
    s: &mut Scheduler,
    max_gen: usize,
    steps: usize,
    each: impl FnMut(&Scheduler, &StepPlan),
) {
    assert!(run(s, max_gen, steps, each), "not idle after {steps} steps");
    let kv = s.stats().kv;
    assert_eq!((kv.used, s.block_manager().available()), (0, kv.total));
}

#[test]
fn validate_config() {
    assert!(config(8, 4, 16, 10).validate().is_ok());
    assert!(config(3, 4, 16, 10).validate().is_err());
    assert!(config(8, 0, 16, 10).validate().is_err());
    assert!(config(8, 4, 0, 10).validate().is_err());
    assert!(config(8, 4, 16, 0).validate().is_err());
    let mut c = config(8, 4, 16, 10);
    c.max_waiting = 0;
    assert!(c.validate().is_err());
}

#[test]
fn refusals() {
    let mut c = config(16, 4, 4, 2);
    c.max_waiting = 2;
    let mut s = Scheduler::new(c);
    let too_long = s.add(new_seq(1, prompt(1, 8), 0, "t", 1));
    assert_eq!(
        too_long,
        Err(Refused::TooLong {
            needed_blocks: 3,
            total_blocks: 2
        })
    );
    assert!(too_long.unwrap_err().to_string().contains("3 KV blocks"));
    assert_eq!(s.add(new_seq(1, vec![], 0, "t", 1)), Err(Refused::Empty));
    s.add(new_seq(1, prompt(1, 7), 0, "t", 1)).unwrap();
    assert_eq!(
        s.add(new_seq(1, prompt(1, 3), 0, "t", 1)),
        Err(Refused::DuplicateId)
    );
    s.add(new_seq(2, prompt(2, 3), 0, "t", 1)).unwrap();
    assert_eq!(
        s.add(new_seq(3, prompt(3, 3), 0, "t", 1)),
        Err(Refused::QueueFull)
    );
    assert_eq!(Refused::QueueFull.to_string(), "the waiting queue is full");
    assert_eq!(s.stats().waiting, 2);
}

#[test]
fn budget_and_decode_first() {
    let mut s = Scheduler::new(config(8, 4, 4, 64));
    let mut next = 0;
    for id in 1..=3 {
        s.add(new_seq(id, prompt(id, 2), 0, "t", 1)).unwrap();
    }
    let plan = step(&mut s, &mut next);
    assert_eq!(plan.num_tokens(), 6);
    assert!(plan.chunks.iter().all(|c| c.sample));
    s.add(new_seq(9, prompt(9, 20), 0, "t", 1)).unwrap();
    let plan = step(&mut s, &mut next);
    let decodes: Vec<_> = plan
        .chunks
        .iter()
        .take(3)
        .map(|c| (c.seq, c.tokens.len()))
        .collect();
    assert_eq!(decodes, vec![(1, 1), (2, 1), (3, 1)]);
    let long = &plan.chunks[3];
    assert_eq!(
        (long.seq, long.start, long.tokens.len(), long.sample),
        (9, 0, 5, false)
    );
    assert_eq!(plan.num_tokens(), 8);
    let plan = step(&mut s, &mut next);
    assert_eq!(plan.chunks.len(), 4);
    assert_eq!((plan.chunks[3].start, plan.chunks[3].tokens.len()), (5, 5));
}

#[test]
fn chunked_prefill_samples_only_at_the_end() {
    let mut s = Scheduler::new(config(4, 2, 4, 16));
    s.add(new_seq(1, prompt(1, 10), 0, "t", 1)).unwrap();
    let mut next = 0;
    let shape: Vec<_> = (0..4)
        .map(|_| {
            let p = step(&mut s, &mut next);
            let c = &p.chunks[0];
            (c.start, c.tokens.len(), c.sample)
        })
        .collect();
    assert_eq!(
        shape,
        vec![(0, 4, false), (4, 4, false), (8, 2, true), (10, 1, true)]
    );
    assert_eq!(s.tokens(1).unwrap().len(), 12);
}

#[test]
fn max_running_is_respected() {
    let mut s = Scheduler::new(config(64, 2, 4, 64));
    for id in 1..=5 {
        s.add(new_seq(id, prompt(id, 3), 0, "t", 1)).unwrap();
    }
    let mut next = 0;
    for _ in 0..3 {
        let plan = step(&mut s, &mut next);
        assert_eq!(plan.chunks.len(), 2);
        assert_eq!((s.stats().running, s.stats().waiting), (2, 3));
    }
}

#[test]
fn higher_priority_is_admitted_first() {
    let mut s = Scheduler::new(config(64, 1, 4, 64));
    s.add(new_seq(1, prompt(1, 3), 0, "a", 1)).unwrap();
    s.add(new_seq(2, prompt(2, 3), 5, "b", 1)).unwrap();
    s.add(new_seq(3, prompt(3, 3), -1, "a", 1)).unwrap();
    s.add(new_seq(4, prompt(4, 3), 5, "a", 1)).unwrap();
    let mut order = Vec::new();
    drive(&mut s, 1, 100, |_, p| {
        order.extend(p.chunks.iter().filter(|c| c.start == 0).map(|c| c.seq));
    });
    assert_eq!(order, vec![2, 4, 1, 3]);
}

#[test]
fn remove_frees_blocks_at_once() {
    let mut s = Scheduler::new(config(64, 1, 4, 16));
    s.add(new_seq(1, prompt(1, 9), 0, "t", 1)).unwrap();
    s.add(new_seq(2, prompt(2, 9), 0, "t", 1)).unwrap();
    let mut next = 0;
    step(&mut s, &mut next);
    assert_eq!(s.stats().kv.used, 3);
    s.remove(2); // waiting
    assert_eq!((s.stats().waiting, s.stats().running), (0, 1));
    s.remove(1); // running
    let kv = s.stats().kv;
    assert_eq!((kv.used, s.block_manager().available()), (0, 16));
    assert!(s.is_idle());
    s.remove(1); // unknown: ignored
    assert_eq!(s.tokens(1), None);
    check(&s);
}

#[test]
fn fork_shares_blocks_and_copies_on_first_write() {
    let mut s = Scheduler::new(config(64, 4, 4, 16));
    s.add(new_seq(1, prompt(1, 6), 0, "t", 1)).unwrap();
    let plan = s.schedule();
    s.complete(&plan);
    assert!(plan.chunks[0].sample);
    assert!(s.fork(1, 2));
    assert!(!s.fork(1, 2), "child id in use");
    assert!(!s.fork(7, 8), "unknown parent");
    s.append(1, 11);
    s.append(2, 22);
    let table = s.seqs[&1].table.clone();
    assert_eq!(s.seqs[&2].table, table);
    assert_eq!(s.block_manager().ref_count(table[1]), 2);
    assert_eq!(s.stats().running, 2);
    check(&s);
    let plan = s.schedule();
    assert_eq!(plan.chunks.len(), 2);
    assert_eq!(plan.copies.len(), 1);
    assert_eq!(plan.copies[0].src, table[1]);
    s.complete(&plan);
    let (t1, t2) = (&s.seqs[&1].table, &s.seqs[&2].table);
    assert_eq!(t1[0], t2[0], "full block stays shared");
    assert_ne!(t1[1], t2[1], "partial block was copied");
    assert_eq!(s.block_manager().ref_count(t1[0]), 2);
    check(&s);
    // Further writes need no copy.
    s.append(1, 12);
    s.append(2, 23);
    assert!(s.schedule().copies.is_empty());
}

#[test]
fn a_repeated_prompt_reuses_its_partial_last_block() {
    let mut s = Scheduler::new(config(64, 4, 4, 16));
    let prompt: Vec<u32> = (1..=6).collect();
    s.add(new_seq(1, prompt.clone(), 0, "t", 1)).unwrap();
    let mut next = 0;
    // The prompt, then two decodes: the second block fills (5, 6 and two generated tokens) and
    // is registered. Only the decodes' chunks are generated tokens.
    let generated: Vec<bool> = (0..3)
        .map(|_| step(&mut s, &mut next).chunks[0].generated)
        .collect();
    assert_eq!(generated, [false, true, true]);
    s.remove(1);
    s.add(new_seq(2, prompt, 0, "t", 1)).unwrap();
    let plan = step(&mut s, &mut next);
    let c = &plan.chunks[0];
    // One token left to compute, as a decode would be, but it is the prompt's own.
    assert_eq!(
        (
            c.cached_tokens,
            c.start,
            c.tokens.len(),
            c.sample,
            c.generated
        ),
        (5, 5, 1, true, false)
    );
    let [copy] = plan.copies.as_slice() else {
        panic!("one copy, not {:?}", plan.copies);
    };
    assert_eq!(c.block_table, vec![c.block_table[0], copy.dst]);
    // The cached block itself is left as it was, for the next match.
    assert_ne!(copy.src, copy.dst);
    assert_eq!(s.blocks.ref_count(copy.src), 0);
}

#[test]
fn prefix_cache_hit_skips_computed_tokens() {
    let mut s = Scheduler::new(config(64, 4, 4, 16));
    let shared: Vec<u32> = (1..=8).collect();
    let mut a = shared.clone();
    a.push(100);
    s.add(new_seq(1, a, 0, "t", 1)).unwrap();
    let mut next = 0;
    step(&mut s, &mut next);
    s.remove(1);
    // Two full blocks, and the partial one holding 100.
    assert_eq!(s.stats().kv.cached, 3);
    let mut b = shared.clone();
    b.extend([200, 201]);
    s.add(new_seq(2, b, 0, "t", 1)).unwrap();
    let plan = step(&mut s, &mut next);
    let c = &plan.chunks[0];
    assert_eq!(
        (c.cached_tokens, c.start, c.tokens.len(), c.sample),
        (8, 8, 2, true)
    );
    // Exactly the shared 8 tokens: both blocks match and only the last token is computed, into
    // a copy of the cached block that holds it.
    s.add(new_seq(3, shared, 0, "t", 1)).unwrap();
    let plan = step(&mut s, &mut next);
    let c = plan.chunks.iter().find(|c| c.seq == 3).unwrap();
    assert_eq!((c.cached_tokens, c.start, c.tokens.len()), (7, 7, 1));
    assert_eq!(plan.copies.len(), 1);
    assert_eq!(c.block_table.last(), Some(&plan.copies[0].dst));
    let kv = s.stats().kv;
    assert_eq!(kv.prefix_hit_tokens, 16);
    assert!(kv.prefix_hit_rate() > 0.5);
    // A later decode step reports no cached tokens.
    let plan = step(&mut s, &mut next);
    assert!(plan.chunks.iter().all(|c| c.cached_tokens == 0));
}
