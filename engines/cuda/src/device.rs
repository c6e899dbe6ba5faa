//! The seam between the engine loop and the hardware: one step of the model over a batch of
//! chunks that read and write a paged KV cache.
//!
//! The scheduler decides what runs; a device only computes. Everything crossing this seam is
//! plain data (token ids, positions, block tables, copy lists, logits), so a device can be a
//! CPU reference or a GPU without the loop knowing which. A device knows nothing of the
//! scheduler either: [`crate::step`] turns a plan into a [`Batch`].

use crate::model::pooling::PoolingMode;
use crate::sampler::{Sampled, SamplingParams};

/// A contiguous run of one sequence's tokens to compute in a step.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// The tokens, at positions `start..start + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of the first token; positions below it already have KV in the cache.
    pub start: usize,
    /// The sequence's blocks, covering every position up to the end of this chunk.
    pub block_table: &'a [u32],
    /// Return the logits of this chunk's last token (and of the `drafts` before it).
    pub logits: bool,
    /// Every token was generated (a decoding step), none is a prompt's: a device may compute
    /// such chunks in lower precision and still give a prompt the same logits whether a
    /// prefix-cache hit recomputes only its end or not.
    pub generated: bool,
    /// The last `drafts` tokens are drafted (speculative decoding): with `logits`, the logits
    /// of the last `drafts + 1` tokens are returned, in order.
    pub drafts: usize,
}

impl Chunk<'_> {
    /// Logits rows this chunk asks for: 0, or its last `drafts + 1` tokens'.
    pub fn logits_rows(&self) -> usize {
        if self.logits && !self.tokens.is_empty() {
            (self.drafts + 1).min(self.tokens.len())
        } else {
            0
        }
    }
}

/// One step's work.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Block copies (`src`, `dst`) to make before computing (copy on write).
    pub copies: &'a [(u32, u32)],
    /// The chunks, in any order.
    pub chunks: &'a [Chunk<'a>],
}

/// One choice to sample on a device that samples (see [`DeviceSampler::sample`]).
#[derive(Debug, Clone, Copy)]
pub struct SampleRequest<'a> {
    /// Which logits row of the last `forward` (the chunks that asked for logits, in order).
    pub logits_row: usize,
    /// The choice's sampling settings.
    pub params: &'a SamplingParams,
    /// The uniform draw in `[0, 1)` for a non-greedy sample, from the choice's own RNG.
    pub uniform: f32,
    /// `(token, generated count)` pairs the penalties apply to.
    pub penalties: &'a [(u32, u32)],
    /// Tokens that cannot be chosen (end of sequence below `min_tokens`).
    pub banned: &'a [u32],
    /// For a choice under a grammar, the ids it allows: bit `id % 32` of word `id / 32`, at
    /// least one word per 32 logits (see `turnpike_grammar::Allowed`).
    pub allowed: Option<&'a [u32]>,
}

/// Why a device could not run.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The device is not present or cannot start.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// The batch is inconsistent with the model or the cache (an engine bug).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
}

/// A device that runs one model on a paged KV cache it owns.
pub trait Device: Send {
    /// `cpu` or `cuda`, for logs and stats.
    fn name(&self) -> &'static str;
    /// Blocks in the device's KV cache.
    fn num_blocks(&self) -> u32;
    /// Runs one step: the copies, then every chunk. Returns the logits of the chunks that ask
    /// for them, in chunk order, `vocab_size` each.
    fn forward(&mut self, batch: &Batch<'_>) -> Result<Vec<f32>, DeviceError>;
    /// The last hidden states (after the final norm) of `tokens`, pooled as `mode` says,
    /// computed outside the shared cache.
    fn embed(&mut self, tokens: &[u32], mode: PoolingMode) -> Result<Vec<f32>, DeviceError>;
    /// [`Device::embed`] of several inputs (a device that batches them overrides this).
    fn embed_batch(
        &mut self,
        inputs: &[Vec<u32>],
        mode: PoolingMode,
    ) -> Result<Vec<Vec<f32>>, DeviceError> {
        inputs
            .iter()
            .map(|tokens| self.embed(tokens, mode))
            .collect()
    }
    /// Numeric statistics of the device (memory, graph use, step times) for `stats`.
    fn stats(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
    /// The device's own sampler, for a device that samples where its logits are: its
    /// `forward` then keeps the logits and returns none, and the engine samples the step's
    /// choices through this. `None` (the default): `forward` returns the logits and the engine
    /// samples them on the host.
    fn sampler(&mut self) -> Option<&mut dyn DeviceSampler> {
        None
    }
}

/// Sampling where the logits are, for a device whose `forward` keeps them (see
/// [`Device::sampler`]). Both calls read the logits of the device's last `forward`.
pub trait DeviceSampler {
    /// The first `rows` logits rows, copied out: for what the host must rank itself (beams,
    /// drafts checked position by position) and for tests and the reference tool.
    fn read_logits(&mut self, rows: usize) -> Result<Vec<f32>, DeviceError>;
    /// Samples choices, one result per request, in order.
    fn sample(&mut self, rows: &[SampleRequest<'_>]) -> Result<Vec<Sampled>, DeviceError>;
}
