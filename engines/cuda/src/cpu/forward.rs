//! One forward pass of a decoder over a batch of chunks, in f32, reading and writing the paged
//! KV cache: the same math as Hugging Face's `LlamaForCausalLM`, `Qwen2`/`Qwen3`, `Gemma2`/
//! `Gemma3` and `Phi3`, the differences read from the model's [`crate::model::architecture`].

use rayon::prelude::*;

use super::attention::{Heads, TILE_ROWS, Tile, attend_tiles};
use super::kv::{KvStore, LayerCache};
use super::linalg::{MIN_ROWS_PER_TASK, add_into, gated, head_norm, rms_norm, rope, rotary_angles};
use super::matmul::{Matrix, linear};
use crate::device::{Chunk, DeviceError};
use crate::model::LayeredWeights;

/// The model's weights as the CPU multiplies them.
pub(super) type DeviceWeights = LayeredWeights<Matrix>;
use crate::model::architecture::softcap;
use crate::model::{ModelSpec, RotaryTables};

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

    /// Each chunk's rows in tiles of at most [`TILE_ROWS`], in row order.
    fn tiles<'a>(&'a self, chunks: &[Chunk<'_>]) -> Vec<Tile<'a>> {
        let mut tiles = Vec::new();
        let mut row = 0;
        for (c, chunk) in chunks.iter().enumerate() {
            for first in (0..chunk.tokens.len()).step_by(TILE_ROWS) {
                let len = TILE_ROWS.min(chunk.tokens.len() - first);
                let pos = chunk.start + first;
                tiles.push(Tile {
                    row: row + first,
                    len,
                    pos,
                    offsets: &self.offsets[c][..pos + len],
                    prompt: !chunk.generated,
                });
            }
            row += chunk.tokens.len();
        }
        tiles
    }
}

