//! Fixed buffers for a step: the inputs the host writes, the activations, the attention
//! partials and the logits. All are sized once at load for the largest step the scheduler can
//! plan, so their addresses never change (CUDA graphs rely on that) and GPU memory use is
//! known before the KV cache takes the rest.

use super::dense_attention::{DENSE_MAX_CONTEXT, DENSE_ROWS, SCORE_ELEMENTS};
use super::memory::DeviceBuffer;
use crate::device::DeviceError;
use crate::model::ModelSpec;

/// The attention partial rows (token × head × split) the workspace holds; bounds the splits
/// of long-context steps.
pub(super) const PARTIAL_ROWS: usize = 1 << 18;
/// Positions a split of a step's longest context covers at most, where the partials allow.
pub(super) const PARTITION: usize = 512;
/// Positions a split covers at least.
pub(super) const MIN_SPAN: usize = 64;
/// Blocks (token × head × split) that fill the GPU: a step with fewer is split further.
pub(super) const TARGET_BLOCKS: usize = 1024;

/// The largest step the device must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Tokens per step.
    pub tokens: usize,
    /// Sequences per step (chunks, and so logits rows and sampled choices).
    pub seqs: usize,
    /// Blocks per sequence (the context window over the block size).
    pub blocks_per_seq: usize,
}

/// The device's buffers for one step.
#[derive(Debug)]
pub(super) struct Workspace {
    pub capacity: Capacity,
    /// i32 [tokens]: token ids.
    pub ids: DeviceBuffer,
    /// i32 [tokens]: positions.
    pub positions: DeviceBuffer,
    /// i32 [tokens]: cache slots to write (-1: none).
    pub slots: DeviceBuffer,
    /// i32 [tokens]: context length each token attends over.
    pub context: DeviceBuffer,
    /// i32 [tokens]: each token's row of `block_tables`.
    pub seq_of: DeviceBuffer,
    /// i32 [seqs]: the token rows whose logits are wanted.
    pub rows: DeviceBuffer,
    /// i32 [seqs × stride]: block tables, rows as wide as the step's longest.
    pub block_tables: DeviceBuffer,
    /// i32 [1]: the stride of `block_tables` this step.
    pub table_stride: DeviceBuffer,
    /// f32 [tokens × hidden]: the residual stream.
    pub resid: DeviceBuffer,
    /// f32 [tokens × hidden]: the output of the last product to add to it.
    pub add: DeviceBuffer,
    /// bf16 [tokens × hidden]: normalised input of the next product.
    pub normed: DeviceBuffer,
    /// f32 [tokens × (q + 2 kv) × head_dim].
    pub qkv: DeviceBuffer,
    /// f32 [tokens × q heads × head_dim]: rotated queries.
    pub q: DeviceBuffer,
    /// bf16 [tokens × q heads × head_dim]: attention output.
    pub attn: DeviceBuffer,
    /// f32 [tokens × 2 × intermediate].
    pub gate_up: DeviceBuffer,
    /// bf16 [tokens × intermediate].
    pub act: DeviceBuffer,
    /// f32 [PARTIAL_ROWS] ×2 and [PARTIAL_ROWS × head_dim]: split attention partials.
    pub part_max: DeviceBuffer,
    pub part_sum: DeviceBuffer,
    pub part_acc: DeviceBuffer,
    /// f32 [seqs × vocab].
    pub logits: DeviceBuffer,
    /// The longest context dense attention gathers (0: the model's heads do not allow it).
    pub dense_context: usize,
    /// bf16 [kv heads × dense_context × head_dim] ×2: a dense chunk's gathered K and V.
    pub dense_k: DeviceBuffer,
    pub dense_v: DeviceBuffer,
    /// bf16 [q heads × DENSE_ROWS × head_dim]: a tile's packed queries.
    pub dense_q: DeviceBuffer,
    /// f32 and bf16 [scores]: a tile's scores and probabilities.
    pub scores: DeviceBuffer,
    pub probs: DeviceBuffer,
}

