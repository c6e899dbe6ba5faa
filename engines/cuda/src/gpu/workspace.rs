//! Fixed buffers for a step: the inputs the host writes, the activations, the attention
//! partials and the logits. All are sized once at load for the largest step the scheduler can
//! plan, so their addresses never change (CUDA graphs rely on that) and GPU memory use is
//! known before the KV cache takes the rest.

use super::memory::DeviceBuffer;
use crate::device::DeviceError;
use crate::model::ModelSpec;

/// The attention partial rows (token × head × split) the workspace holds; bounds the splits
/// of long-context steps.
pub const PARTIAL_ROWS: usize = 1 << 18;
/// Positions one attention split covers at least.
pub const PARTITION: usize = 512;

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
pub struct Workspace {
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
}

impl Workspace {
    /// Allocates every buffer for `capacity`.
    pub fn new(spec: &ModelSpec, capacity: Capacity) -> Result<Self, DeviceError> {
        let t = capacity.tokens.max(1);
        let s = capacity.seqs.max(1);
        let d = spec.hidden_size;
        let hd = spec.head_dim;
        let qkv = (spec.num_heads + 2 * spec.num_kv_heads) * hd;
        let f = spec.intermediate_size;
        let i32s = |n: usize, what: &str| DeviceBuffer::alloc(n * 4, what);
        let f32s = |n: usize, what: &str| DeviceBuffer::alloc(n * 4, what);
        let bf16s = |n: usize, what: &str| DeviceBuffer::alloc(n * 2, what);
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
        })
    }

    /// Bytes the workspace holds on the GPU.
    pub fn bytes(&self) -> usize {
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
        ]
        .iter()
        .map(|b| b.bytes())
        .sum()
    }
}

/// How a step splits attention: `(splits, partition)` so that `splits × partition` covers
/// `max_context` and `tokens × heads × splits` fits the partial buffers.
pub fn attention_splits(tokens: usize, heads: usize, max_context: usize) -> (usize, usize) {
    let wanted = max_context.div_ceil(PARTITION).max(1);
    let room = (PARTIAL_ROWS / (tokens.max(1) * heads.max(1))).max(1);
    let splits = wanted.min(room);
    (splits, max_context.div_ceil(splits).max(1))
}

/// The split count a decode graph of `bucket` sequences is captured with: enough to cover a
/// long context with a few waves of blocks, never more than the partials hold; the partition
/// then covers the whole window.
pub fn graph_splits(bucket: usize, heads: usize, window: usize) -> (usize, usize) {
    let (most, _) = attention_splits(bucket, heads, window);
    let splits = most.min((1024 / (bucket.max(1) * heads.max(1))).max(1));
    (splits, window.div_ceil(splits).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_context_and_fit_the_partials() {
        for (tokens, heads, context) in [
            (1, 32, 131_072),
            (256, 32, 8192),
            (4096, 32, 4096),
            (7, 3, 1),
        ] {
            let (splits, partition) = attention_splits(tokens, heads, context);
            assert!(splits * partition >= context);
            assert!(splits == 1 || tokens * heads * splits <= PARTIAL_ROWS);
        }
        assert_eq!(attention_splits(1, 32, 131_072), (256, 512));
        assert_eq!(attention_splits(4096, 32, 4096).0, 2);
        assert_eq!(graph_splits(1, 32, 131_072), (32, 4096));
        assert_eq!(graph_splits(256, 32, 131_072), (1, 131_072));
        assert_eq!(graph_splits(1, 32, 512), (1, 512));
    }
}
