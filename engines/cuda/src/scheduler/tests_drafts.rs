//! Drafts (speculative decoding): planned after a decode's last token within the budget the
//! other decodes leave, counted only once kept, never preempting, and leaving every block
//! accounted for.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::tests::{check, check_plan, config, new_seq, prompt};
use super::*;

/// Admits `id` with a prompt of `len` tokens, computes it, and appends one sampled token:
/// the sequence then decodes.
fn decoding(s: &mut Scheduler, id: SeqId, len: usize) {
    s.add(new_seq(id, prompt(id, len), 0, "t", 1)).unwrap();
    let plan = s.schedule();
    s.complete(&plan);
    s.append(id, 7);
}

#[test]
fn a_decode_carries_its_drafts_and_counts_only_what_is_kept() {
    let mut s = Scheduler::new(config(64, 4, 4, 16));
    decoding(&mut s, 1, 6);
    s.set_draft(1, vec![20, 21, 22]);
    let plan = s.schedule();
    check_plan(&s, &plan);
    let chunk = &plan.chunks[0];
    assert_eq!((chunk.start, chunk.drafts), (6, 3));
    assert_eq!(chunk.tokens, vec![7, 20, 21, 22]);
    assert!(chunk.block_table.len() * 4 >= 10, "blocks for every draft");
    s.complete(&plan);
    // Only the real token has KV until the engine keeps drafts.
    assert_eq!(s.seqs[&1].computed, 7);
    assert!(s.seqs[&1].draft.is_empty(), "drafts are used once");
    // Two drafts kept, then the token sampled after them.
    for token in [20, 21, 30] {
        s.append(1, token);
    }
    s.accept_drafts(1, 2);
    assert_eq!(s.seqs[&1].computed, 9);
    assert!(s.seqs[&1].is_decode());
    // Positions 0..8 fill two blocks of 4: both registered, the second holding kept drafts.
    assert_eq!(s.seqs[&1].hashes.len(), 2);
    check(&s);
    let next = s.schedule();
    check_plan(&s, &next);
    assert_eq!(
        (next.chunks[0].start, next.chunks[0].tokens.clone()),
        (9, vec![30])
    );
    s.remove(1);
    check(&s);
    assert_eq!(s.stats().kv.used, 0);
}

#[test]
fn drafts_take_only_the_budget_other_decodes_leave() {
    let mut s = Scheduler::new(config(4, 4, 4, 32));
    for id in 1..=3 {
        s.add(new_seq(id, prompt(id, 1), 0, "t", 1)).unwrap();
    }
    let plan = s.schedule();
    assert_eq!(plan.chunks.len(), 3);
    s.complete(&plan);
    for id in 1..=3 {
        s.append(id, 7);
    }
    s.set_draft(1, vec![50, 51, 52, 53]);
    let plan = s.schedule();
    check_plan(&s, &plan);
    assert_eq!(plan.num_tokens(), 4);
    assert_eq!(plan.chunks.len(), 3, "every decode still runs");
    let drafted: usize = plan.chunks.iter().map(|c| c.drafts).sum();
    assert_eq!(drafted, 1);
}

#[test]
fn drafts_never_preempt_and_a_rejected_one_is_written_again() {
    // Two blocks of 4: the prompt and its token fill the first; drafts find one more block.
    let mut s = Scheduler::new(config(64, 4, 4, 2));
    decoding(&mut s, 1, 3);
    s.set_draft(1, vec![40, 41, 42, 43, 44, 45, 46]);
    let plan = s.schedule();
    check_plan(&s, &plan);
    assert!(plan.preempted.is_empty());
    assert_eq!(
        plan.chunks[0].drafts, 4,
        "as many drafts as the blocks hold"
    );
    s.complete(&plan);
    // The first draft is rejected: the token sampled instead is computed next, at its place.
    s.append(1, 99);
    s.accept_drafts(1, 0);
    assert_eq!(s.seqs[&1].computed, 4);
    let next = s.schedule();
    check_plan(&s, &next);
    assert_eq!(
        (next.chunks[0].start, next.chunks[0].tokens.clone()),
        (4, vec![99])
    );
    check(&s);
}

#[test]
fn a_fork_starts_without_drafts() {
    let mut s = Scheduler::new(config(64, 4, 4, 16));
    decoding(&mut s, 1, 5);
    s.set_draft(1, vec![1, 2]);
    assert!(s.fork(1, 2));
    assert!(s.seqs[&2].draft.is_empty());
    assert_eq!(s.seqs[&1].draft, vec![1, 2]);
    check(&s);
}
