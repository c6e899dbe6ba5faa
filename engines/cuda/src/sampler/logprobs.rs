//! Log-probabilities of the model's own distribution: `log_softmax` of the raw logits.
//!
//! Everything is computed in `f64` with a max-subtracted log-sum-exp. Special values follow one
//! rule, [`clean`]: NaN counts as `-inf` (probability zero) and `+inf` as `f32::MAX`. When no
//! logit is above `-inf` the distribution is degenerate and every token is reported with the
//! uniform log-probability `-ln(vocab)`, so the probabilities still sum to one.

use super::max_logit;

/// A raw logit as the distribution sees it: NaN becomes `-inf`, `+inf` becomes `f32::MAX`.
pub(crate) fn clean(x: f32) -> f64 {
    if x.is_nan() {
        f64::NEG_INFINITY
    } else {
        f64::from(x.min(f32::MAX))
    }
}

/// The normaliser of one logits vector, ready to turn logits into log-probabilities.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogSoftmax {
    /// `ln(sum(exp(logit)))`, or `None` when every logit is `-inf` or NaN.
    log_sum_exp: Option<f64>,
    /// The vocabulary size, for the uniform fallback.
    len: usize,
}

impl LogSoftmax {
    /// Computes the normaliser of `logits` (two passes, no allocation).
    pub(crate) fn new(logits: &[f32]) -> Self {
        // `clean` is monotone and `max_logit` ignores NaN like `clean` does.
        let max = clean(max_logit(logits));
        let log_sum_exp = (max > f64::NEG_INFINITY).then(|| {
            let sum: f64 = logits.iter().map(|&x| (clean(x) - max).exp()).sum();
            max + sum.ln()
        });
        Self {
            log_sum_exp,
            len: logits.len(),
        }
    }

    /// The log-probability of a token whose [`clean`]ed raw logit is `value`.
    pub(crate) fn of_clean(&self, value: f64) -> f32 {
        match self.log_sum_exp {
            Some(lse) => (value - lse) as f32,
            None => -(self.len as f64).ln() as f32,
        }
    }

    /// The log-probability of `token` (`-inf` for an id outside `logits`).
    pub(crate) fn of_token(&self, logits: &[f32], token: u32) -> f32 {
        logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| self.of_clean(clean(x)))
    }
}

