//! The small f32 kernels the CPU device needs beside its matrix products: RMSNorm, SiLU
//! gating, RoPE and sums.

use rayon::prelude::*;

use crate::model::architecture::gelu_tanh;

/// RMSNorm of each row of `x` (width `weight.len()`) into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, row)| {
            let inv = inverse_rms(row, eps);
            for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
                *o = w * (v * inv);
            }
        });
}

/// RMSNorm of each head (width `weight.len()`) of `heads`, in place: Qwen3's query and key
/// norms, on one row's heads.
pub fn head_norm(heads: &mut [f32], weight: &[f32], eps: f32) {
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

/// `gate_up` rows hold `[gate | up]` (width 2f); writes `silu(gate) * up` rows of width f.
pub fn silu_gate(gate_up: &[f32], f: usize, out: &mut [f32]) {
    out.par_chunks_mut(f)
        .zip(gate_up.par_chunks(2 * f))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(f);
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        });
}

/// `gate_up` rows hold `[gate | up]` (width 2f); writes `gelu_tanh(gate) * up` rows of width f.
pub fn gelu_gate(gate_up: &[f32], f: usize, out: &mut [f32]) {
    out.par_chunks_mut(f)
        .zip(gate_up.par_chunks(2 * f))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(f);
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                *o = gelu_tanh(*g) * u;
            }
        });
}

/// `x += y`, element by element.
pub fn add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
}

/// Cosines and sines of each row's angles (rows × `inv_freq.len()` each), for the rows'
/// `positions`, times `scale`; angles in f32 as `transformers` computes them.
pub fn rotary_angles(
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
pub fn rope(row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
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
