//! The paged KV cache in host memory: per layer, keys and values laid out as
//! `[block][slot][kv_head][head_dim]`, held as f32 (for results that are the f32 reference's
//! to rounding) or as IEEE halves (half the memory, as llama.cpp keeps its cache; the kernels
//! widen sixteen at a time with F16C).

use half::f16;
use half::vec::HalfBitsVecExt;

use super::simd::Simd;

/// What one cached value is stored as.
pub(super) trait KvValue: Copy + Send + Sync + 'static {
    /// `len` zeros, from pages the allocator maps lazily (so unused blocks cost no memory).
    fn zeroed(len: usize) -> Vec<Self>;
    /// Sixteen values as floats.
    fn load16<S: Simd>(s: S, v: &[Self; 16]) -> S::V;
    /// The value as a float.
    fn get(self) -> f32;
    /// A float as a stored value.
    fn put(v: f32) -> Self;
}

impl KvValue for f32 {
    fn zeroed(len: usize) -> Vec<f32> {
        vec![0.0; len]
    }
    #[inline(always)]
    fn load16<S: Simd>(s: S, v: &[f32; 16]) -> S::V {
        s.load(v)
    }

    #[inline(always)]
    fn get(self) -> f32 {
        self
    }

    #[inline(always)]
    fn put(v: f32) -> Self {
        v
    }
}

impl KvValue for f16 {
    fn zeroed(len: usize) -> Vec<f16> {
        // Zeroed `u16`s come from calloc; `vec![f16::ZERO; len]` would write every page.
        vec![0u16; len].reinterpret_into()
    }
    #[inline(always)]
    fn load16<S: Simd>(s: S, v: &[f16; 16]) -> S::V {
        // SAFETY: `f16` is `repr(transparent)` over its `u16` bits, so the arrays have one
        // layout.
        s.f16(unsafe { &*v.as_ptr().cast::<[u16; 16]>() })
    }

    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }

    #[inline(always)]
    fn put(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// One layer's cache, read-only.
#[derive(Clone, Copy)]
pub(super) struct Cache<'a, T> {
    /// Keys, `token_width` per cache slot.
    pub keys: &'a [T],
    /// Values, laid out like the keys.
    pub values: &'a [T],
}

/// One layer's cache in whichever precision the store holds.
pub(super) enum LayerCache<'a> {
    F32(Cache<'a, f32>),
    F16(Cache<'a, f16>),
}

/// Every layer's keys and values in one precision.
#[derive(Debug)]
struct Buffers<T> {
    keys: Vec<Vec<T>>,
    values: Vec<Vec<T>>,
}

impl<T: KvValue> Buffers<T> {
    fn new(layers: usize, len: usize) -> Self {
        Self {
            keys: (0..layers).map(|_| T::zeroed(len)).collect(),
            values: (0..layers).map(|_| T::zeroed(len)).collect(),
        }
    }

    fn write(&mut self, layer: usize, at: usize, key: &[f32], value: &[f32]) {
        let (keys, values) = (&mut self.keys[layer], &mut self.values[layer]);
        for (dst, &v) in keys[at..at + key.len()].iter_mut().zip(key) {
            *dst = T::put(v);
        }
        for (dst, &v) in values[at..at + value.len()].iter_mut().zip(value) {
            *dst = T::put(v);
        }
    }

    fn layer(&self, layer: usize) -> Cache<'_, T> {
        Cache {
            keys: &self.keys[layer],
            values: &self.values[layer],
        }
    }

    fn copy(&mut self, src: std::ops::Range<usize>, dst: usize) {
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.copy_within(src.clone(), dst);
        }
    }
}

#[derive(Debug)]
enum Layers {
    F32(Buffers<f32>),
    F16(Buffers<f16>),
}

/// Keys and values of every block, every layer.
#[derive(Debug)]
pub(super) struct KvStore {
    /// Tokens per block.
    pub block_size: usize,
    /// Values per token per layer (kv_heads × head_dim).
    pub token_width: usize,
    num_blocks: usize,
    layers: Layers,
}

impl KvStore {
    /// Zeroed storage, in halves when `halves` (the allocator maps pages lazily, so unused
    /// blocks cost no memory).
    pub(super) fn new(
        layers: usize,
        num_blocks: usize,
        block_size: usize,
        token_width: usize,
        halves: bool,
    ) -> Self {
        let len = num_blocks * block_size * token_width;
        Self {
            block_size,
            token_width,
            num_blocks,
            layers: if halves {
                Layers::F16(Buffers::new(layers, len))
            } else {
                Layers::F32(Buffers::new(layers, len))
            },
        }
    }

    /// Blocks held.
    pub(super) fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Whether values are held as halves.
    pub(super) fn halves(&self) -> bool {
        matches!(self.layers, Layers::F16(_))
    }

    /// Index of `position`'s first value in a layer's buffer, through the block table.
    pub(super) fn offset(&self, table: &[u32], position: usize) -> Option<usize> {
        let block = *table.get(position / self.block_size)? as usize;
        (block < self.num_blocks)
            .then(|| (block * self.block_size + position % self.block_size) * self.token_width)
    }

    /// Stores one token's key and value rows of `layer` at `offset`.
    pub(super) fn write(&mut self, layer: usize, offset: usize, key: &[f32], value: &[f32]) {
        match &mut self.layers {
            Layers::F32(b) => b.write(layer, offset, key, value),
            Layers::F16(b) => b.write(layer, offset, key, value),
        }
    }

    /// A layer's keys and values.
    pub(super) fn layer(&self, layer: usize) -> LayerCache<'_> {
        match &self.layers {
            Layers::F32(b) => LayerCache::F32(b.layer(layer)),
            Layers::F16(b) => LayerCache::F16(b.layer(layer)),
        }
    }

    /// Copies one block's contents to another in every layer.
    pub(super) fn copy_block(&mut self, src: usize, dst: usize) {
        let n = self.block_size * self.token_width;
        if src >= self.num_blocks || dst >= self.num_blocks || src == dst {
            return;
        }
        match &mut self.layers {
            Layers::F32(b) => b.copy(src * n..(src + 1) * n, dst * n),
            Layers::F16(b) => b.copy(src * n..(src + 1) * n, dst * n),
        }
    }
}
