//! The candidate set of a random draw: temperature, top-k, top-p, min-p and the inverse-CDF pick.
//!
//! [`Candidates::fill`] takes the processed logits, scales them by the temperature relative to
//! the best one, applies top-k to those scaled logits, and only then turns the survivors into
//! unnormalised weights `exp((logit - max) / temperature)`, so a small `k` spares most of the
//! `exp` calls. NaN and `-inf` logits, and tokens whose weight underflows to zero, are never
//! candidates (they could not be drawn anyway).
//!
//! Every step ranks candidates by one total order, *descending weight, ties by lower id*,
//! which depends only on the logits, so the outcome does too. Nothing sorts the whole
//! vocabulary: top-k partitions with `select_nth_unstable_by` and leaves its `k` survivors
//! unsorted; top-p and the draw use the weighted selection of `select`.

use super::select::{first_reaching, rank};
use super::{Rng, max_logit};

/// The scratch list of candidate `(id, weight)` pairs, reused from one call to the next.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    items: Vec<(u32, f32)>,
}

impl Candidates {
    /// Refills the list from processed `logits` at `temperature` (> 0) and keeps the `top_k`
    /// best (`0` means no limit). NaN and `-inf` logits are not candidates, `+inf` counts as
    /// `f32::MAX`. Returns `false` when nothing is left.
    pub(crate) fn fill(&mut self, logits: &[f32], temperature: f32, top_k: usize) -> bool {
        self.items.clear();
        let max = max_logit(logits);
        if max == f32::NEG_INFINITY {
            return false;
        }
        let max = max.min(f32::MAX);
        for (id, &x) in (0u32..).zip(logits) {
            // NaN fails the test; so does `-inf`, and `-inf / inf` (NaN) for `+inf` temperature.
            let scaled = (x.min(f32::MAX) - max) / temperature;
            if scaled > f32::NEG_INFINITY && !x.is_nan() {
                self.items.push((id, scaled));
            }
        }
        // Ranking scaled logits ranks weights: `exp` is monotone.
        if top_k > 0 && top_k < self.items.len() {
            self.items.select_nth_unstable_by(top_k - 1, rank);
            self.items.truncate(top_k);
        }
        self.items.retain_mut(|c| {
            c.1 = c.1.exp();
            c.1 > 0.0
        });
        !self.items.is_empty()
    }

    /// Keeps the smallest set of best candidates whose share of the remaining mass is at least
    /// `top_p` (always at least one; `top_p >= 1` means off).
    pub(crate) fn top_p(&mut self, top_p: f32) {
        if top_p.is_nan() || top_p >= 1.0 || self.items.is_empty() {
            return;
        }
        let total = self.total();
        let target = f64::from(top_p) * total;
        let last = first_reaching(&mut self.items, total, |cum| cum >= target);
        self.items.truncate(last + 1);
    }

    /// Drops candidates whose weight is below `min_p` times the largest one (`0` means off).
    pub(crate) fn min_p(&mut self, min_p: f32) {
        if min_p.is_nan() || min_p <= 0.0 {
            return;
        }
        let max = self.items.iter().fold(0.0f32, |m, &(_, w)| m.max(w));
        let threshold = f64::from(min_p.min(1.0)) * f64::from(max);
        self.items.retain(|&(_, w)| f64::from(w) >= threshold);
    }

    /// Picks one candidate by inverse CDF in rank order with one draw from `rng`.
    /// Returns `None` (after drawing) when the list is empty.
    pub(crate) fn draw(&mut self, rng: &mut Rng) -> Option<u32> {
        let u = rng.next_f64();
        if self.items.is_empty() {
            return None;
        }
        let total = self.total();
        let target = u * total;
        let at = first_reaching(&mut self.items, total, |cum| cum > target);
        self.items.get(at).map(|&(id, _)| id)
    }

    /// The kept ids in rank order (sorts everything; for tests).
    #[cfg(test)]
    pub(crate) fn ranked_ids(&mut self) -> Vec<u32> {
        self.items.sort_unstable_by(rank);
        self.items.iter().map(|&(id, _)| id).collect()
    }

