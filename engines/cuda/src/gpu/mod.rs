//! The CUDA device: the same model as the CPU device, in bf16 on an NVIDIA GPU.
//!
//! # Design
//!
//! - **Libraries at run time.** `cudarc` loads the driver, NVRTC and cuBLAS with `dlopen`;
//!   [`probe`] checks each before the first call, so a machine without a GPU builds, tests
//!   and serves on the CPU.
//! - **Kernels in CUDA C** (`engines/cuda/kernels/`), compiled by NVRTC for the GPU's
//!   architecture at first use and cached on disk ([`kernels`]).
//! - **Products in cuBLAS**, bf16 operands with f32 accumulation; every weight is rounded to
//!   bf16 when it is uploaded, whatever its file dtype. The residual stream stays f32.
//! - **Fixed buffers** ([`workspace`]) sized at load for the largest step, so decode steps can
//!   be captured once per batch-size bucket and replayed ([`graphs`]).
//! - **Sampling on the GPU** ([`sampling`]): only token ids and requested log-probabilities
//!   come back; the uniform draws come from each choice's own host RNG, so a seed advances the
//!   same way on either device.
//! - **Memory.** Weights, then the workspace, then the KV cache from what is left: a fraction
//!   of free memory, or a byte budget. Too little memory is an error at load that says so.

mod blas;
mod dense_attention;
mod forward;
mod graphs;
mod inputs;
pub mod kernels;
mod launch;
mod memory;
mod nvml;
pub mod probe;
mod profile;
mod sampling;
mod workspace;

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::result as driver;
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaStream};

use crate::device::{Batch, Chunk, Device, DeviceError, DeviceSampler, SampleRequest};
use crate::model::pooling::PoolingMode;
use crate::model::{F32Reader, LayeredWeights, ModelFolder, ModelSpec, RotaryTables, Weights};
use crate::sampler::Sampled;
use blas::Blas;
use dense_attention::AttentionPlan;
use forward::Model;
use graphs::{Graphs, bucket_for};
use inputs::{KvCache, StepInputs};
use launch::Kernels;
use memory::{DeviceBuffer, to_bf16};
pub use profile::ProfileLine;
use sampling::Sampler;
pub use workspace::Capacity;
use workspace::{Workspace, graph_splits};

/// The largest head the attention kernel holds (`ATTN_MAX_PER_LANE` × 32).
const MAX_HEAD_DIM: usize = 256;

/// How much GPU memory the KV cache may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuKvBudget {
    /// This fraction of the memory free after weights and buffers.
    Fraction(f64),
    /// This many bytes.
    Bytes(u64),
}

/// What loading needs besides the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSettings {
    /// Which GPU.
    pub ordinal: usize,
    /// The largest step.
    pub capacity: Capacity,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The KV cache's share.
    pub kv_budget: GpuKvBudget,
    /// Capture decode steps into CUDA graphs.
    pub graphs: bool,
}

/// Bytes of one KV block over every layer, K and V, in bf16.
pub fn kv_bytes_per_block(spec: &ModelSpec, block_size: usize) -> usize {
    KvCache::bytes_per_block(spec, block_size)
}

/// Waits for everything queued on `stream`.
fn sync(stream: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the device's live stream.
    unsafe { driver::stream::synchronize(stream) }
        .map_err(|e| DeviceError::Unavailable(format!("the GPU failed: {e}")))
}

