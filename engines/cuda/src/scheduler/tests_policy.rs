#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use super::tests::{check, config, drive, new_seq, prompt, run, step};
use super::*;

#[test]
fn small_tenant_is_not_starved_by_a_big_one() {
    let mut s = Scheduler::new(config(64, 2, 4, 256));
    for id in 1..=20 {
        s.add(new_seq(id, prompt(id, 4), 0, "a", 1)).unwrap();
    }
    for id in [101, 102] {
        s.add(new_seq(id, prompt(id, 4), 0, "b", 1)).unwrap();
    }
    let mut admitted = Vec::new();
    let mut seen = BTreeSet::new();
    drive(&mut s, 4, 1000, |_, p| {
        admitted.extend(
            p.chunks
                .iter()
                .filter(|c| seen.insert(c.seq))
                .map(|c| c.seq),
        );
    });
    assert_eq!(admitted.len(), 22);
    let pos = |id| admitted.iter().position(|&a| a == id).unwrap();
    assert!(pos(101) < 3 && pos(102) < 5, "{admitted:?}");
    assert_eq!(s.fair.tenant_states(), 0, "no tenant state once idle");
}

#[test]
fn weighted_shares_approach_the_weights() {
    let mut s = Scheduler::new(config(16, 4, 4, 256));
    for i in 0..60 {
        s.add(new_seq(i, prompt(i, 4), 0, "a", 3)).unwrap();
        s.add(new_seq(500 + i, prompt(500 + i, 4), 0, "b", 1))
            .unwrap();
    }
    let mut served = [0usize; 2];
    let idle = run(&mut s, 4, 60, |s, p| {
        assert!(s.stats().waiting > 0 || s.is_idle());
        for c in &p.chunks {
            served[usize::from(c.seq >= 500)] += c.tokens.len();
        }
    });
    assert!(!idle, "both tenants stay backlogged during the measure");
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((2.6..=3.4).contains(&ratio), "ratio {ratio} ({served:?})");
}

#[test]
fn returning_tenant_starts_at_the_active_minimum() {
    let mut s = Scheduler::new(config(64, 1, 4, 64));
    s.add(new_seq(1, prompt(1, 8), 0, "a", 1)).unwrap();
    drive(&mut s, 2, 100, |_, _| {});
    // "b" was idle the whole time: it must not get ahead of "a" by more than one pick.
    for id in 10..14 {
        s.add(new_seq(id, prompt(id, 4), 0, "a", 1)).unwrap();
    }
    s.add(new_seq(20, prompt(20, 4), 0, "b", 1)).unwrap();
    s.add(new_seq(21, prompt(21, 4), 0, "b", 1)).unwrap();
    let mut admitted = Vec::new();
    let mut seen = BTreeSet::new();
    drive(&mut s, 1, 100, |_, p| {
        admitted.extend(
            p.chunks
                .iter()
                .filter(|c| seen.insert(c.seq))
                .map(|c| c.seq),
        );
    });
    assert_eq!(admitted, vec![10, 20, 11, 21, 12, 13]);
}

#[test]
fn preempts_the_lowest_priority_and_recomputes_it() {
    // 6 blocks of 2 positions: three growing sequences outgrow the cache at position 4.
    let mut s = Scheduler::new(config(16, 3, 2, 6));
    for (id, priority) in [(1, 2), (2, 1), (3, 0)] {
        s.add(new_seq(id, prompt(id, 2), priority, "t", 1)).unwrap();
    }
    let mut preempted = Vec::new();
    let mut recompute: Vec<PlannedChunk> = Vec::new();
    let mut tokens = Vec::new();
    drive(&mut s, 5, 100, |s, p| {
        preempted.extend(p.preempted.iter().copied());
        let sampled = recompute.last().is_some_and(|c| c.sample);
        if !preempted.is_empty()
            && !sampled
            && let Some(c) = p.chunks.iter().find(|c| c.seq == 3)
        {
            recompute.push(c.clone());
            tokens = s.tokens(3).unwrap().to_vec();
        }
    });
    assert_eq!(preempted, vec![3]);
    assert_eq!(s.stats().preemptions, 1);
    // Prompt + 3 generated tokens were recomputed; the token sampled from it followed.
    assert_eq!(tokens.len(), 6);
    assert_eq!(&tokens[..2], prompt(3, 2).as_slice());
    let first = &recompute[0];
    assert_eq!(first.start, first.cached_tokens);
    let mut at = first.start;
    for chunk in &recompute {
        assert_eq!(chunk.start, at);
        assert_eq!(
            &tokens[at..at + chunk.tokens.len()],
            chunk.tokens.as_slice()
        );
        at += chunk.tokens.len();
        // The generated tokens are computed in chunks of their own, as decoding computed them.
        assert!(
            at <= 2 || chunk.start >= 2,
            "{chunk:?} crosses the prompt's end"
        );
        assert_eq!(chunk.generated, chunk.start >= 2);
    }
    assert_eq!(at, 5);
    assert!(recompute.last().unwrap().sample);
}

#[test]
fn preempted_sequence_is_not_readmitted_in_the_same_step() {
    let mut s = Scheduler::new(config(16, 3, 2, 6));
    for (id, priority) in [(1, 2), (2, 1), (3, 0)] {
        s.add(new_seq(id, prompt(id, 2), priority, "t", 1)).unwrap();
    }
    let mut next = 0;
    let plan = (0..4).map(|_| step(&mut s, &mut next)).last().unwrap();
    assert_eq!(plan.preempted, vec![3]);
    assert!(plan.chunks.iter().all(|c| c.seq != 3));
    assert_eq!((s.stats().running, s.stats().waiting), (2, 1));
}

