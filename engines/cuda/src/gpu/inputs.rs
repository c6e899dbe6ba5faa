//! What a step runs on besides the weights: the paged KV cache on the GPU, and the step's
//! inputs as the host lays them out and uploads them into the workspace.

use super::memory::DeviceBuffer;
use super::workspace::Workspace;
use crate::device::{Chunk, DeviceError};
use crate::model::ModelSpec;
use cudarc::driver::sys::CUstream;

/// The paged KV cache: per layer, K and V as bf16 [blocks, block_size, kv_heads, head_dim].
#[derive(Debug)]
pub(super) struct KvCache {
    pub k: Vec<DeviceBuffer>,
    pub v: Vec<DeviceBuffer>,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Bytes of one block in one layer's K (or V).
    pub block_bytes: usize,
}

impl KvCache {
    /// Allocates `num_blocks` blocks for every layer.
    pub(super) fn new(
        spec: &ModelSpec,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, DeviceError> {
        let block_bytes = block_size * spec.num_kv_heads * spec.head_dim * 2;
        let mut k = Vec::with_capacity(spec.num_layers);
        let mut v = Vec::with_capacity(spec.num_layers);
        for _ in 0..spec.num_layers {
            k.push(DeviceBuffer::alloc(
                num_blocks * block_bytes,
                "the KV cache",
            )?);
            v.push(DeviceBuffer::alloc(
                num_blocks * block_bytes,
                "the KV cache",
            )?);
        }
        Ok(Self {
            k,
            v,
            num_blocks,
            block_size,
            block_bytes,
        })
    }

    /// Bytes per block over every layer, K and V.
    pub(super) fn bytes_per_block(spec: &ModelSpec, block_size: usize) -> usize {
        2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * 2
    }
}

/// A step's inputs as the host lays them out (i32, as the kernels read them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct StepInputs {
    pub ids: Vec<i32>,
    pub positions: Vec<i32>,
    pub slots: Vec<i32>,
    pub context: Vec<i32>,
    pub seq_of: Vec<i32>,
    /// Token rows whose logits are wanted, in chunk order.
    pub rows: Vec<i32>,
    /// One row of `stride` block ids per chunk.
    pub tables: Vec<i32>,
    /// The widest chunk's block count (at least 1).
    pub stride: usize,
    /// The longest context of the step.
    pub max_context: usize,
}