/// A model loaded on a GPU with its KV cache.
pub struct CudaDevice {
    // Field order is drop order: everything on the GPU goes before the stream and context.
    graphs: Graphs,
    sampler: Sampler,
    workspace: Workspace,
    kv: KvCache,
    weights: LayeredWeights<DeviceBuffer>,
    inv_freq: DeviceBuffer,
    /// The sliding layers' own rotary frequencies (Gemma 3).
    local_inv_freq: Option<DeviceBuffer>,
    /// Scale of the global layers' cosines and sines (LongRoPE).
    rope_scale: f32,
    blas: Blas,
    kernels: Kernels,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    spec: ModelSpec,
    use_graphs: bool,
    name: String,
    weight_bytes: usize,
    /// GPU memory (free, total) once the KV cache was allocated.
    memory: (usize, usize),
    /// NVML on this GPU, for its utilisation, when the driver ships it.
    nvml: Option<nvml::Nvml>,
    steps: u64,
    step_seconds: f64,
    step_started: Option<Instant>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("gpu", &self.name)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Loads `folder` onto GPU `settings.ordinal`, then sizes the KV cache from what is left.
    pub fn load(folder: &ModelFolder, settings: GpuSettings) -> Result<Self, DeviceError> {
        probe::probe().map_err(DeviceError::Unavailable)?;
        let head_dim = folder.spec.head_dim;
        if head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(2) {
            return Err(DeviceError::Unavailable(format!(
                "head_dim {head_dim} is not supported on the GPU (even, at most {MAX_HEAD_DIM})"
            )));
        }
        let ctx = CudaContext::new(settings.ordinal).map_err(|e| {
            DeviceError::Unavailable(format!("cannot open GPU {}: {e}", settings.ordinal))
        })?;
        // SAFETY: the device uses one stream and orders everything on it; cudarc's event
        // tracking (for several streams) would also record events inside graph captures.
        unsafe { ctx.disable_event_tracking() };
        ctx.bind_to_thread().map_err(|e| {
            DeviceError::Unavailable(format!("cannot use GPU {}: {e}", settings.ordinal))
        })?;
        let stream = ctx
            .new_stream()
            .map_err(|e| DeviceError::Unavailable(format!("cannot create a CUDA stream: {e}")))?;
        let name = ctx.name().unwrap_or_else(|_| "an NVIDIA GPU".into());
        let spec = folder.spec.clone();
        let kernels = Kernels::load(&ctx)?;
        let blas = Blas::new(stream.cu_stream())?;
        let file =
            Weights::open(&folder.path).map_err(|e| DeviceError::Unavailable(e.to_string()))?;
        let weights = LayeredWeights::load_with(&spec, &file, &F32Reader(&file), |values| {
            DeviceBuffer::from_host(&to_bf16(&values), "weights")
                .map_err(|e| crate::model::ModelError::Config(e.to_string()))
        })
        .map_err(|e| DeviceError::Unavailable(e.to_string()))?;
        let weight_bytes = weight_bytes(&weights);
        let rotary = RotaryTables::new(&spec);
        let inv_freq = DeviceBuffer::from_host(&rotary.global, "rotary frequencies")?;
        let local_inv_freq = rotary
            .local
            .as_deref()
            .map(|local| DeviceBuffer::from_host(local, "rotary frequencies"))
            .transpose()?;
        let workspace = Workspace::new(&spec, settings.capacity, settings.block_size)?;
        let sampler = Sampler::new(settings.capacity.seqs, spec.vocab_size)?;
        let (free, _) = driver::mem_get_info()
            .map_err(|e| DeviceError::Unavailable(format!("cannot read GPU memory: {e}")))?;
        let per_block = KvCache::bytes_per_block(&spec, settings.block_size);
        let budget = match settings.kv_budget {
            GpuKvBudget::Fraction(f) => (free as f64 * f) as usize,
            GpuKvBudget::Bytes(b) if b as usize > free => {
                return Err(DeviceError::Unavailable(format!(
                    "kv_cache_bytes {b} exceeds the {free} bytes free on the GPU after {weight_bytes} bytes of weights"
                )));
            }
            GpuKvBudget::Bytes(b) => b as usize,
        };
        let num_blocks = budget / per_block.max(1);
        if num_blocks == 0 {
            return Err(DeviceError::Unavailable(format!(
                "no GPU memory is left for the KV cache: {free} bytes free after {weight_bytes} bytes of weights and {} of buffers",
                workspace.bytes() + sampler.bytes()
            )));
        }
        let kv = KvCache::new(&spec, num_blocks, settings.block_size)?;
        let memory = driver::mem_get_info().unwrap_or((0, 0));
        // Without NVML (no driver library, a GPU it cannot see) there is no utilisation figure.
        let nvml = nvml::Nvml::open(settings.ordinal).ok();
        Ok(Self {
            memory,
            nvml,
            graphs: Graphs::default(),
            sampler,
            workspace,
            kv,
            weights,
            inv_freq,
            local_inv_freq,
            rope_scale: rotary.global_scale,
            blas,
            kernels,
            stream,
            ctx,
            spec,
            use_graphs: settings.graphs,
            name,
            weight_bytes,
            steps: 0,
            step_seconds: 0.0,
            step_started: None,
        })
    }

    /// Compiler warnings met while compiling the kernels (for the log).
    pub fn kernel_warnings(&self) -> &[String] {
        &self.kernels.warnings
    }

    /// The GPU's name.
    pub fn gpu_name(&self) -> &str {
        &self.name
    }

