//! Deterministic random numbers for sampling: xoshiro256** seeded through SplitMix64.
//!
//! The stream depends only on the seed, on every platform and in every release, so a request
//! with a fixed seed reproduces its tokens. Not for anything that needs unpredictability.

/// The SplitMix64 increment (2^64 divided by the golden ratio).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function: a bijection that scrambles every bit of `z`.
fn scramble(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One SplitMix64 step: advances `state` and returns the next output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN);
    scramble(*state)
}

/// Mixes several words into one seed, SplitMix-style; order matters, so
/// `mix(&[seed, 0])`, `mix(&[seed, 1])` and `mix(&[1, seed])` all differ.
///
/// Typical use: `mix(&[request_seed, choice_index])` gives each choice of an `n > 1` request its
/// own reproducible stream.
#[must_use]
pub fn mix(words: &[u64]) -> u64 {
    words.iter().fold(GOLDEN, |acc, &word| {
        scramble(acc.wrapping_add(GOLDEN) ^ scramble(word.wrapping_add(GOLDEN)))
    })
}

/// A deterministic xoshiro256** generator whose state is seeded through SplitMix64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is determined by `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        // Four consecutive SplitMix64 outputs are never all zero, the one forbidden state.
        let state = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { state }
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform draw in `[0, 1)` with 53 bits of precision (one `next_u64`).
    pub fn next_f64(&mut self) -> f64 {
        const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
        (self.next_u64() >> 11) as f64 * SCALE
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_different_seed_differs() {
        let stream = |seed| {
            let mut r = Rng::new(seed);
            (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(stream(7), stream(7));
        assert_ne!(stream(7), stream(8));
        assert_ne!(stream(0), vec![0; 8]);
    }

    #[test]
    fn known_answer_pins_the_algorithm() {
        // SplitMix64 from 0 is a published sequence: its first output is 0xE220A8397B1DCDAF.
        let mut sm = 0;
        assert_eq!(splitmix64(&mut sm), 0xE220_A839_7B1D_CDAF);
        // xoshiro256** from the state [1, 2, 3, 4] (the reference implementation's outputs).
        let mut r = Rng {
            state: [1, 2, 3, 4],
        };
        let outputs: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(
            outputs,
            [11_520, 0, 1_509_978_240, 1_215_971_899_390_074_240]
        );
    }

    #[test]
    fn unit_draws_are_in_range_and_roughly_uniform() {
        let mut r = Rng::new(42);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        let mean = sum / f64::from(n);
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn mix_depends_on_every_word_and_their_order() {
        assert_ne!(mix(&[1, 2]), mix(&[2, 1]));
        assert_ne!(mix(&[5, 0]), mix(&[5, 1]));
        assert_ne!(mix(&[0]), mix(&[0, 0]));
        assert_ne!(mix(&[]), mix(&[0]));
        assert_eq!(mix(&[9, 3]), mix(&[9, 3]));
    }
}
