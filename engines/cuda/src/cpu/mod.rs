//! The CPU device: the whole model on every core, each weight matrix in the precision it was
//! shipped in (GGUF quantized types stay quantized) and every activation in f32, except the
//! inputs of products with 4- and 8-bit weights (prompts and decoding steps alike), which are
//! rounded to bytes, and the KV cache, held in halves, unless [`Activations::Exact`] is asked
//! for; the reference for correctness and the fallback where no GPU is present. Matrix products
//! run the device's own kernels ([`matmul`], picked per instruction set at run time), parallel
//! work the device's own `rayon` pool (a plugin never touches the host's global pool).

mod attention;
pub mod encoder;
mod forward;
mod kv;
mod linalg;
mod matmul;
mod simd;

use crate::device::{Batch, Chunk, Device, DeviceError};
use crate::model::pooling::PoolingMode;
use crate::model::{
    LayeredWeights, ModelError, ModelFolder, ModelSpec, PackedReader, RotaryTables, Weights,
};

use forward::DeviceWeights;
use kv::KvStore;
pub use matmul::{Activations, FloatWeights};
use matmul::{Matrix, SecondPass};

/// A model loaded for the CPU with its KV cache.
#[derive(Debug)]
pub struct CpuDevice {
    spec: ModelSpec,
    weights: DeviceWeights,
    rotary: RotaryTables,
    kv: KvStore,
    pool: rayon::ThreadPool,
}

impl CpuDevice {
    /// Loads the folder's weights and allocates `num_blocks` blocks of `block_size` tokens.
    pub fn load(
        folder: &ModelFolder,
        num_blocks: u32,
        block_size: u32,
        threads: usize,
        inputs: Activations,
    ) -> Result<Self, ModelError> {
        let spec = folder.spec.clone();
        let opened = Weights::open(&folder.path)?;
        let mut weights =
            LayeredWeights::load_with(&spec, &opened, &PackedReader(&opened), |parts| {
                Ok(Matrix::stacked(parts))
            })?;
        drop(opened);
        // Under `Int8` every product with 4- and 8-bit layer weights rounds its inputs to
        // bytes, so the layers are held once, in the byte kernels' layout. Prompt rows of the
        // attention projections take a second pass: rounding them once puts its error into
        // the cached keys and values every later token reads, which alone moved SmolLM2's
        // greedy tokens off the f32 reference's (151 of 160 agreed; rounding the MLP's
        // prompt rows once moved none). The output projection rounds decoding steps once,
        // as llama.cpp does (156 of 160 agreed, every parting within 0.23 logits, against
        // 157 in two passes), and a prompt's last position in two: at 16 sequences a second
        // pass over a 128k-token vocabulary was a third of a step's arithmetic, where the
        // prompt's one row costs nothing beside the prompt. A head tied to the embedding
        // keeps its codes for the lookups.
        for layer in &mut weights.layers {
            for (matrix, rows) in [
                (&mut layer.qkv, SecondPass::Prompts),
                (&mut layer.o, SecondPass::Prompts),
                (&mut layer.gate_up, SecondPass::Never),
                (&mut layer.down, SecondPass::Never),
            ] {
                matrix.round_inputs(inputs);
                matrix.second_pass(rows);
                matrix.tiles_only();
            }
        }
        let head = weights.lm_head.as_mut().unwrap_or(&mut weights.embed);
        head.round_inputs(inputs);
        head.second_pass(SecondPass::Prompts);
        if let Some(head) = &mut weights.lm_head {
            head.tiles_only();
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("turnpike-cpu-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start CPU threads: {e}")))?;
        let kv = KvStore::new(
            spec.num_layers,
            num_blocks as usize,
            block_size as usize,
            spec.num_kv_heads * spec.head_dim,
            inputs == Activations::Int8,
        );
        Ok(Self {
            rotary: RotaryTables::new(&spec),
            spec,
            weights,
            kv,
            pool,
        })
    }
}

impl Device for CpuDevice {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn num_blocks(&self) -> u32 {
        self.kv.num_blocks() as u32
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let w = &self.weights;
        let layers: usize = w
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes())
            .sum();
        let head = w.lm_head.as_ref().map_or(0, Matrix::bytes);
        vec![("weight_bytes", (layers + head + w.embed.bytes()) as f64)]
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<Vec<f32>, DeviceError> {
        for &(src, dst) in batch.copies {
            self.kv.copy_block(src as usize, dst as usize);
        }
        if batch.chunks.is_empty() {
            return Ok(Vec::new());
        }
        let Self {
            spec,
            weights,
            rotary,
            kv,
            pool,
        } = self;
        pool.install(|| {
            let x = forward::hidden_states(spec, weights, rotary, kv, batch.chunks)?;
            let mut rows = Vec::new();
            let mut end = 0;
            for chunk in batch.chunks {
                end += chunk.tokens.len();
                rows.extend(end - chunk.logits_rows()..end);
            }
            // The leading decoding chunks' rows, as `forward::hidden_states` counts them (the
            // head rounds them once, see `load`).
            let steps = batch
                .chunks
                .iter()
                .take_while(|c| c.generated)
                .map(Chunk::logits_rows)
                .sum();
            forward::logits(spec, weights, &x, &rows, steps)
        })
    }

    fn embed(&mut self, tokens: &[u32], mode: PoolingMode) -> Result<Vec<f32>, DeviceError> {
        if tokens.is_empty() {
            return Err(DeviceError::InvalidBatch("no tokens to embed".into()));
        }
        let block = self.kv.block_size;
        let blocks = tokens.len().div_ceil(block);
        let mut scratch = KvStore::new(
            self.spec.num_layers,
            blocks,
            block,
            self.kv.token_width,
            self.kv.halves(),
        );
        let table: Vec<u32> = (0..blocks as u32).collect();
        let chunks = [Chunk {
            tokens,
            start: 0,
            block_table: &table,
            logits: false,
            generated: false,
            drafts: 0,
        }];
        let Self {
            spec,
            weights,
            rotary,
            pool,
            ..
        } = self;
        pool.install(|| {
            let x = forward::hidden_states(spec, weights, rotary, &mut scratch, &chunks)?;
            let d = spec.hidden_size;
            let mut normed = vec![0.0f32; x.len()];
            linalg::rms_norm(
                &x,
                forward::vector(&weights.norm)?,
                spec.rms_norm_eps,
                &mut normed,
            );
            Ok(crate::model::pooling::pool(&normed, d, mode))
        })
    }
}
