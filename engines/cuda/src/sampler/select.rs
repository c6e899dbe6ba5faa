//! Weighted selection: where, in rank order, a running sum of weights crosses a target, found in
//! expected linear time without sorting the whole list.
//!
//! Rank order is *descending weight, ties by lower id*, a total order over distinct ids. Both
//! top-p ("the smallest prefix holding enough mass") and the inverse-CDF draw ("the first token
//! whose cumulative weight exceeds `u * total`") are this one question.
//!
//! 1. **Heavy tokens.** At most `HEAVY` candidates can each hold `1 / HEAVY` of the total weight
//!    or more. One linear pass moves them to the front; for the peaked distributions that
//!    language models produce they usually hold the answer, and only they get sorted.
//! 2. **Weighted quickselect** otherwise: partition around a median-of-three pivot, keep the
//!    side whose mass contains the target, and sort the range once it is small. A round limit
//!    bounds the worst case at one sort of the remaining range.

use std::cmp::Ordering;

/// Candidates of at least `total / HEAVY` weight are looked at first (there are at most this
/// many of them).
const HEAVY: u32 = 1024;
/// Ranges this small are sorted and scanned.
const SMALL: usize = 32;
/// Partition rounds before the remaining range is simply sorted.
const MAX_ROUNDS: u32 = 64;

