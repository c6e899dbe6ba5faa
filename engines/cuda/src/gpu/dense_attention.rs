//! Which attention path each token of a step takes, and the matrix-product path for long
//! prefill chunks.
//!
//! The paged kernel (`kernels/attention.cu`) walks each query's context one position per warp:
//! right for decode, where a token reads each cached position once, but a prompt of n tokens
//! then reads its context n times over and spends its time on latency, not arithmetic. A chunk
//! of at least [`DENSE_MIN_TOKENS`] prompt tokens instead gathers its context into contiguous
//! K and V once per layer and runs as two batched cuBLAS products on the tensor cores (scores,
//! then probabilities times values) with `masked_softmax` between them, in tiles of query rows
//! so the scores never take more than [`SCORE_ELEMENTS`]. Every other token (decode, short
//! chunks, contexts past the gathered buffer) stays on the paged kernel, in ranges of
//! consecutive rows.

use cudarc::driver::sys::CUdeviceptr;

use super::blas::{Operand, Strided};
use super::forward::Model;
use super::inputs::KvCache;
use super::launch::{arg, launch};
use super::workspace::{Workspace, attention_splits};
use crate::device::{Chunk, DeviceError};

/// Prompt tokens a chunk needs before it takes the product path.
pub(super) const DENSE_MIN_TOKENS: usize = 64;
/// The longest context the gathered K and V hold (longer chunks stay paged).
pub(super) const DENSE_MAX_CONTEXT: usize = 32_768;
/// Query rows one tile takes at most.
pub(super) const DENSE_ROWS: usize = 1024;
/// The scores one tile may hold (f32, and the same count of bf16 probabilities).
pub(super) const SCORE_ELEMENTS: usize = 1 << 25;
/// Threads per block of the softmax.
const SOFTMAX_THREADS: u32 = 256;
/// Threads per block of the gathers.
const GATHER_THREADS: u32 = 128;

/// Consecutive token rows for the paged kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PagedRange {
    pub first: usize,
    pub tokens: usize,
    pub splits: usize,
}

/// A prefill chunk for the product path: its first token row, its token count, the position
/// of its first token and its row of the block tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DenseChunk {
    pub row: usize,
    pub len: usize,
    pub start: usize,
    pub seq: usize,
}

/// How one step's tokens are attended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct AttentionPlan {
    pub paged: Vec<PagedRange>,
    pub dense: Vec<DenseChunk>,
}

impl AttentionPlan {
    /// Every token through the paged kernel in `splits` spans (decode graphs).
    pub(super) fn paged(tokens: usize, splits: usize) -> Self {
        Self {
            paged: vec![PagedRange {
                first: 0,
                tokens,
                splits,
            }],
            dense: Vec::new(),
        }
    }