impl StepInputs {
    /// Lays out `chunks` for a cache of `num_blocks` blocks of `block_size`, with table rows of
    /// `blocks_per_seq`. Checks every position has a block.
    pub(super) fn layout(
        chunks: &[Chunk<'_>],
        block_size: usize,
        num_blocks: usize,
        blocks_per_seq: usize,
    ) -> Result<Self, DeviceError> {
        let mut s = Self {
            stride: chunks
                .iter()
                .map(|c| c.block_table.len())
                .max()
                .unwrap_or(0)
                .max(1),
            ..Self::default()
        };
        for (row, chunk) in chunks.iter().enumerate() {
            let end = chunk.start + chunk.tokens.len();
            if chunk.block_table.len() > blocks_per_seq
                || end.div_ceil(block_size) > chunk.block_table.len()
            {
                return Err(DeviceError::InvalidBatch(format!(
                    "a chunk ending at {end} has {} blocks of {block_size} (at most {blocks_per_seq})",
                    chunk.block_table.len()
                )));
            }
            if let Some(&bad) = chunk
                .block_table
                .iter()
                .find(|&&b| b as usize >= num_blocks)
            {
                return Err(DeviceError::InvalidBatch(format!(
                    "block {bad} is outside the cache of {num_blocks}"
                )));
            }
            for (i, &token) in chunk.tokens.iter().enumerate() {
                let position = chunk.start + i;
                let block = chunk.block_table[position / block_size] as usize;
                s.ids.push(token as i32);
                s.positions.push(position as i32);
                s.slots
                    .push((block * block_size + position % block_size) as i32);
                s.context.push(position as i32 + 1);
                s.seq_of.push(row as i32);
            }
            let last = s.ids.len() as i32;
            s.rows.extend(last - chunk.logits_rows() as i32..last);
            let mut table: Vec<i32> = chunk.block_table.iter().map(|&b| b as i32).collect();
            table.resize(s.stride, 0);
            s.tables.extend(table);
            s.max_context = s.max_context.max(end);
        }
        Ok(s)
    }

    /// Pads a decode step to `bucket` tokens: padding tokens write no KV, attend to one
    /// position of block 0 and have their own logits row (ignored by sampling).
    pub(super) fn pad_to(&mut self, bucket: usize) {
        while self.ids.len() < bucket {
            let row = self.ids.len() as i32;
            let table_row = (self.tables.len() / self.stride.max(1)) as i32;
            self.ids.push(0);
            self.positions.push(0);
            self.slots.push(-1);
            self.context.push(1);
            self.seq_of.push(table_row);
            self.rows.push(row);
            self.tables.extend(std::iter::repeat_n(0, self.stride));
        }
    }

    /// Copies the inputs into the workspace on `stream`.
    pub(super) fn upload(&self, ws: &Workspace, stream: CUstream) -> Result<(), DeviceError> {
        let c = ws.capacity;
        if self.ids.len() > c.tokens
            || self.rows.len() > c.seqs
            || self.tables.len() > c.seqs * c.blocks_per_seq
        {
            return Err(DeviceError::InvalidBatch(format!(
                "a step of {} tokens and {} rows exceeds the device's {} tokens and {} sequences",
                self.ids.len(),
                self.rows.len(),
                c.tokens,
                c.seqs
            )));
        }
        ws.ids.write(&self.ids, stream)?;
        ws.positions.write(&self.positions, stream)?;
        ws.slots.write(&self.slots, stream)?;
        ws.context.write(&self.context, stream)?;
        ws.seq_of.write(&self.seq_of, stream)?;
        ws.rows.write(&self.rows, stream)?;
        ws.table_stride.write(&[self.stride as i32], stream)?;
        ws.block_tables.write(&self.tables, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_resolve_slots_contexts_rows_and_padding() {
        let prefill = [7u32, 8, 9];
        let decode = [4u32];
        let tables = [vec![5u32, 2], vec![3u32, 0, 6]];
        let chunks = [
            // Positions 2..5 of a sequence whose first two tokens are cached.
            Chunk {
                tokens: &prefill,
                start: 2,
                block_table: &tables[0],
                logits: true,
                generated: false,
                drafts: 0,
            },
            Chunk {
                tokens: &decode,
                start: 9,
                block_table: &tables[1],
                logits: true,
                generated: false,
                drafts: 0,
            },
        ];
        let mut s = StepInputs::layout(&chunks, 4, 8, 4).unwrap_or_default();
        assert_eq!(s.ids, vec![7, 8, 9, 4]);
        assert_eq!(s.positions, vec![2, 3, 4, 9]);
        // Position 4 of the first sequence is slot 0 of block 2; position 9 of the second is
        // slot 1 of block 6.
        assert_eq!(s.slots, vec![22, 23, 8, 25]);
        assert_eq!(s.context, vec![3, 4, 5, 10]);
        assert_eq!(s.seq_of, vec![0, 0, 0, 1]);
        assert_eq!(s.rows, vec![2, 3]);
        assert_eq!(s.stride, 3);
        assert_eq!(s.tables, vec![5, 2, 0, 3, 0, 6]);
        assert_eq!(s.max_context, 10);
        s.pad_to(6);
        assert_eq!(s.slots[4..], [-1, -1]);
        assert_eq!(s.rows, vec![2, 3, 4, 5]);
        assert_eq!(s.seq_of[4..], [2, 3]);
        assert_eq!(s.tables.len(), 4 * 3);

        let short = [Chunk {
            tokens: &prefill,
            start: 6,
            block_table: &tables[0],
            logits: false,
            generated: false,
            drafts: 0,
        }];
        assert!(
            StepInputs::layout(&short, 4, 8, 4).is_err(),
            "position 8 has no block"
        );
        let outside = [Chunk {
            tokens: &decode,
            start: 0,
            block_table: &[9],
            logits: false,
            generated: false,
            drafts: 0,
        }];
        assert!(
            StepInputs::layout(&outside, 4, 8, 4).is_err(),
            "block 9 of 8"
        );
    }
}