/// Descending weight, then ascending id: the one order every step uses.
pub(crate) fn rank(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The index of the first candidate, in rank order, whose own weight added to the weight of all
/// candidates ranked before it satisfies `done` (a monotone test such as `cum >= target`).
///
/// `items` must be non-empty with positive weights summing to `total`. On return
/// `items[..=index]` hold the `index + 1` best candidates (in no particular order), so
/// truncating to `index + 1` keeps exactly that prefix of the ranking. When rounding means the
/// test is never satisfied, the answer is the last candidate in rank order.
pub(crate) fn first_reaching(
    items: &mut [(u32, f32)],
    total: f64,
    done: impl Fn(f64) -> bool,
) -> usize {
    let len = items.len();
    // Step 1: move the heavy candidates to the front. They all rank before the others.
    let threshold = total / f64::from(HEAVY);
    let mut heavy = 0;
    let mut heavy_mass = 0.0;
    for i in 0..len {
        let w = f64::from(items[i].1);
        if w >= threshold {
            items.swap(heavy, i);
            heavy += 1;
            heavy_mass += w;
        }
    }
    let (mut lo, mut hi, mut cum) = if heavy > 0 && done(heavy_mass) {
        (0, heavy, 0.0)
    } else if heavy < len {
        (heavy, len, heavy_mass)
    } else {
        (0, len, 0.0)
    };

    // Step 2: weighted quickselect within `items[lo..hi]`; `cum` is the weight ranked before it.
    let mut rounds = 0;
    while hi - lo > SMALL && rounds < MAX_ROUNDS {
        rounds += 1;
        let p = median_of_three(items, lo, hi);
        items.swap(p, hi - 1);
        let pivot = items[hi - 1];
        let mut store = lo;
        let mut mass = 0.0;
        for i in lo..hi - 1 {
            if rank(&items[i], &pivot) == Ordering::Less {
                mass += f64::from(items[i].1);
                items.swap(store, i);
                store += 1;
            }
        }
        items.swap(store, hi - 1);
        // Now `items[lo..store]` rank before the pivot at `store`, `items[store + 1..hi]` after.
        if store > lo && done(cum + mass) {
            hi = store;
        } else {
            cum += mass + f64::from(pivot.1);
            if done(cum) {
                return store;
            }
            lo = store + 1;
        }
    }

    // Step 3: sort what is left and scan it.
    items[lo..hi].sort_unstable_by(rank);
    for (at, &(_, w)) in items.iter().enumerate().take(hi).skip(lo) {
        cum += f64::from(w);
        if done(cum) {
            return at;
        }
    }
    hi.saturating_sub(1)
}

/// The index of the median, by rank, of the first, middle and last items of `items[lo..hi]`.
fn median_of_three(items: &[(u32, f32)], lo: usize, hi: usize) -> usize {
    let (a, b, c) = (lo, lo + (hi - lo) / 2, hi - 1);
    let less = |x: usize, y: usize| rank(&items[x], &items[y]) == Ordering::Less;
    if less(a, b) {
        if less(b, c) {
            b
        } else if less(a, c) {
            c
        } else {
            a
        }
    } else if less(a, c) {
        a
    } else if less(b, c) {
        c
    } else {
        b
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::Rng;
    use super::*;

    /// The answer by brute force (sort everything, scan), and the ids in rank order.
    fn reference(items: &[(u32, f32)], done: impl Fn(f64) -> bool) -> (usize, Vec<u32>) {
        let mut sorted = items.to_vec();
        sorted.sort_unstable_by(rank);
        let mut cum = 0.0;
        let mut at = sorted.len() - 1;
        for (i, &(_, w)) in sorted.iter().enumerate() {
            cum += f64::from(w);
            if done(cum) {
                at = i;
                break;
            }
        }
        (at, sorted.iter().map(|&(id, _)| id).collect())
    }

    fn check(items: &[(u32, f32)], fraction: f64) {
        let total: f64 = items.iter().map(|&(_, w)| f64::from(w)).sum();
        let target = fraction * total;
        for strict in [false, true] {
            let done = |cum: f64| if strict { cum > target } else { cum >= target };
            let (expected_at, ranked) = reference(items, done);
            let mut work = items.to_vec();
            let at = first_reaching(&mut work, total, done);
            // Sums in another order may round differently at an exact boundary; allow one step.
            assert!(
                at.abs_diff(expected_at) <= 1,
                "{at} vs {expected_at} at {fraction}"
            );
            // Whatever the index, the prefix up to it must be the best tokens.
            let mut ids: Vec<u32> = work[..=at].iter().map(|&(id, _)| id).collect();
            let mut best = ranked[..=at].to_vec();
            ids.sort_unstable();
            best.sort_unstable();
            assert_eq!(ids, best, "the prefix must be the best tokens");
            assert_eq!(
                work[at].0, ranked[at],
                "the answer is the token at that rank"
            );
        }
    }

    fn shapes(rng: &mut Rng, n: u32) -> Vec<Vec<(u32, f32)>> {
        let mut peaked: Vec<(u32, f32)> = (0..n)
            .map(|id| (id, (rng.next_f64() * 8.0 - 12.0).exp() as f32))
            .collect();
        let len = peaked.len();
        for i in 0..5.min(len) {
            peaked[i * 7 % len].1 = 10.0 / (i as f32 + 1.0);
        }
        let flat = (0..n).map(|id| (id, 1.0)).collect();
        let steps = (0..n)
            .map(|id| (id, f32::from(u8::try_from(id % 4).unwrap()) + 1.0))
            .collect();
        let falling = (0..n).map(|id| (id, 1.0 / (id as f32 + 1.0))).collect();
        let rising = (0..n).map(|id| (id, id as f32 + 1.0)).collect();
        vec![peaked, flat, steps, falling, rising]
    }

    #[test]
    fn agrees_with_sorting_on_many_shapes_and_targets() {
        let mut rng = Rng::new(17);
        for n in [1, 2, 3, 33, 100, 2000, 20_000] {
            for items in shapes(&mut rng, n) {
                for fraction in [0.0, 1e-9, 0.1, 0.5, 0.9, 0.95, 0.999_999, 1.0] {
                    check(&items, fraction);
                }
                for _ in 0..5 {
                    check(&items, rng.next_f64());
                }
            }
        }
    }

    #[test]
    fn exact_answers_on_simple_inputs() {
        let mut items = vec![(0, 1.0), (1, 4.0), (2, 2.0), (3, 2.0), (4, 1.0)];
        // Rank order: 1 (4), 2 (2), 3 (2), 0 (1), 4 (1); cumulative 4, 6, 8, 9, 10.
        for (target, id) in [(0.0, 1), (3.9, 1), (4.0, 2), (7.5, 3), (8.0, 0), (9.99, 4)] {
            let at = first_reaching(&mut items, 10.0, |cum| cum > target);
            assert_eq!(items[at].0, id, "target {target}");
        }
        let at = first_reaching(&mut items, 10.0, |cum| cum >= 8.0);
        assert_eq!(items[at].0, 3);
        let at = first_reaching(&mut items, 10.0, |_| false);
        assert_eq!(items[at].0, 4, "never reached: the last in rank order");
    }
}