    /// Which attention path each token of an eager step over `chunks` takes.
    fn plan(&self, chunks: &[Chunk<'_>]) -> AttentionPlan {
        AttentionPlan::new(
            chunks,
            self.spec.num_heads,
            self.spec.num_kv_heads,
            self.workspace.dense_context,
        )
    }

    fn model(&self) -> Model<'_> {
        Model {
            spec: &self.spec,
            weights: &self.weights,
            inv_freq: &self.inv_freq,
            local_inv_freq: self.local_inv_freq.as_ref(),
            rope_scale: self.rope_scale,
            kernels: &self.kernels,
            blas: &self.blas,
            stream: self.stream.cu_stream(),
        }
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| DeviceError::Unavailable(format!("cannot use the GPU: {e}")))
    }

    fn copy_blocks(&self, copies: &[(u32, u32)]) -> Result<(), DeviceError> {
        let bytes = self.kv.block_bytes;
        for &(src, dst) in copies {
            if src as usize >= self.kv.num_blocks || dst as usize >= self.kv.num_blocks {
                return Err(DeviceError::InvalidBatch(format!(
                    "block copy {src} -> {dst} is outside the cache"
                )));
            }
            for cache in self.kv.k.iter().chain(&self.kv.v) {
                // SAFETY: both blocks are inside the layer's allocation (checked above) and do not
                // overlap (the scheduler copies into a fresh block).
                unsafe {
                    driver::memcpy_dtod_async(
                        cache.at(dst as usize * bytes),
                        cache.at(src as usize * bytes),
                        bytes,
                        self.stream.cu_stream(),
                    )
                }
                .map_err(|e| DeviceError::Unavailable(format!("block copy failed: {e}")))?;
            }
        }
        Ok(())
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn num_blocks(&self) -> u32 {
        self.kv.num_blocks.min(u32::MAX as usize) as u32
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<Vec<f32>, DeviceError> {
        self.bind()?;
        self.step_started = Some(Instant::now());
        self.copy_blocks(batch.copies)?;
        if batch.chunks.is_empty() {
            return Ok(Vec::new());
        }
        let capacity = self.workspace.capacity;
        let mut inputs = StepInputs::layout(
            batch.chunks,
            self.kv.block_size,
            self.kv.num_blocks,
            capacity.blocks_per_seq,
        )?;
        let stream = self.stream.cu_stream();
        let heads = self.spec.num_heads;
        let decode = batch.chunks.iter().all(|c| c.tokens.len() == 1 && c.logits);
        let bucket = bucket_for(batch.chunks.len())
            .filter(|&b| decode && self.use_graphs && b <= capacity.seqs);
        if let Some(bucket) = bucket {
            inputs.pad_to(bucket);
            inputs.upload(&self.workspace, stream)?;
            let window = capacity.blocks_per_seq * self.kv.block_size;
            let plan = AttentionPlan::paged(bucket, graph_splits(bucket, heads, window));
            let model = Model {
                spec: &self.spec,
                weights: &self.weights,
                inv_freq: &self.inv_freq,
                local_inv_freq: self.local_inv_freq.as_ref(),
                rope_scale: self.rope_scale,
                kernels: &self.kernels,
                blas: &self.blas,
                stream,
            };
            let (ws, kv) = (&self.workspace, &self.kv);
            self.graphs.run(bucket, stream, || {
                model.layers(ws, kv, bucket, &plan)?;
                model.head(ws, bucket)
            })?;
        } else {
            inputs.upload(&self.workspace, stream)?;
            let tokens = inputs.ids.len();
            let plan = self.plan(batch.chunks);
            let model = self.model();
            model.layers(&self.workspace, &self.kv, tokens, &plan)?;
            model.head(&self.workspace, inputs.rows.len())?;
        }
        if inputs.rows.is_empty() {
            // Nothing will be sampled, so nothing would wait for this step: wait here, so a
            // fault is reported against the step that caused it.
            sync(stream)?;
        }
        Ok(Vec::new())
    }

    fn embed(&mut self, tokens: &[u32], mode: PoolingMode) -> Result<Vec<f32>, DeviceError> {
        if tokens.is_empty() {
            return Err(DeviceError::InvalidBatch("no tokens to embed".into()));
        }
        self.bind()?;
        let block = self.kv.block_size;
        let blocks = tokens.len().div_ceil(block);
        let scratch = KvCache::new(&self.spec, blocks, block)?;
        let table: Vec<u32> = (0..blocks as u32).collect();
        let step = self.workspace.capacity.tokens.max(1);
        let d = self.spec.hidden_size;
        let stream = self.stream.cu_stream();
        let mut sum = vec![0f64; d];
        let (mut first, mut last) = (Vec::new(), Vec::new());
        for (i, part) in tokens.chunks(step).enumerate() {
            let chunk = Chunk {
                tokens: part,
                start: i * step,
                block_table: &table,
                logits: false,
                generated: false,
                drafts: 0,
            };
            let inputs = StepInputs::layout(
                &[chunk],
                block,
                blocks,
                self.workspace.capacity.blocks_per_seq,
            )?;
            inputs.upload(&self.workspace, stream)?;
            let plan = self.plan(&[chunk]);
            let model = self.model();
            model.layers(&self.workspace, &scratch, part.len(), &plan)?;
            model.final_norm(&self.workspace, part.len(), false)?;
            let mut normed = vec![0u16; part.len() * d];
            self.workspace.normed.read(&mut normed, stream)?;
            sync(stream)?;
            let value = |bits: &u16| half::bf16::from_bits(*bits).to_f32();
            for row in normed.chunks_exact(d) {
                for (s, bits) in sum.iter_mut().zip(row) {
                    *s += f64::from(value(bits));
                }
            }
            if i == 0 {
                first = normed[..d].iter().map(value).collect();
            }
            last = normed[normed.len() - d..].iter().map(value).collect();
        }
        let n = tokens.len() as f64;
        Ok(match mode {
            PoolingMode::Mean => sum.iter().map(|s| (s / n) as f32).collect(),
            PoolingMode::Cls => first,
            PoolingMode::LastToken => last,
        })
    }

    fn sampler(&mut self) -> Option<&mut dyn DeviceSampler> {
        Some(self)
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let (free, total) = self.memory;
        let c = self.graphs.counters;
        let utilization = self.nvml.as_ref().and_then(nvml::Nvml::utilization_percent);
        let mut stats = vec![
            ("gpu_memory_total_bytes", total as f64),
            ("gpu_memory_free_bytes", free as f64),
            ("gpu_weight_bytes", self.weight_bytes as f64),
            (
                "gpu_kv_cache_bytes",
                (KvCache::bytes_per_block(&self.spec, self.kv.block_size) * self.kv.num_blocks)
                    as f64,
            ),
            (
                "gpu_workspace_bytes",
                (self.workspace.bytes() + self.sampler.bytes()) as f64,
            ),
            ("graph_replays", c.replays as f64),
            ("graph_captures", c.captures as f64),
            ("graph_failures", c.failures as f64),
            ("eager_steps", c.eager_steps as f64),
            ("sampled_steps", self.steps as f64),
            (
                "step_time_ms_avg",
                if self.steps == 0 {
                    0.0
                } else {
                    self.step_seconds * 1000.0 / self.steps as f64
                },
            ),
        ];
        if let Some(percent) = utilization {
            stats.push(("gpu_utilization_percent", percent));
        }
        stats
    }
}

/// Samples on the GPU, where the logits are; the host reads rows back only when it ranks them
/// itself.
impl DeviceSampler for CudaDevice {
    fn read_logits(&mut self, rows: usize) -> Result<Vec<f32>, DeviceError> {
        self.bind()?;
        let mut out = vec![0f32; rows * self.spec.vocab_size];
        self.workspace
            .logits
            .read(&mut out, self.stream.cu_stream())?;
        sync(self.stream.cu_stream())?;
        Ok(out)
    }

    fn sample(&mut self, rows: &[SampleRequest<'_>]) -> Result<Vec<Sampled>, DeviceError> {
        self.bind()?;
        let stream = self.stream.cu_stream();
        let sampled = self
            .sampler
            .sample(&self.kernels, &self.workspace.logits, rows, stream)?;
        if let Some(started) = self.step_started.take() {
            self.steps += 1;
            self.step_seconds += started.elapsed().as_secs_f64();
        }
        Ok(sampled)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Buffers free through the driver, which needs the context current on this thread.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}

fn weight_bytes(w: &LayeredWeights<DeviceBuffer>) -> usize {
    let layer_bytes: usize = w
        .layers
        .iter()
        .map(|l| {
            [&l.attn_norm, &l.qkv, &l.o, &l.mlp_norm, &l.gate_up, &l.down]
                .iter()
                .map(|b| b.bytes())
                .sum::<usize>()
                + l.qkv_bias.as_ref().map_or(0, DeviceBuffer::bytes)
                + l.qk_norm.as_ref().map_or(0, |(q, k)| q.bytes() + k.bytes())
                + [&l.post_attn_norm, &l.post_mlp_norm]
                    .iter()
                    .map(|n| n.as_ref().map_or(0, DeviceBuffer::bytes))
                    .sum::<usize>()
                + l.o_bias.as_ref().map_or(0, DeviceBuffer::bytes)
        })
        .sum();
    layer_bytes
        + w.embed.bytes()
        + w.norm.bytes()
        + w.lm_head.as_ref().map_or(0, DeviceBuffer::bytes)
}
