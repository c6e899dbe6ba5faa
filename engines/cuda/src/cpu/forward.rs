//! One forward pass of a Llama-family model over a batch of chunks, in f32, reading and writing
//! the paged KV cache: the same math as Hugging Face `LlamaForCausalLM` / `Qwen2ForCausalLM`.

use rayon::prelude::*;

use super::kv::KvStore;
use super::linalg::{add_into, dot, linear, rms_norm, rope, silu_gate};
use crate::device::{Chunk, DeviceError};
use crate::model::CpuWeights;
use crate::model::{ModelSpec, RopeScaling};

/// Rotary inverse frequencies, computed in f32 the way `transformers` does, with scaling.
pub fn inverse_frequencies(spec: &ModelSpec) -> Vec<f32> {
    let dim = spec.head_dim;
    let base: Vec<f32> = (0..dim / 2)
        .map(|i| 1.0 / spec.rope_theta.powf((2 * i) as f32 / dim as f32))
        .collect();
    match spec.rope_scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => {
            let low_wavelen = original_max_position / low_freq_factor;
            let high_wavelen = original_max_position / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original_max_position / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// Where each row of the batch sits, and where every position of each chunk's sequence lives in
/// the cache: resolved through the block tables once per step, shared by every layer.
struct Rows {
    /// (chunk index, position) per row.
    at: Vec<(usize, usize)>,
    /// Per chunk, the cache offset of positions `0..start + len`.
    offsets: Vec<Vec<usize>>,
}

impl Rows {
    fn new(chunks: &[Chunk<'_>], kv: &KvStore) -> Result<Self, DeviceError> {
        let at = chunks
            .iter()
            .enumerate()
            .flat_map(|(c, chunk)| (0..chunk.tokens.len()).map(move |i| (c, chunk.start + i)))
            .collect();
        let offsets = chunks
            .iter()
            .map(|chunk| {
                (0..chunk.start + chunk.tokens.len())
                    .map(|pos| {
                        kv.offset(chunk.block_table, pos).ok_or_else(|| {
                            DeviceError::InvalidBatch(format!(
                                "position {pos} has no block in its table"
                            ))
                        })
                    })
                    .collect()
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { at, offsets })
    }

    /// The cache offsets of positions `0..=pos` of chunk `c`'s sequence.
    fn history(&self, c: usize, pos: usize) -> &[usize] {
        &self.offsets[c][..=pos]
    }
}

/// The attention shape of a model.
#[derive(Clone, Copy)]
struct Heads {
    query: usize,
    kv: usize,
    dim: usize,
    scale: f32,
}

/// Runs every layer over the batch and returns the residual stream (rows × hidden), before the
/// final norm. Keys and values of every row are written to `kv`.
pub fn hidden_states(
    spec: &ModelSpec,
    w: &CpuWeights,
    inv_freq: &[f32],
    kv: &mut KvStore,
    chunks: &[Chunk<'_>],
) -> Result<Vec<f32>, DeviceError> {
    let rows = Rows::new(chunks, kv)?;
    let t = rows.at.len();
    let d = spec.hidden_size;
    let (hd, nh, nkv) = (spec.head_dim, spec.num_heads, spec.num_kv_heads);
    let (qw, kvw) = (nh * hd, nkv * hd);
    let qkv_w = qw + 2 * kvw;
    let f = spec.intermediate_size;

    let slots: Vec<usize> = rows
        .at
        .iter()
        .map(|&(c, pos)| rows.offsets[c][pos])
        .collect();
    let mut x = Vec::with_capacity(t * d);
    for chunk in chunks {
        for &tok in chunk.tokens {
            let row = w
                .embed
                .get(tok as usize * d..(tok as usize + 1) * d)
                .ok_or_else(|| {
                    DeviceError::InvalidBatch(format!("token {tok} is outside the vocabulary"))
                })?;
            x.extend_from_slice(row);
        }
    }
    // cos/sin per row, shared by every layer; angles in f32 as `transformers` computes them.
    let half = hd / 2;
    let mut cos = vec![0.0f32; t * half];
    let mut sin = vec![0.0f32; t * half];
    for (r, &(_, pos)) in rows.at.iter().enumerate() {
        for (i, f) in inv_freq.iter().enumerate() {
            let angle = f64::from(pos as f32 * f);
            cos[r * half + i] = angle.cos() as f32;
            sin[r * half + i] = angle.sin() as f32;
        }
    }

    let mut h = vec![0.0f32; t * d];
    let mut qkv = vec![0.0f32; t * qkv_w];
    let mut attn = vec![0.0f32; t * qw];
    let mut proj = vec![0.0f32; t * d];
    let mut gate_up = vec![0.0f32; t * 2 * f];
    let mut act = vec![0.0f32; t * f];
    let heads = Heads {
        query: nh,
        kv: nkv,
        dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    for (l, layer) in w.layers.iter().enumerate() {
        rms_norm(&x, &layer.attn_norm, spec.rms_norm_eps, &mut h);
        linear(
            &h,
            &layer.qkv,
            layer.qkv_bias.as_deref(),
            &mut qkv,
            d,
            qkv_w,
        );
        qkv.par_chunks_mut(qkv_w).enumerate().for_each(|(r, row)| {
            let (c, s) = (
                &cos[r * half..(r + 1) * half],
                &sin[r * half..(r + 1) * half],
            );
            rope(&mut row[..qw + kvw], c, s);
        });
        {
            let (keys, values) = kv.layer_mut(l);
            for (r, &slot) in slots.iter().enumerate() {
                let row = &qkv[r * qkv_w..(r + 1) * qkv_w];
                keys[slot..slot + kvw].copy_from_slice(&row[qw..qw + kvw]);
                values[slot..slot + kvw].copy_from_slice(&row[qw + kvw..]);
            }
        }
        let (keys, values) = kv.layer(l);
        attn.par_chunks_mut(qw).enumerate().for_each(|(r, out)| {
            let (c, pos) = rows.at[r];
            let q_row = &qkv[r * qkv_w..r * qkv_w + qw];
            attend(keys, values, rows.history(c, pos), q_row, out, heads);
        });
        linear(&attn, &layer.o, layer.o_bias.as_deref(), &mut proj, qw, d);
        add_into(&mut x, &proj);
        rms_norm(&x, &layer.mlp_norm, spec.rms_norm_eps, &mut h);
        linear(&h, &layer.gate_up, None, &mut gate_up, d, 2 * f);
        silu_gate(&gate_up, f, &mut act);
        linear(&act, &layer.down, None, &mut proj, f, d);
        add_into(&mut x, &proj);
    }
    Ok(x)
}

/// Causal attention of one query row (all heads) over the positions at `offsets` (its
/// sequence up to and including itself).
fn attend(
    keys: &[f32],
    values: &[f32],
    offsets: &[usize],
    q: &[f32],
    out: &mut [f32],
    heads: Heads,
) {
    let Heads {
        query: nh,
        kv: nkv,
        dim: hd,
        scale,
    } = heads;
    let group = nh / nkv;
    let mut scores = vec![0.0f32; offsets.len()];
    for head in 0..nh {
        let g = head / group;
        let qh = &q[head * hd..(head + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for (s, &o) in scores.iter_mut().zip(offsets) {
            let k = &keys[o + g * hd..o + (g + 1) * hd];
            *s = dot(qh, k) * scale;
            max = max.max(*s);
        }
        let mut sum = 0.0f32;
        for s in &mut scores {
            *s = (*s - max).exp();
            sum += *s;
        }
        let oh = &mut out[head * hd..(head + 1) * hd];
        oh.fill(0.0);
        for (s, &o) in scores.iter().zip(offsets) {
            let p = s / sum;
            let v = &values[o + g * hd..o + (g + 1) * hd];
            for (acc, v) in oh.iter_mut().zip(v) {
                *acc += p * v;
            }
        }
    }
}

/// Final norm and output projection of chosen rows of the residual stream.
pub fn logits(spec: &ModelSpec, w: &CpuWeights, x: &[f32], rows: &[usize]) -> Vec<f32> {
    let d = spec.hidden_size;
    let mut picked = Vec::with_capacity(rows.len() * d);
    for &r in rows {
        picked.extend_from_slice(&x[r * d..(r + 1) * d]);
    }
    let mut normed = vec![0.0f32; picked.len()];
    rms_norm(&picked, &w.norm, spec.rms_norm_eps, &mut normed);
    let mut out = vec![0.0f32; rows.len() * spec.vocab_size];
    linear(&normed, w.output(), None, &mut out, d, spec.vocab_size);
    out
}