/// Writes the `k` most likely tokens of `logits` into `out` as `(id, clean logit)`, most likely
/// first, ties by lower id. One pass over the vocabulary with a bounded insertion list, so it is
/// `O(vocab)` for the small `k` that `top_logprobs` allows.
pub(crate) fn top_tokens(logits: &[f32], k: usize, out: &mut Vec<(u32, f64)>) {
    out.clear();
    if k == 0 {
        return;
    }
    for (id, &x) in (0u32..).zip(logits) {
        let value = clean(x);
        if out.len() == k {
            // Ids arrive in increasing order, so an equal value never displaces an earlier id.
            match out.last() {
                Some(&(_, worst)) if value > worst => {
                    out.pop();
                }
                _ => continue,
            }
        }
        let at = out.partition_point(|&(_, v)| v >= value);
        out.insert(at, (id, value));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::tests::{logits_stream, params, sampler, softmax};
    use super::super::{SamplingParams, SequenceSampler};
    use super::*;

    fn log_probs(logits: &[f32]) -> Vec<f64> {
        let lsm = LogSoftmax::new(logits);
        logits
            .iter()
            .map(|&x| f64::from(lsm.of_clean(clean(x))))
            .collect()
    }

    #[test]
    fn matches_log_softmax_and_sums_to_one() {
        let logits = [1.0f32, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
        for (lp, &x) in log_probs(&logits).iter().zip(&logits) {
            assert!((lp - (f64::from(x) - z.ln())).abs() < 1e-6);
        }
        let total: f64 = log_probs(&logits).iter().map(|lp| lp.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let lps = log_probs(&[1000.0, 1000.0, f32::MAX]);
        assert!(lps[0] < -1e30 && lps[2] == 0.0);
        let lps = log_probs(&[1000.0, 1000.0]);
        assert!((lps[0] - 0.5f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn special_values() {
        let lps = log_probs(&[f32::NAN, 0.0, f32::NEG_INFINITY, 0.0]);
        assert_eq!(lps[0], f64::NEG_INFINITY);
        assert_eq!(lps[2], f64::NEG_INFINITY);
        assert!((lps[1] - 0.5f64.ln()).abs() < 1e-6);
        let lps = log_probs(&[f32::INFINITY, 0.0]);
        assert_eq!(lps[0], 0.0);
        // Degenerate: nothing above -inf, reported as uniform.
        let lps = log_probs(&[f32::NAN, f32::NEG_INFINITY]);
        assert!(lps.iter().all(|&lp| (lp - 0.5f64.ln()).abs() < 1e-6));
        let lsm = LogSoftmax::new(&[]);
        assert_eq!(lsm.of_token(&[], 0), f32::NEG_INFINITY);
    }

    #[test]
    fn top_tokens_order_ties_and_length() {
        let logits = [1.0f32, 3.0, 3.0, f32::NAN, 2.0, 3.0];
        let mut out = Vec::new();
        top_tokens(&logits, 4, &mut out);
        let ids: Vec<u32> = out.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 5, 4]);
        top_tokens(&logits, 0, &mut out);
        assert!(out.is_empty());
        top_tokens(&logits, 20, &mut out);
        let ids: Vec<u32> = out.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 5, 4, 0, 3]);
    }

    #[test]
    fn top_tokens_agrees_with_a_full_sort() {
        let mut rng = super::super::Rng::new(3);
        let logits: Vec<f32> = (0..5000)
            .map(|_| (rng.next_f64() * 20.0).round() as f32)
            .collect();
        let mut expected: Vec<u32> = (0..5000).collect();
        expected.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        let mut out = Vec::new();
        top_tokens(&logits, 20, &mut out);
        let ids: Vec<u32> = out.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, expected[..20]);
    }

    #[test]
    fn logprobs_are_the_raw_log_softmax() {
        let raw = [0.5f32, 2.0, -1.0, 2.0, 0.0, 1.0];
        let p = SamplingParams {
            temperature: 0.7,
            top_k: 3,
            repetition_penalty: 1.3,
            frequency_penalty: 1.0,
            top_logprobs: Some(4),
            ..params()
        };
        let mut s = SequenceSampler::new(p, 5, &[1]);
        let expected: Vec<f64> = softmax(&raw).iter().map(|q| q.ln()).collect();
        for _ in 0..50 {
            let mut logits = raw.to_vec();
            let out = s.sample(&mut logits, &[3]);
            assert_eq!(logits, raw, "logits are restored");
            let lp = f64::from(out.logprob.unwrap());
            assert!((lp - expected[out.token as usize]).abs() < 1e-6);
            let ids: Vec<u32> = out.top_logprobs.iter().map(|&(id, _)| id).collect();
            assert_eq!(
                ids,
                [1, 3, 5, 0],
                "most likely first, ties by lower id, banned included"
            );
            for &(id, lp) in &out.top_logprobs {
                assert!((f64::from(lp) - expected[id as usize]).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn logprobs_sum_to_one_over_the_vocabulary() {
        let logits = &logits_stream(1, 1000)[0];
        let mut s = sampler(SamplingParams {
            top_logprobs: Some(1000),
            ..params()
        });
        let out = s.sample(&mut logits.clone(), &[]);
        assert_eq!(out.top_logprobs.len(), 1000);
        let total: f64 = out
            .top_logprobs
            .iter()
            .map(|&(_, lp)| f64::from(lp).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        assert!(out.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(
            out.top_logprobs
                .iter()
                .any(|&(id, lp)| id == out.token && Some(lp) == out.logprob)
        );
    }

    #[test]
    fn logprob_list_length_follows_k() {
        let logits = [0.0f32, 1.0, 2.0];
        for (k, len) in [(Some(0), 0), (Some(2), 2), (Some(20), 3)] {
            let mut s = sampler(SamplingParams {
                top_logprobs: k,
                ..params()
            });
            let out = s.sample(&mut logits.to_vec(), &[]);
            assert!(out.logprob.is_some());
            assert_eq!(out.top_logprobs.len(), len);
        }
        let mut s = sampler(params());
        let out = s.sample(&mut logits.to_vec(), &[]);
        assert_eq!(out.logprob, None);
        assert!(out.top_logprobs.is_empty());
    }
}
