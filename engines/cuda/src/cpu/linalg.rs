//! The small f32 kernels the CPU device needs beside its matrix products: RMSNorm, SiLU
//! gating, GELU, RoPE and sums.

use rayon::prelude::*;

use super::simd::{Isa, Kernel, Simd};

use crate::model::architecture::{Activation, gelu_tanh};

/// Rows a task of the row-wise kernels takes at least: a decoding step's few rows run on the
/// calling thread, where waking the pool's other threads for each of a layer's small
/// kernels cost more than the work (a step checking four drafts spent a tenth of its time
/// between the products, against a thirtieth for one row).
pub(super) const MIN_ROWS_PER_TASK: usize = 8;

/// RMSNorm of each row of `x` (width `weight.len()`) into `out`.
pub(super) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(o, row)| {
            let inv = inverse_rms(row, eps);
            for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
                *o = w * (v * inv);
            }
        });
}

/// RMSNorm of each head (width `weight.len()`) of `heads`, in place: Qwen3's query and key
/// norms, on one row's heads.
pub(super) fn head_norm(heads: &mut [f32], weight: &[f32], eps: f32) {
    for head in heads.chunks_exact_mut(weight.len()) {
        let inv = inverse_rms(head, eps);
        for (v, w) in head.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)`.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    1.0 / (mean + eps).sqrt()
}

/// `gate_up` rows hold `[gate | up]` (width 2f); writes `activation(gate) * up` rows of width
/// f, each row compiled for the CPU's instruction set (a call to `expf` per value was most of
/// what a decoding step spent between its products).
pub(super) fn gated(activation: Activation, gate_up: &[f32], f: usize, out: &mut [f32]) {
    let isa = Isa::detected();
    out.par_chunks_mut(f)
        .zip(gate_up.par_chunks(2 * f))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(out, gate_up)| {
            isa.run(Gated {
                activation,
                gate_up,
                out,
            })
        });
}

/// One row of [`gated`], as a [`Kernel`] (plain loops the compiler widens to the lanes).
struct Gated<'a> {
    activation: Activation,
    gate_up: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for Gated<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, _: S) {
        let (g, u) = self.gate_up.split_at(self.out.len());
        let pairs = self.out.iter_mut().zip(g).zip(u);
        match self.activation {
            Activation::Silu => pairs.for_each(|((o, &g), &u)| *o = g / (1.0 + exp(-g)) * u),
            Activation::GeluTanh => pairs.for_each(|((o, &g), &u)| *o = gelu_tanh(g) * u),
        }
    }
}

/// `e^x` within 2 ulp of f32's for results in its normal range (inputs under -87.3 give
/// about 1e-38 instead of less, inputs over 88.3 give e^88.3), branch-free, so a loop of it
/// runs in vector lanes where a call to `expf` per value does not: `x = n·ln 2 + r` with
/// `|r| <= ln 2 / 2`, `e^r` by Cephes' `expf` polynomial, times `2^n` put in the exponent bits.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    let x = x.clamp(-87.336_55, 88.3);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = P.iter().fold(0.0, |acc, &c| acc * r + c);
    let y = p * r * r + r + 1.0;
    // 2^n for -126 <= n <= 127 (the clamped x): n + 127 lands in the low bits of a float
    // of 2^23, whose shift puts it in the exponent, without a float-to-integer conversion
    // (one that saturates is done a lane at a time). A NaN stays NaN.
    y * f32::from_bits((n + (127.0 + 8_388_608.0)).to_bits() << 23)
}

/// `gelu(x)` by the error function, as PyTorch's default `gelu`, element by element into
/// `out`: in chunks on the pool, each compiled for the CPU's instruction set, where a call to
/// `erff` per value took a twentieth of a BERT's time.
pub(super) fn gelu_erf(x: &[f32], out: &mut [f32]) {
    let isa = Isa::detected();
    out.par_chunks_mut(4096)
        .zip(x.par_chunks(4096))
        .for_each(|(out, x)| isa.run(Gelu { x, out }));
}

/// [`gelu_erf`] of one chunk, as a [`Kernel`] (a plain loop the compiler widens to the
/// instruction set's lanes).
struct Gelu<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for Gelu<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, _: S) {
        for (o, &x) in self.out.iter_mut().zip(self.x) {
            *o = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// The error function within 4e-7 (f32 arithmetic): `x · P(x²) / Q(x²)` for |x| <= 4, a
/// rational fit of this project's (weighted least squares on 4001 points of [0, 4]), and ±1
/// beyond, where erf is within 2e-8 of it. Only multiplies, adds and one division, so a loop
/// of it runs in vector lanes.
#[inline(always)]
pub(super) fn erf(x: f32) -> f32 {
    const P: [f32; 7] = [
        std::f32::consts::FRAC_2_SQRT_PI,
        1.846_419_8e-1,
        5.432_984_7e-2,
        3.837_588e-3,
        3.829_112_8e-4,
        4.787_663_3e-6,
        -1.369_681_5e-8,
    ];
    const Q: [f32; 6] = [
        1.0,
        4.969_682_5e-1,
        1.138_036_4e-1,
        1.545_035_9e-2,
        1.309_485_8e-3,
        6.407_803_3e-5,
    ];
    let x = x.clamp(-4.0, 4.0);
    let t = x * x;
    let p = P.iter().rev().fold(0.0, |acc, &c| acc * t + c);
    let q = Q.iter().rev().fold(0.0, |acc, &c| acc * t + c);
    x * p / q
}

/// `x += y`, element by element.
pub(super) fn add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
}

/// Cosines and sines of each row's angles (rows × `inv_freq.len()` each), for the rows'
/// `positions`, times `scale`; angles in f32 as `transformers` computes them.
pub(super) fn rotary_angles(
    positions: impl ExactSizeIterator<Item = usize>,
    inv_freq: &[f32],
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = vec![0.0f32; positions.len() * half];
    let mut sin = vec![0.0f32; cos.len()];
    for (r, pos) in positions.enumerate() {
        for (i, f) in inv_freq.iter().enumerate() {
            let angle = f64::from(pos as f32 * f);
            cos[r * half + i] = angle.cos() as f32 * scale;
            sin[r * half + i] = angle.sin() as f32 * scale;
        }
    }
    (cos, sin)
}

/// Rotates the leading `2 * cos.len()` values of each head (width `head_dim`) of a row in
/// place, the "rotate half" layout of Hugging Face Llama: the pair is (i, i + half); the rest
/// of each head passes through.
pub(super) fn rope(row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in row.chunks_exact_mut(head_dim) {
        let (a, b) = head[..2 * half].split_at_mut(half);
        for i in 0..half {
            let (x, y) = (a[i], b[i]);
            a[i] = x * cos[i] - y * sin[i];
            b[i] = y * cos[i] + x * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn erf_is_within_4e_7_of_libm() {
        let mut worst = 0f32;
        for i in -80_000..=80_000 {
            let x = i as f32 / 10_000.0;
            worst = worst.max((super::erf(x) - libm::erff(x)).abs());
        }
        assert!(worst < 4e-7, "largest error {worst}");
        assert!(super::erf(f32::NAN).is_nan());
    }

    #[test]
    fn exp_is_within_two_ulp_over_the_normal_range() {
        let mut worst = 0f64;
        for i in -873_000..=883_000 {
            let x = i as f32 / 10_000.0;
            let want = f64::from(x).exp();
            worst = worst.max((f64::from(super::exp(x)) - want).abs() / want);
        }
        // Two units in the last place of an f32 (2^-23 relative each at most).
        assert!(
            worst < 2.0 * f64::from(f32::EPSILON),
            "largest error {worst:e}"
        );
        assert!(super::exp(f32::NAN).is_nan());
        assert_eq!(super::exp(0.0), 1.0);
        // Past the range: finite, never infinite or zero (softmax and SiLU divide by sums).
        assert!(super::exp(1000.0).is_finite() && super::exp(-1000.0) > 0.0);
    }

    #[test]
    fn a_silu_gate_in_lanes_matches_the_formula() {
        let f = 37;
        let gate_up: Vec<f32> = (0..3 * 2 * f)
            .map(|i| ((i as f32) * 0.731).sin() * 12.0)
            .collect();
        let mut out = vec![0.0; 3 * f];
        super::gated(super::Activation::Silu, &gate_up, f, &mut out);
        for (r, row) in out.chunks_exact(f).enumerate() {
            let (g, u) = gate_up[r * 2 * f..(r + 1) * 2 * f].split_at(f);
            for ((o, g), u) in row.iter().zip(g).zip(u) {
                let want = g / (1.0 + (-g).exp()) * u;
                assert!(
                    (o - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{o} vs {want}"
                );
            }
        }
    }
}
