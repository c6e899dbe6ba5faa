//! Behaviour of [`SequenceSampler`] as a whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

pub(super) fn params() -> SamplingParams {
    SamplingParams::default()
}

pub(super) fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..params()
    }
}

pub(super) fn sampler(p: SamplingParams) -> SequenceSampler {
    SequenceSampler::new(p, 1234, &[])
}

pub(super) fn token(s: &mut SequenceSampler, logits: &[f32]) -> u32 {
    s.sample(&mut logits.to_vec(), &[]).token
}

/// Empirical frequency of each token over `n` draws from the same logits.
pub(super) fn frequencies(p: SamplingParams, logits: &[f32], n: u32) -> Vec<f64> {
    let mut s = sampler(p);
    let mut counts = vec![0u32; logits.len()];
    let mut buf = logits.to_vec();
    for _ in 0..n {
        counts[s.sample(&mut buf, &[]).token as usize] += 1;
    }
    counts
        .iter()
        .map(|&c| f64::from(c) / f64::from(n))
        .collect()
}

pub(super) fn softmax(logits: &[f32]) -> Vec<f64> {
    let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
    logits.iter().map(|&x| f64::from(x).exp() / z).collect()
}

/// A reproducible stream of random logits, independent of any sampler.
pub(super) fn logits_stream(steps: usize, vocab: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(99);
    (0..steps)
        .map(|_| {
            (0..vocab)
                .map(|_| (rng.next_f64() * 6.0 - 3.0) as f32)
                .collect()
        })
        .collect()
}

#[test]
fn greedy_picks_the_argmax_and_ties_go_to_the_lowest_id() {
    let mut s = sampler(greedy());
    assert_eq!(token(&mut s, &[0.1, 2.0, -1.0, 1.9]), 1);
    assert_eq!(token(&mut s, &[0.5, 3.0, 3.0, 3.0]), 1);
    assert_eq!(token(&mut s, &[f32::NAN, -5.0, -5.0]), 1);
}

#[test]
fn temperature_zero_never_draws_and_sampling_draws_exactly_once() {
    let logits = [0.3, 0.1, 0.2];
    let mut s = sampler(greedy());
    for _ in 0..10 {
        token(&mut s, &logits);
    }
    assert_eq!(s.rng, Rng::new(1234), "greedy must not touch the RNG");

    let mut s = sampler(params());
    let mut expected = Rng::new(1234);
    for _ in 0..10 {
        token(&mut s, &logits);
        expected.next_u64();
    }
    // Even a call where everything is banned (fallback) draws once.
    s.sample(&mut logits.to_vec(), &[0, 1, 2]);
    expected.next_u64();
    assert_eq!(s.rng, expected);
}

#[test]
fn top_k_one_is_greedy() {
    let p = SamplingParams {
        top_k: 1,
        ..params()
    };
    let mut s = sampler(p);
    let mut g = sampler(greedy());
    for logits in logits_stream(200, 50) {
        assert_eq!(token(&mut s, &logits), token(&mut g, &logits));
    }
}