#[test]
fn failed_admission_leaves_the_block_manager_unchanged() {
    let mut s = Scheduler::new(config(16, 4, 2, 4));
    let mut next = 0;
    // Two whole blocks, so nothing partial is left cached.
    s.add(new_seq(1, vec![1, 2, 3, 4], 0, "t", 1)).unwrap();
    step(&mut s, &mut next);
    s.remove(1);
    assert_eq!((s.stats().kv.cached, s.stats().kv.free), (2, 2));
    s.add(new_seq(2, prompt(2, 3), 0, "t", 1)).unwrap();
    step(&mut s, &mut next); // takes the two plain blocks
    s.add(new_seq(3, vec![1, 2, 3, 4, 9, 9, 9], 0, "t", 1))
        .unwrap();
    let before = s.stats().kv;
    let plan = s.schedule();
    assert_eq!(
        plan.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(
        s.stats().kv,
        before,
        "matched blocks not taken, nothing counted"
    );
    assert_eq!(s.stats().waiting, 1);
    s.complete(&plan);
    check(&s);
}

#[test]
fn stuck_prefill_preempts_instead_of_deadlocking() {
    // A forked mid-prefill child cannot get a block: it preempts itself and runs later.
    let mut s = Scheduler::new(config(2, 2, 2, 3));
    let mut next = 0;
    s.add(new_seq(1, prompt(1, 5), 0, "t", 1)).unwrap();
    step(&mut s, &mut next);
    assert!(s.fork(1, 2));
    let mut preempted = Vec::new();
    drive(&mut s, 1, 100, |_, p| {
        preempted.extend(p.preempted.iter().copied())
    });
    assert_eq!(preempted, vec![2]);
}

#[test]
fn cancel_running_and_waiting_under_load() {
    let mut s = Scheduler::new(config(8, 2, 2, 8));
    for id in 1..=4 {
        s.add(new_seq(id, prompt(id, 5), 0, "t", 1)).unwrap();
    }
    let mut next = 0;
    step(&mut s, &mut next);
    let used = s.stats().kv.used;
    assert!(used > 0);
    s.remove(1);
    s.remove(4);
    assert!(s.stats().kv.used < used);
    check(&s);
    drive(&mut s, 2, 100, |_, _| {});
}

const BG: i32 = turnpike_engine_api::json::BACKGROUND_PRIORITY;

fn seqs_of(plan: &StepPlan) -> Vec<SeqId> {
    plan.chunks.iter().map(|c| c.seq).collect()
}

#[test]
fn background_work_yields_steps_to_a_prompt_and_resumes_after() {
    // Chunks of at most 4 tokens a step: the foreground prompt of 10 takes three steps.
    let mut s = Scheduler::new(config(6, 8, 4, 64));
    let mut next = 0;
    for id in [1, 2] {
        s.add(new_seq(id, prompt(id, 3), BG, "batch", 1)).unwrap();
    }
    // Both background prompts run, then both decode.
    step(&mut s, &mut next);
    assert_eq!(seqs_of(&step(&mut s, &mut next)), vec![1, 2]);
    s.add(new_seq(3, prompt(3, 10), 0, "t", 1)).unwrap();
    // While the foreground prompt waits or runs, the background sequences are not planned.
    let mut prompt_steps = 0;
    loop {
        let plan = step(&mut s, &mut next);
        assert_eq!(seqs_of(&plan), vec![3], "{plan:?}");
        assert!(plan.preempted.is_empty());
        prompt_steps += 1;
        if plan.chunks[0].sample {
            break;
        }
    }
    assert_eq!(prompt_steps, 2);
    // Its prompt done, everything decodes together again.
    let mut together = seqs_of(&step(&mut s, &mut next));
    together.sort_unstable();
    assert_eq!(together, vec![1, 2, 3]);
}

#[test]
fn a_foreground_request_takes_a_background_place_when_none_is_free() {
    // Two places, both taken by background work: the foreground request preempts one.
    let mut s = Scheduler::new(config(16, 2, 4, 64));
    let mut next = 0;
    for id in [1, 2] {
        s.add(new_seq(id, prompt(id, 3), BG, "batch", 1)).unwrap();
    }
    step(&mut s, &mut next);
    step(&mut s, &mut next);
    s.add(new_seq(3, prompt(3, 3), 5, "t", 1)).unwrap();
    let plan = step(&mut s, &mut next);
    assert_eq!(seqs_of(&plan), vec![3]);
    // The later-arrived background sequence gave its place (it is recomputed later).
    assert_eq!(plan.preempted, vec![2]);
    // All three finish.
    assert!(run(&mut s, 3, 100, |_, _| {}));
}

#[test]
fn without_foreground_work_background_runs_as_any_other() {
    let mut s = Scheduler::new(config(16, 4, 4, 64));
    let mut next = 0;
    for id in [1, 2, 3] {
        s.add(new_seq(id, prompt(id, 3), BG, "batch", 1)).unwrap();
    }
    let mut first = seqs_of(&step(&mut s, &mut next));
    first.sort_unstable();
    assert_eq!(first, vec![1, 2, 3]);
}