    /// The total weight of the candidates, summed in `f64`.
    fn total(&self) -> f64 {
        self.items.iter().map(|&(_, w)| f64::from(w)).sum()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn filled(logits: &[f32], temperature: f32) -> Candidates {
        filled_k(logits, temperature, 0)
    }

    fn filled_k(logits: &[f32], temperature: f32, top_k: usize) -> Candidates {
        let mut c = Candidates::default();
        assert!(c.fill(logits, temperature, top_k));
        c
    }

    /// Logits whose softmax is exactly proportional to `weights`.
    fn logits_for(weights: &[f64]) -> Vec<f32> {
        weights.iter().map(|w| w.ln() as f32).collect()
    }

    #[test]
    fn fill_skips_nan_and_neg_inf_and_handles_pos_inf() {
        let mut c = Candidates::default();
        assert!(!c.fill(&[f32::NAN, f32::NEG_INFINITY], 1.0, 0));
        assert!(!c.fill(&[], 1.0, 0));
        let mut c = filled(&[f32::NAN, 0.0, f32::NEG_INFINITY, 1.0], 1.0);
        assert_eq!(c.ranked_ids(), [3, 1]);
        let mut c = filled(&[0.0, f32::INFINITY, 1.0], 1.0);
        assert_eq!(c.ranked_ids(), [1]);
        let mut c = filled(&[0.0, 1.0], f32::INFINITY);
        assert_eq!(c.ranked_ids(), [0, 1], "infinite temperature is uniform");
    }

    #[test]
    fn top_k_keeps_the_k_best_with_ties_by_lower_id() {
        let mut c = filled_k(&[1.0, 5.0, 3.0, 5.0, 4.0, 3.0], 1.0, 3);
        assert_eq!(c.ranked_ids(), [1, 3, 4]);
        let mut c = filled_k(&[1.0, 3.0, 3.0, 3.0], 1.0, 2);
        assert_eq!(c.ranked_ids(), [1, 2]);
        let mut c = filled_k(&[f32::NAN, 2.0, f32::NEG_INFINITY], 1.0, 2);
        assert_eq!(c.ranked_ids(), [1]);
        for k in [0, 2, 10] {
            let mut c = filled_k(&[1.0, 2.0], 1.0, k);
            assert_eq!(c.ranked_ids(), [1, 0]);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        let logits = logits_for(&[0.05, 0.5, 0.15, 0.3]);
        let kept = |p: f32| {
            let mut c = filled(&logits, 1.0);
            c.top_p(p);
            c.ranked_ids()
        };
        assert_eq!(kept(1e-6), [1]);
        assert_eq!(kept(0.0), [1]);
        assert_eq!(kept(0.45), [1]);
        assert_eq!(kept(0.75), [1, 3]);
        assert_eq!(kept(0.85), [1, 3, 2]);
        assert_eq!(kept(0.99), [1, 3, 2, 0]);
        assert_eq!(kept(1.0), [1, 3, 2, 0]);
    }

    #[test]
    fn top_p_after_top_k_uses_the_renormalised_mass() {
        // After top-2 the masses are 0.625 and 0.375, so top-p 0.6 keeps one and 0.7 two.
        let logits = logits_for(&[0.05, 0.5, 0.15, 0.3]);
        for (p, expected) in [(0.6, vec![1]), (0.7, vec![1, 3])] {
            let mut c = filled_k(&logits, 1.0, 2);
            c.top_p(p);
            assert_eq!(c.ranked_ids(), expected);
        }
    }

    #[test]
    fn top_p_on_a_flat_distribution_keeps_the_lowest_ids() {
        // 1000 equal tokens: 0.4995 of the mass needs 500 of them, the lowest ids.
        let mut c = filled(&vec![0.0; 1000], 1.0);
        c.top_p(0.4995);
        assert_eq!(c.ranked_ids(), (0..500).collect::<Vec<u32>>());
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_maximum() {
        // Relative to the best: 1, e^-1 ~ 0.37, e^-3 ~ 0.05.
        let mut c = filled(&[-1.0, 0.0, -3.0], 1.0);
        c.min_p(0.1);
        assert_eq!(c.ranked_ids(), [1, 0]);
        let mut c = filled(&[-1.0, 0.0, -3.0], 1.0);
        c.min_p(0.0);
        assert_eq!(c.ranked_ids(), [1, 0, 2]);
        let mut c = filled(&[-1.0, 0.0, 0.0], 1.0);
        c.min_p(1.0);
        assert_eq!(c.ranked_ids(), [1, 2]);
    }

    #[test]
    fn min_p_after_top_p_keeps_the_best() {
        let logits: Vec<f32> = (0..300).map(|i| -(i as f32) * 0.05).collect();
        let mut c = filled(&logits, 1.0);
        c.top_p(0.5);
        let after_top_p = c.items.len();
        c.min_p(0.7);
        let kept = c.ranked_ids();
        assert!(kept.len() < after_top_p);
        assert_eq!(kept, (0..kept.len() as u32).collect::<Vec<_>>());
    }

    #[test]
    fn draw_uses_one_uniform_and_inverse_cdf_in_rank_order() {
        let logits = logits_for(&[0.25, 0.5, 0.25]);
        let mut rng = Rng::new(11);
        let mut reference = rng.clone();
        for _ in 0..200 {
            let mut c = filled(&logits, 1.0);
            let token = c.draw(&mut rng);
            // Rank order is 1 (0.5), 0 (0.25), 2 (0.25).
            let u = reference.next_f64();
            let expected = if u < 0.5 {
                1
            } else if u < 0.75 {
                0
            } else {
                2
            };
            assert_eq!(token, Some(expected));
        }
        let mut empty = Candidates::default();
        let mut a = Rng::new(1);
        assert_eq!(empty.draw(&mut a), None);
        let mut b = Rng::new(1);
        b.next_u64();
        assert_eq!(a, b, "an empty draw still consumes its uniform");
    }

    #[test]
    fn draw_reaches_deep_into_a_flat_distribution() {
        let mut rng = Rng::new(5);
        let mut max_seen = 0;
        for _ in 0..200 {
            let mut c = filled(&vec![0.0; 5000], 1.0);
            let token = c.draw(&mut rng).unwrap();
            assert!(token < 5000);
            max_seen = max_seen.max(token);
        }
        assert!(max_seen > 4000, "max drawn {max_seen}");
    }
}