#[test]
fn tiny_top_p_keeps_only_the_top_token() {
    let p = SamplingParams {
        top_p: 1e-6,
        ..params()
    };
    let freq = frequencies(p, &[1.0, 1.2, 0.9, 1.1], 2000);
    assert_eq!(freq, [0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn min_p_drops_low_probability_tokens() {
    // Relative to the best: e^-1 ~ 0.37 stays, e^-4 ~ 0.02 goes.
    let p = SamplingParams {
        min_p: 0.1,
        ..params()
    };
    let freq = frequencies(p, &[0.0, -1.0, -4.0, -4.0], 5000);
    assert!(freq[0] > 0.6 && freq[1] > 0.2, "{freq:?}");
    assert_eq!(freq[2] + freq[3], 0.0);
}

#[test]
fn top_k_two_only_ever_samples_the_two_best() {
    let p = SamplingParams {
        top_k: 2,
        ..params()
    };
    let freq = frequencies(p, &[1.0, 1.5, 0.9, 1.4, 1.3], 5000);
    assert!(freq[1] > 0.4 && freq[3] > 0.4, "{freq:?}");
    assert_eq!(freq[0] + freq[2] + freq[4], 0.0);
}

#[test]
fn temperature_sharpens_or_flattens_the_distribution() {
    let logits = [1.0, 0.0, -0.5];
    let top_share = |temperature| {
        let p = SamplingParams {
            temperature,
            ..params()
        };
        frequencies(p, &logits, 10_000)[0]
    };
    let (cold, normal, hot) = (top_share(0.5), top_share(1.0), top_share(2.0));
    assert!(
        cold > normal + 0.05 && normal > hot + 0.05,
        "{cold} {normal} {hot}"
    );
    let expected_cold = softmax(&[2.0, 0.0, -1.0])[0];
    assert!(
        (cold - expected_cold).abs() < 0.02,
        "{cold} vs {expected_cold}"
    );
}

#[test]
fn empirical_frequencies_match_softmax() {
    let logits = [0.5, -0.2, 1.3, 0.0];
    let expected = softmax(&logits);
    let freq = frequencies(params(), &logits, 20_000);
    for (f, e) in freq.iter().zip(&expected) {
        // One standard deviation is at most ~0.0035 here.
        assert!((f - e).abs() < 0.015, "{freq:?} vs {expected:?}");
    }
}

#[test]
fn repetition_penalty_covers_prompt_and_output() {
    let p = SamplingParams {
        repetition_penalty: 4.0,
        ..greedy()
    };
    // Prompt token 0 (positive) is divided: 2 / 4 = 0.5 < 1.
    let mut s = SequenceSampler::new(p.clone(), 0, &[0]);
    assert_eq!(token(&mut s, &[2.0, 1.0, -3.0]), 1);
    // Token 1 was just generated: 1 / 4 = 0.25 < 0.5 now.
    assert_eq!(token(&mut s, &[2.0, 1.0, -3.0]), 0);
    // Negative logits are multiplied: token 1's -1 becomes -4 < -3.
    let mut s = SequenceSampler::new(p, 0, &[1]);
    assert_eq!(token(&mut s, &[-5.0, -1.0, -3.0]), 2);
}

#[test]
fn frequency_penalty_grows_with_the_count_and_ignores_the_prompt() {
    let p = SamplingParams {
        frequency_penalty: 0.4,
        ..greedy()
    };
    let logits = [1.0, 0.0];
    let mut s = SequenceSampler::new(p, 0, &[0, 0, 0, 0]);
    // 1.0, 0.6, 0.2 beat 0.0; after three generations 1.0 - 1.2 < 0.
    let tokens: Vec<u32> = (0..4).map(|_| token(&mut s, &logits)).collect();
    assert_eq!(tokens, [0, 0, 0, 1]);
}

#[test]
fn presence_penalty_applies_once() {
    let p = SamplingParams {
        presence_penalty: 0.5,
        ..greedy()
    };
    let logits = [1.0, 0.6];
    let mut s = SequenceSampler::new(p, 0, &[0]);
    let tokens: Vec<u32> = (0..5).map(|_| token(&mut s, &logits)).collect();
    // 0 first (prompt ignored), then both are penalised once: 0.5 vs 0.1, forever.
    assert_eq!(tokens, [0, 1, 0, 0, 0]);
}

#[test]
fn banned_tokens_are_never_chosen() {
    let logits = [5.0, 0.0, 0.1, -1.0];
    let mut s = sampler(params());
    for _ in 0..2000 {
        let t = s.sample(&mut logits.to_vec(), &[0, 2, 77]).token;
        assert!(t == 1 || t == 3);
    }
    let mut g = sampler(greedy());
    assert_eq!(g.sample(&mut logits.to_vec(), &[0]).token, 2);
}

#[test]
fn all_banned_or_all_invalid_falls_back_to_the_raw_argmax() {
    for p in [params(), greedy()] {
        let mut s = sampler(p);
        let out = s.sample(&mut [1.0, 3.0, 3.0], &[0, 1, 2]);
        assert_eq!(out.token, 1);
        let out = s.sample(&mut [f32::NEG_INFINITY, f32::NAN], &[]);
        assert_eq!(out.token, 0);
        let out = s.sample(&mut [f32::NAN, f32::NAN, f32::NAN], &[]);
        assert_eq!(out.token, 0);
        let out = s.sample(&mut Vec::new(), &[]);
        assert_eq!(out.token, 0);
    }
}

#[test]
fn nan_and_infinite_logits_are_handled() {
    let mut s = sampler(SamplingParams {
        top_logprobs: Some(2),
        ..params()
    });
    for _ in 0..500 {
        let t = token(&mut s, &[f32::NAN, 0.0, f32::NEG_INFINITY, 0.5, f32::NAN]);
        assert!(t == 1 || t == 3);
    }
    let out = s.sample(&mut [0.0, f32::INFINITY, f32::NAN], &[]);
    assert_eq!(out.token, 1);
    assert_eq!(out.logprob, Some(0.0));
    assert_eq!(out.top_logprobs[0], (1, 0.0));
    let mut g = sampler(greedy());
    assert_eq!(token(&mut g, &[f32::NAN, f32::INFINITY, f32::INFINITY]), 1);
}

fn run(seed: u64, stream: &[Vec<f32>]) -> Vec<u32> {
    let p = SamplingParams {
        top_p: 0.9,
        frequency_penalty: 0.3,
        ..params()
    };
    let mut s = SequenceSampler::new(p, seed, &[1, 2, 3]);
    stream.iter().map(|logits| token(&mut s, logits)).collect()
}

#[test]
fn the_same_seed_reproduces_and_another_seed_differs() {
    let stream = logits_stream(100, 64);
    assert_eq!(run(7, &stream), run(7, &stream));
    assert_ne!(run(7, &stream), run(8, &stream));
}

#[test]
fn other_sequences_in_the_batch_do_not_matter() {
    let stream = logits_stream(100, 64);
    let alone = run(7, &stream);
    let mut s = SequenceSampler::new(
        SamplingParams {
            top_p: 0.9,
            frequency_penalty: 0.3,
            ..params()
        },
        7,
        &[1, 2, 3],
    );
    let mut others: Vec<SequenceSampler> = (0..3).map(|i| sampler_with_seed(7 + i)).collect();
    let mut batched = Vec::new();
    for (step, logits) in stream.iter().enumerate() {
        // A batch that changes composition at every step, sampled before and after `s`.
        for other in others.iter_mut().take(step % 4) {
            token(other, &logits[..32]);
        }
        batched.push(token(&mut s, logits));
        if step % 3 == 0 {
            token(&mut others[2], logits);
        }
    }
    assert_eq!(batched, alone);
}

fn sampler_with_seed(seed: u64) -> SequenceSampler {
    SequenceSampler::new(params(), seed, &[])
}

#[test]
fn fork_shares_the_history_but_not_the_rng() {
    let p = SamplingParams {
        presence_penalty: 1.0,
        ..params()
    };
    let mut parent = SequenceSampler::new(p.clone(), 1, &[4, 5]);
    for logits in logits_stream(5, 10) {
        token(&mut parent, &logits);
    }
    let fork = parent.fork(mix(&[1, 1]));
    assert_eq!(fork.history, parent.history);
    assert_eq!(fork.params(), &p);
    assert_eq!(fork.rng, Rng::new(mix(&[1, 1])));

    // Afterwards the two evolve separately, and different seeds give different tokens.
    let stream = logits_stream(100, 64);
    let mut a = parent.fork(2);
    let mut b = parent.fork(3);
    let ta: Vec<u32> = stream.iter().map(|l| token(&mut a, l)).collect();
    let tb: Vec<u32> = stream.iter().map(|l| token(&mut b, l)).collect();
    assert_ne!(ta, tb);
    assert_ne!(a.history, parent.history);
    let mut c = parent.fork(2);
    let tc: Vec<u32> = stream.iter().map(|l| token(&mut c, l)).collect();
    assert_eq!(ta, tc);
}

#[test]
fn large_vocabulary_with_top_k_stays_within_the_k_best() {
    let vocab = 150_000;
    let logits = &logits_stream(1, vocab)[0];
    let mut ranked: Vec<u32> = (0..vocab as u32).collect();
    ranked.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    let best: std::collections::HashSet<u32> = ranked[..40].iter().copied().collect();
    let mut s = sampler(SamplingParams {
        top_k: 40,
        top_p: 0.95,
        temperature: 0.8,
        ..params()
    });
    let mut buf = logits.clone();
    for _ in 0..200 {
        assert!(best.contains(&s.sample(&mut buf, &[]).token));
    }
}