    /// The plan for `chunks` laid out in order: long prefill chunks whose context fits
    /// `dense_context` take the product path, the rest run paged.
    pub(super) fn new(
        chunks: &[Chunk<'_>],
        heads: usize,
        kv_heads: usize,
        dense_context: usize,
    ) -> Self {
        let mut plan = Self::default();
        let (mut row, mut open): (usize, Option<(usize, usize)>) = (0, None);
        let close = |plan: &mut Self, open: &mut Option<(usize, usize)>, end: usize| {
            if let Some((first, context)) = open.take() {
                let tokens = end - first;
                let splits = attention_splits(tokens, heads, context);
                plan.paged.push(PagedRange {
                    first,
                    tokens,
                    splits,
                });
            }
        };
        for (seq, chunk) in chunks.iter().enumerate() {
            let len = chunk.tokens.len();
            let end = chunk.start + len;
            if len >= DENSE_MIN_TOKENS && end <= dense_context && tile_rows(kv_heads, end) >= 16 {
                close(&mut plan, &mut open, row);
                plan.dense.push(DenseChunk {
                    row,
                    len,
                    start: chunk.start,
                    seq,
                });
            } else if len > 0 {
                let (first, context) = open.unwrap_or((row, 0));
                open = Some((first, context.max(end)));
            }
            row += len;
        }
        close(&mut plan, &mut open, row);
        plan
    }
}

/// Query rows per tile for a context of `context` positions: a multiple of 16, at most
/// [`DENSE_ROWS`], with the tile's scores within [`SCORE_ELEMENTS`].
pub(super) fn tile_rows(kv_heads: usize, context: usize) -> usize {
    let fit = SCORE_ELEMENTS / (kv_heads.max(1) * context.max(1));
    fit.min(DENSE_ROWS) / 16 * 16
}

impl Model<'_> {
    /// Attention for one dense chunk of `layer`, into `ws.attn`'s rows of the chunk.
    pub(super) fn dense_attention(
        &self,
        ws: &Workspace,
        kv: &KvCache,
        layer: usize,
        chunk: &DenseChunk,
    ) -> Result<(), DeviceError> {
        let spec = self.spec;
        let (hq, hkv, hd) = (spec.num_heads, spec.num_kv_heads, spec.head_dim);
        let group = hq / hkv.max(1);
        let context = chunk.start + chunk.len;
        let k = &self.kernels;
        let (seq, block_size) = (chunk.seq as i32, kv.block_size as i32);
        let (kv_heads, head_dim) = (hkv as i32, hd as i32);
        launch(
            &k.gather_kv,
            (context as u32, 1, 1),
            GATHER_THREADS,
            self.stream,
            &mut [
                arg(&kv.k[layer].ptr()),
                arg(&kv.v[layer].ptr()),
                arg(&ws.block_tables.ptr()),
                arg(&ws.table_stride.ptr()),
                arg(&seq),
                arg(&block_size),
                arg(&kv_heads),
                arg(&head_dim),
                arg(&ws.dense_k.ptr()),
                arg(&ws.dense_v.ptr()),
            ],
        )?;
        let window = spec.arch.windows.get(layer).copied().flatten().unwrap_or(0) as i32;
        let softcap = spec.arch.attn_softcap.unwrap_or(0.0);
        let rows = tile_rows(hkv, context).max(16);
        let mut done = 0;
        while done < chunk.len {
            let qt = rows.min(chunk.len - done);
            let width = chunk.start + done + qt;
            let first_row = (chunk.row + done) as i32;
            launch(
                &k.pack_queries,
                (qt as u32, hq as u32, 1),
                hd.min(256) as u32,
                self.stream,
                &mut [
                    arg(&ws.q.ptr()),
                    arg(&first_row),
                    arg(&head_dim),
                    arg(&ws.dense_q.ptr()),
                ],
            )?;
            let first_position = (chunk.start + done) as i32;
            let width_i = width as i32;
            for g in 0..group {
                // scores[b][i][j] = scale · q[b·group + g][i] · k[b][j]
                self.blas.strided(&Strided {
                    transpose_a: true,
                    m: width,
                    n: qt,
                    k: hd,
                    alpha: spec.arch.attn_scale,
                    a: Operand::new(ws.dense_k.ptr(), hd, context * hd),
                    b: Operand::new(bf16_at(ws.dense_q.ptr(), g * qt * hd), hd, group * qt * hd),
                    c: Operand::new(ws.scores.ptr(), width, qt * width),
                    c_bf16: false,
                    batch: hkv,
                })?;
                launch(
                    &k.masked_softmax,
                    (qt as u32, hkv as u32, 1),
                    SOFTMAX_THREADS,
                    self.stream,
                    &mut [
                        arg(&ws.scores.ptr()),
                        arg(&width_i),
                        arg(&first_position),
                        arg(&window),
                        arg(&softcap),
                        arg(&ws.probs.ptr()),
                    ],
                )?;
                // out[i][b·group + g] = Σ_j probs[b][i][j] · v[b][j]
                let out = bf16_at(ws.attn.ptr(), ((chunk.row + done) * hq + g) * hd);
                self.blas.strided(&Strided {
                    transpose_a: false,
                    m: hd,
                    n: qt,
                    k: width,
                    alpha: 1.0,
                    a: Operand::new(ws.dense_v.ptr(), hd, context * hd),
                    b: Operand::new(ws.probs.ptr(), width, qt * width),
                    c: Operand::new(out, hq * hd, group * hd),
                    c_bf16: true,
                    batch: hkv,
                })?;
            }
            done += qt;
        }
        Ok(())
    }
}

/// The address of bf16 element `index` of a buffer.
fn bf16_at(base: CUdeviceptr, index: usize) -> CUdeviceptr {
    base + (index * 2) as CUdeviceptr
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk<'a>(tokens: &'a [u32], start: usize, table: &'a [u32]) -> Chunk<'a> {
        Chunk {
            tokens,
            start,
            block_table: table,
            logits: true,
            generated: false,
            drafts: 0,
        }
    }

    #[test]
    fn long_prompts_take_products_and_the_rest_run_paged_in_ranges() {
        let (long, short, one) = (vec![1u32; 300], vec![1u32; 20], vec![1u32; 1]);
        let table = vec![0u32; 64];
        let chunks = [
            chunk(&one, 40, &table),
            chunk(&short, 0, &table),
            chunk(&long, 100, &table),
            chunk(&one, 7, &table),
        ];
        let plan = AttentionPlan::new(&chunks, 32, 8, 8192);
        assert_eq!(
            plan.dense,
            vec![DenseChunk {
                row: 21,
                len: 300,
                start: 100,
                seq: 2
            }]
        );
        assert_eq!(plan.paged.len(), 2);
        assert_eq!((plan.paged[0].first, plan.paged[0].tokens), (0, 21));
        assert_eq!((plan.paged[1].first, plan.paged[1].tokens), (321, 1));
        // A context past the gathered buffer stays paged, as one range with its neighbours.
        let plan = AttentionPlan::new(&chunks, 32, 8, 256);
        assert!(plan.dense.is_empty());
        assert_eq!(plan.paged.len(), 1);
        assert_eq!(plan.paged[0].tokens, 322);
    }

    #[test]
    fn tiles_keep_the_scores_within_their_buffer() {
        assert_eq!(tile_rows(8, 4096), 1024);
        for (kv_heads, context) in [(8, 32_768), (1, 32_768), (2, 100), (4, 20_000)] {
            let rows = tile_rows(kv_heads, context);
            assert!(rows >= 16 && rows.is_multiple_of(16) && rows <= DENSE_ROWS);
            assert!(rows * kv_heads * context <= SCORE_ELEMENTS);
        }
    }
}
