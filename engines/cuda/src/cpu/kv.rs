//! The paged KV cache in host memory: per layer, keys and values laid out as
//! `[block][slot][kv_head][head_dim]`.

/// Keys and values of every block, every layer.
#[derive(Debug)]
pub struct KvStore {
    /// Tokens per block.
    pub block_size: usize,
    /// Floats per token per layer (kv_heads × head_dim).
    pub token_width: usize,
    num_blocks: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvStore {
    /// Zeroed storage (the allocator maps pages lazily, so unused blocks cost no memory).
    pub fn new(layers: usize, num_blocks: usize, block_size: usize, token_width: usize) -> Self {
        let len = num_blocks * block_size * token_width;
        Self {
            block_size,
            token_width,
            num_blocks,
            keys: (0..layers).map(|_| vec![0.0; len]).collect(),
            values: (0..layers).map(|_| vec![0.0; len]).collect(),
        }
    }

    /// Blocks held.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Index of `position`'s first float in a layer's buffer, through the block table.
    pub fn offset(&self, table: &[u32], position: usize) -> Option<usize> {
        let block = *table.get(position / self.block_size)? as usize;
        (block < self.num_blocks)
            .then(|| (block * self.block_size + position % self.block_size) * self.token_width)
    }

    /// A layer's keys and values.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer], &self.values[layer])
    }

    /// A layer's keys and values, writable.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.keys[layer], &mut self.values[layer])
    }

    /// Copies one block's contents to another in every layer.
    pub fn copy_block(&mut self, src: usize, dst: usize) {
        let n = self.block_size * self.token_width;
        if src >= self.num_blocks || dst >= self.num_blocks || src == dst {
            return;
        }
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.copy_within(src * n..(src + 1) * n, dst * n);
        }
    }
}