impl Workspace {
    /// Allocates every buffer for `capacity` with a cache of `block_size`-token blocks.
    pub(super) fn new(
        spec: &ModelSpec,
        capacity: Capacity,
        block_size: usize,
    ) -> Result<Self, DeviceError> {
        let t = capacity.tokens.max(1);
        let s = capacity.seqs.max(1);
        let d = spec.hidden_size;
        let hd = spec.head_dim;
        let qkv = (spec.num_heads + 2 * spec.num_kv_heads) * hd;
        let f = spec.intermediate_size;
        let i32s = |n: usize, what: &str| DeviceBuffer::alloc(n * 4, what);
        let f32s = |n: usize, what: &str| DeviceBuffer::alloc(n * 4, what);
        let bf16s = |n: usize, what: &str| DeviceBuffer::alloc(n * 2, what);
        let dense_context = if hd.is_multiple_of(8) {
            (capacity.blocks_per_seq * block_size).min(DENSE_MAX_CONTEXT)
        } else {
            0
        };
        let gathered = spec.num_kv_heads * dense_context * hd;
        let scores = SCORE_ELEMENTS.min(spec.num_kv_heads * dense_context * DENSE_ROWS);
        Ok(Self {
            capacity,
            ids: i32s(t, "token ids")?,
            positions: i32s(t, "positions")?,
            slots: i32s(t, "cache slots")?,
            context: i32s(t, "context lengths")?,
            seq_of: i32s(t, "token rows")?,
            rows: i32s(s, "logits rows")?,
            block_tables: i32s(s * capacity.blocks_per_seq.max(1), "block tables")?,
            table_stride: i32s(1, "the block table stride")?,
            resid: f32s(t * d, "the residual stream")?,
            add: f32s(t * d, "product outputs")?,
            normed: bf16s(t * d, "normalised activations")?,
            qkv: f32s(t * qkv, "q/k/v")?,
            q: f32s(t * spec.num_heads * hd, "queries")?,
            attn: bf16s(t * spec.num_heads * hd, "attention output")?,
            gate_up: f32s(t * 2 * f, "gate/up")?,
            act: bf16s(t * f, "MLP activations")?,
            part_max: f32s(PARTIAL_ROWS, "attention partials")?,
            part_sum: f32s(PARTIAL_ROWS, "attention partials")?,
            part_acc: f32s(PARTIAL_ROWS * hd, "attention partials")?,
            logits: f32s(s * spec.vocab_size, "logits")?,
            dense_context,
            dense_k: bf16s(gathered, "gathered keys")?,
            dense_v: bf16s(gathered, "gathered values")?,
            dense_q: bf16s(spec.num_heads * DENSE_ROWS.min(t) * hd, "packed queries")?,
            scores: f32s(scores, "attention scores")?,
            probs: bf16s(scores, "attention probabilities")?,
        })
    }

    /// Bytes the workspace holds on the GPU.
    pub(super) fn bytes(&self) -> usize {
        [
            &self.ids,
            &self.positions,
            &self.slots,
            &self.context,
            &self.seq_of,
            &self.rows,
            &self.block_tables,
            &self.table_stride,
            &self.resid,
            &self.add,
            &self.normed,
            &self.qkv,
            &self.q,
            &self.attn,
            &self.gate_up,
            &self.act,
            &self.part_max,
            &self.part_sum,
            &self.part_acc,
            &self.logits,
            &self.dense_k,
            &self.dense_v,
            &self.dense_q,
            &self.scores,
            &self.probs,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum()
    }
}

/// How many spans a step splits each token's attention into (the kernel cuts each token's
/// own context evenly): enough that the grid fills the GPU and, where the partials allow, that
/// no span of the longest context passes [`PARTITION`]; never spans under [`MIN_SPAN`].
pub(super) fn attention_splits(tokens: usize, heads: usize, context: usize) -> usize {
    let blocks = (tokens * heads).max(1);
    let by_grid = TARGET_BLOCKS.div_ceil(blocks);
    let by_length = context.div_ceil(PARTITION);
    fit(blocks, context, by_grid.max(by_length))
}

/// The split count a decode graph of `bucket` sequences is captured with, for any context up
/// to `window`: enough to fill the GPU, since the spans shrink with short contexts.
pub(super) fn graph_splits(bucket: usize, heads: usize, window: usize) -> usize {
    let blocks = (bucket * heads).max(1);
    fit(blocks, window, TARGET_BLOCKS.div_ceil(blocks))
}

fn fit(blocks: usize, context: usize, wanted: usize) -> usize {
    wanted
        .min(context.div_ceil(MIN_SPAN))
        .min(PARTIAL_ROWS / blocks)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_and_fit_the_partials() {
        for (tokens, heads, context) in [
            (1, 32, 131_072),
            (256, 32, 8192),
            (4096, 32, 4096),
            (8192, 64, 8192),
            (7, 3, 1),
        ] {
            for splits in [
                attention_splits(tokens, heads, context),
                graph_splits(tokens, heads, context),
            ] {
                assert!(splits >= 1);
                assert!(splits == 1 || tokens * heads * splits <= PARTIAL_ROWS);
                assert!(splits == 1 || context.div_ceil(splits) >= MIN_SPAN);
            }
        }
        assert_eq!(attention_splits(1, 32, 131_072), 256);
        assert_eq!(attention_splits(1, 32, 256), 4);
        assert_eq!(attention_splits(4096, 32, 4096), 2);
        assert_eq!(graph_splits(1, 32, 131_072), 32);
        assert_eq!(graph_splits(256, 32, 131_072), 1);
        assert_eq!(graph_splits(1, 32, 512), 8);
    }
}
