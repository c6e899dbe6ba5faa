//! Deterministic embeddings: the normalised sum of one pseudo-random vector per token. Inputs
//! that share tokens point in similar directions, so retrieval demos behave plausibly, and the
//! same input always gives the same unit-length vector.

use crate::rng::{Rng, mix};

pub(crate) fn embed(seed: u64, tokens: &[u32], dim: usize) -> Vec<f32> {
    let mut sum = vec![0.0f64; dim];
    let mut add = |key: u64| {
        let mut rng = Rng::new(mix(&[seed, key]));
        for x in &mut sum {
            *x += rng.normal();
        }
    };
    if tokens.is_empty() {
        add(u64::MAX);
    }
    for &t in tokens {
        add(u64::from(t));
    }
    normalise(&sum)
}

/// Scales to unit length (a zero vector stays zero).
pub(crate) fn normalise(v: &[f64]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    v.iter().map(|x| (x * scale) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn unit_length_and_deterministic() {
        let a = embed(1, &[5, 6, 7], 64);
        assert_eq!(a, embed(1, &[5, 6, 7], 64));
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-5);
        assert!((cosine(&embed(1, &[], 8), &embed(1, &[], 8)) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn shared_tokens_mean_closer_vectors() {
        let base = embed(1, &[5, 6, 7, 8], 256);
        let near = embed(1, &[5, 6, 7, 9], 256);
        let far = embed(1, &[100, 200, 300, 400], 256);
        assert!(cosine(&base, &near) > cosine(&base, &far) + 0.3);
    }
}
