use std::collections::HashMap;

use super::*;

const END: u32 = 0;

/// Runs a search over a toy model whose logits depend on the tokens so far, forking and
/// dropping sequences as a worker would. Returns the search once done.
fn search(
    width: usize,
    length_penalty: f32,
    max_tokens: usize,
    model: impl Fn(&[u32]) -> Vec<f32>,
) -> BeamSearch {
    let mut s = BeamSearch::new(1, width, length_penalty, max_tokens, 0, 1);
    let mut seqs: HashMap<SeqId, Vec<u32>> = HashMap::from([(1, Vec::new())]);
    let mut next = 2;
    for _ in 0..=max_tokens {
        let running: Vec<SeqId> = s.running.iter().map(|b| b.seq).collect();
        for seq in running {
            s.offer(seq, &model(&seqs[&seq]), |_| false);
        }
        assert!(s.ready());
        let parents: Vec<SeqId> = s.running.iter().map(|b| b.seq).collect();
        let successors = s.step(|t| t == END);
        if s.done() {
            assert!(successors.is_empty());
            return s;
        }
        let mut kept = Vec::new();
        for (i, succ) in successors.iter().enumerate() {
            if kept.contains(&succ.parent) {
                seqs.insert(next, seqs[&succ.parent].clone());
                s.assign(i, next);
                next += 1;
            } else {
                kept.push(succ.parent);
            }
        }
        for beam in &s.running {
            seqs.get_mut(&beam.seq)
                .unwrap()
                .push(*beam.tokens.last().unwrap());
            assert_eq!(
                seqs[&beam.seq], beam.tokens,
                "a beam's sequence holds its tokens"
            );
        }
        for p in parents.iter().filter(|p| !kept.contains(p)) {
            seqs.remove(p);
        }
    }
    panic!("the search did not end within max_tokens");
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    logits.iter().map(|l| l - max - sum.ln()).collect()
}

#[test]
fn one_beam_is_greedy_decoding() {
    let model = |t: &[u32]| {
        let mut l = vec![0.0f32; 6];
        l[1 + (t.len() * 7 + 3) % 5] = 2.0;
        l
    };
    let s = search(1, 1.0, 5, model);
    let best = s.best(1);
    let mut greedy = Vec::new();
    let mut total = 0.0;
    for _ in 0..5 {
        let lp = log_softmax(&model(&greedy));
        let token = (0..6).max_by(|&a, &b| lp[a].total_cmp(&lp[b])).unwrap();
        total += lp[token];
        greedy.push(token as u32);
    }
    assert_eq!(best[0].tokens, greedy);
    assert!((best[0].score - total / 5.0).abs() < 1e-5);
    assert_eq!(best[0].stop, None, "it ran out of tokens");
}

#[test]
fn a_beam_can_lose_its_lead_to_a_path_that_starts_worse() {
    // Token 1 leads at the first step, but after it everything is flat; token 2 leads to a
    // sure continuation. Greedy takes 1; two beams find 2 → 3.
    let model = |t: &[u32]| match t {
        [] => vec![-9.0, 1.0, 0.8, -9.0, -9.0],
        [1] => vec![-9.0, 0.0, 0.0, 0.0, 0.0],
        [2] => vec![-9.0, -9.0, -9.0, 5.0, -9.0],
        _ => vec![5.0, 0.0, 0.0, 0.0, 0.0],
    };
    let s = search(2, 1.0, 2, model);
    let best = s.best(2);
    assert_eq!(best[0].tokens, vec![2, 3]);
    assert_eq!(best[1].tokens[0], 1);
    assert!(best[0].score > best[1].score);
}

#[test]
fn an_end_token_finishes_a_hypothesis_scored_by_its_length() {
    // End is likely after one token; with a strong length penalty the longer path wins.
    let model = |t: &[u32]| match t.len() {
        0 => vec![-9.0, 2.0, 1.9, -9.0],
        1 => vec![1.0, 0.9, -9.0, -9.0],
        _ => vec![3.0, -9.0, -9.0, -9.0],
    };
    let short = search(2, 0.0, 6, model);
    let h = &short.best(1)[0];
    assert_eq!(h.stop, Some(END));
    assert_eq!(h.tokens.last(), Some(&END));
    let sum: f32 = h.logprobs.iter().sum();
    assert!(
        (h.score - sum).abs() < 1e-5,
        "length_penalty 0: the plain sum"
    );
    let long = search(2, 3.0, 6, model);
    let h2 = &long.best(1)[0];
    assert!(h2.tokens.len() >= h.tokens.len());
    let sum2: f32 = h2.logprobs.iter().sum();
    assert!((h2.score - sum2 / (h2.tokens.len() as f32).powf(3.0)).abs() < 1e-5);
}

#[test]
fn successors_of_one_beam_share_its_parent_and_the_others_drop() {
    let mut s = BeamSearch::new(7, 3, 1.0, 10, 0, 1);
    s.offer(7, &[-9.0, 3.0, 2.9, 2.8, -9.0], |_| false);
    let first = s.step(|t| t == END);
    assert!(first.iter().all(|succ| succ.parent == 7));
    assert_eq!(
        first.iter().map(|s| s.token).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    s.assign(1, 8);
    s.assign(2, 9);
    // Beam 9 holds two of the next step's best continuations, 7 one, 8 (flat) none.
    s.offer(7, &[-9.0, 1.0, -9.0, -9.0, -9.0], |_| false);
    assert!(!s.ready(), "waits for every beam");
    s.offer(8, &[0.0, 0.0, 0.0, 0.0, 0.0], |_| false);
    s.offer(9, &[-9.0, -9.0, 4.0, 4.0, -9.0], |_| false);
    let next = s.step(|t| t == END);
    let parents: Vec<SeqId> = next.iter().map(|s| s.parent).collect();
    assert_eq!(parents.iter().filter(|&&p| p == 9).count(), 2);
    assert!(!parents.contains(&8));
}

#[test]
fn banned_tokens_are_never_chosen_but_count_in_the_normalisation() {
    let mut s = BeamSearch::new(1, 1, 1.0, 4, 2, 1);
    s.offer(1, &[5.0, 0.0, -1.0], |t| t == END);
    let next = s.step(|t| t == END);
    assert_eq!(next[0].token, 1);
    let lp = log_softmax(&[5.0, 0.0, -1.0]);
    assert!((s.running[0].score - lp[1]).abs() < 1e-5);
}

#[test]
fn a_diversity_penalty_sends_the_second_group_elsewhere() {
    use super::super::beam_groups::{GroupBeamSearch, GroupSettings};
    let settings = |diversity_penalty| GroupSettings {
        width: 2,
        groups: 2,
        diversity_penalty,
        length_penalty: 1.0,
        max_tokens: 4,
        pad: END,
        end_tokens: 1,
    };
    let row = [-9.0, 2.0, 1.0, 0.5];
    let first_tokens = |penalty| {
        let mut s = GroupBeamSearch::new(1, settings(penalty));
        s.offer(1, &row, |_| false);
        assert!(s.ready());
        let next = s.step(|t| t == END);
        assert!(
            next.iter().all(|succ| succ.parent == 1),
            "both groups start from the prompt"
        );
        next.iter().map(|succ| succ.token).collect::<Vec<_>>()
    };
    assert_eq!(
        first_tokens(0.0),
        vec![1, 1],
        "no penalty: both groups take the best"
    );
    assert_eq!(
        first_tokens(5.0),
        vec![1, 2],
        "the second group pays for repeating the first"
    );
}