/// Runs every layer over the batch and returns the residual stream (rows × hidden), before the
/// final norm. Keys and values of every row are written to `kv`.
pub(super) fn hidden_states(
    spec: &ModelSpec,
    w: &DeviceWeights,
    rotary: &RotaryTables,
    kv: &mut KvStore,
    chunks: &[Chunk<'_>],
) -> Result<Vec<f32>, DeviceError> {
    let rows = Rows::new(chunks, kv)?;
    let arch = &spec.arch;
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
    let mut x = vec![0.0f32; t * d];
    let tokens = chunks.iter().flat_map(|c| c.tokens);
    for (&tok, row) in tokens.zip(x.chunks_exact_mut(d)) {
        if tok as usize >= w.embed.packed.rows {
            return Err(DeviceError::InvalidBatch(format!(
                "token {tok} is outside the vocabulary"
            )));
        }
        w.embed.packed.row_into(tok as usize, row);
        if let Some(scale) = arch.embed_scale {
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
    // cos/sin per row, shared by every layer of a kind; angles in f32 as `transformers`
    // computes them.
    let half = spec.rotary_dim / 2;
    let positions = || rows.at.iter().map(|&(_, pos)| pos);
    let global = rotary_angles(positions(), &rotary.global, rotary.global_scale);
    let local = rotary
        .local
        .as_deref()
        .map(|inv_freq| rotary_angles(positions(), inv_freq, 1.0));

    // Rows of the leading decoding chunks, which some products round to bytes in one pass
    // where prompt rows take two (see `matmul::SecondPass`).
    let rounded: usize = chunks
        .iter()
        .take_while(|c| c.generated)
        .map(|c| c.tokens.len())
        .sum();
    let tiles = rows.tiles(chunks);
    let mut h = vec![0.0f32; t * d];
    let mut qkv = vec![0.0f32; t * qkv_w];
    let mut attn = vec![0.0f32; t * qw];
    let mut proj = vec![0.0f32; t * d];
    let mut gate_up = vec![0.0f32; t * 2 * f];
    let mut act = vec![0.0f32; t * f];
    for (l, layer) in w.layers.iter().enumerate() {
        let heads = Heads {
            query: nh,
            kv: nkv,
            dim: hd,
            scale: arch.attn_scale,
            softcap: arch.attn_softcap,
            window: arch.windows.get(l).copied().flatten(),
        };
        let (cos, sin) = match &local {
            Some(local) if arch.local_rope(l) => local,
            _ => &global,
        };
        rms_norm(&x, vector(&layer.attn_norm)?, spec.rms_norm_eps, &mut h);
        let qkv_bias = bias(layer.qkv_bias.as_ref())?;
        linear(&h, rounded, &layer.qkv, qkv_bias, &mut qkv);
        if let Some((q_norm, k_norm)) = &layer.qk_norm {
            let (q_norm, k_norm) = (vector(q_norm)?, vector(k_norm)?);
            qkv.par_chunks_mut(qkv_w)
                .with_min_len(MIN_ROWS_PER_TASK)
                .for_each(|row| {
                    let (q, k) = row[..qw + kvw].split_at_mut(qw);
                    head_norm(q, q_norm, spec.rms_norm_eps);
                    head_norm(k, k_norm, spec.rms_norm_eps);
                });
        }
        qkv.par_chunks_mut(qkv_w)
            .enumerate()
            .with_min_len(MIN_ROWS_PER_TASK)
            .for_each(|(r, row)| {
                let (c, s) = (
                    &cos[r * half..(r + 1) * half],
                    &sin[r * half..(r + 1) * half],
                );
                rope(&mut row[..qw + kvw], hd, c, s);
            });
        for (r, &slot) in slots.iter().enumerate() {
            let row = &qkv[r * qkv_w..(r + 1) * qkv_w];
            kv.write(l, slot, &row[qw..qw + kvw], &row[qw + kvw..]);
        }
        match kv.layer(l) {
            LayerCache::F32(cache) => attend_tiles(cache, heads, &tiles, &qkv, qkv_w, &mut attn),
            LayerCache::F16(cache) => attend_tiles(cache, heads, &tiles, &qkv, qkv_w, &mut attn),
        }
        let o_bias = bias(layer.o_bias.as_ref())?;
        linear(&attn, rounded, &layer.o, o_bias, &mut proj);
        joins_residual(
            &mut x,
            &mut proj,
            layer.post_attn_norm.as_ref(),
            spec,
            &mut h,
        )?;
        rms_norm(&x, vector(&layer.mlp_norm)?, spec.rms_norm_eps, &mut h);
        linear(&h, rounded, &layer.gate_up, None, &mut gate_up);
        gated(arch.activation, &gate_up, f, &mut act);
        linear(&act, rounded, &layer.down, None, &mut proj);
        joins_residual(
            &mut x,
            &mut proj,
            layer.post_mlp_norm.as_ref(),
            spec,
            &mut h,
        )?;
    }
    Ok(x)
}

/// `x += out`, normalised first where the family norms each output (`scratch`: as wide as
/// `out`).
fn joins_residual(
    x: &mut [f32],
    out: &mut [f32],
    norm: Option<&Matrix>,
    spec: &ModelSpec,
    scratch: &mut [f32],
) -> Result<(), DeviceError> {
    match norm {
        Some(norm) => {
            rms_norm(out, vector(norm)?, spec.rms_norm_eps, scratch);
            add_into(x, scratch);
        }
        None => add_into(x, out),
    }
    Ok(())
}

/// Final norm and output projection of chosen rows of the residual stream, the first
/// `steps` of them decoding steps' (see `matmul::SecondPass`).
pub(super) fn logits(
    spec: &ModelSpec,
    w: &DeviceWeights,
    x: &[f32],
    rows: &[usize],
    steps: usize,
) -> Result<Vec<f32>, DeviceError> {
    let d = spec.hidden_size;
    let mut picked = Vec::with_capacity(rows.len() * d);
    for &r in rows {
        picked.extend_from_slice(&x[r * d..(r + 1) * d]);
    }
    let mut normed = vec![0.0f32; picked.len()];
    rms_norm(&picked, vector(&w.norm)?, spec.rms_norm_eps, &mut normed);
    let mut out = vec![0.0f32; rows.len() * spec.vocab_size];
    linear(&normed, steps, w.output(), None, &mut out);
    if let Some(cap) = spec.arch.final_softcap {
        out.iter_mut().for_each(|l| *l = softcap(*l, cap));
    }
    Ok(out)
}

/// A norm's or bias's values (always read as f32; see [`crate::model::PackedReader`]).
pub(super) fn vector(m: &Matrix) -> Result<&[f32], DeviceError> {
    let p = &m.packed;
    p.as_f32()
        .ok_or_else(|| DeviceError::InvalidBatch(format!("a {} vector, not f32", p.kind())))
}

/// A bias's values, when the layer has one.
fn bias(m: Option<&Matrix>) -> Result<Option<&[f32]>, DeviceError> {
    m.map(vector).transpose()
}
