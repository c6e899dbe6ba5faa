//! One step of the model on the GPU, once its inputs are uploaded ([`super::inputs`]): the
//! layers run as a fixed sequence of stages (kernel launches and matrix products over the
//! workspace). The same sequence runs directly or inside a CUDA graph capture, and the
//! profiler runs one stage at a time.

use cudarc::driver::sys::{CUdeviceptr, CUstream};

use super::blas::Blas;
use super::dense_attention::{AttentionPlan, PagedRange};
use super::inputs::KvCache;
use super::launch::{Kernels, arg, launch};
use super::memory::DeviceBuffer;
use super::workspace::Workspace;
use crate::device::DeviceError;
use crate::model::architecture::Activation;
use crate::model::{LayeredWeights, ModelSpec};

/// Threads per block of the row kernels (norms, gather).
const ROW_THREADS: u32 = 512;
/// Threads per block of attention (its kernel's `ATTN_WARPS` warps).
const ATTENTION_THREADS: u32 = 128;

/// What the launch sequence reads besides the workspace.
#[derive(Debug, Clone, Copy)]
pub(super) struct Model<'a> {
    pub spec: &'a ModelSpec,
    pub weights: &'a LayeredWeights<DeviceBuffer>,
    pub inv_freq: &'a DeviceBuffer,
    /// The sliding layers' own rotary frequencies, where the family has them.
    pub local_inv_freq: Option<&'a DeviceBuffer>,
    /// Scale of the global layers' cosines and sines.
    pub rope_scale: f32,
    pub kernels: &'a Kernels,
    pub blas: &'a Blas,
    pub stream: CUstream,
}

/// The launches of one layer, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Adds the last MLP output to the residual stream and norms it.
    InputNorm,
    Qkv,
    /// Rotary embedding (with q/k norms and bias where the family has them) and the KV write.
    Rotary,
    Attention,
    /// The output projection (and its norm where the family has one).
    OutProj,
    /// Adds the attention output to the residual stream and norms it.
    MlpNorm,
    GateUp,
    Activation,
    /// The down projection (and its norm where the family has one).
    Down,
}

impl Stage {
    pub(super) const ALL: [Stage; 9] = [
        Stage::InputNorm,
        Stage::Qkv,
        Stage::Rotary,
        Stage::Attention,
        Stage::OutProj,
        Stage::MlpNorm,
        Stage::GateUp,
        Stage::Activation,
        Stage::Down,
    ];

    /// The stage's name in reports.
    pub(super) fn name(self) -> &'static str {
        match self {
            Stage::InputNorm => "input_norm",
            Stage::Qkv => "qkv",
            Stage::Rotary => "rotary_kv_store",
            Stage::Attention => "attention",
            Stage::OutProj => "o_proj",
            Stage::MlpNorm => "mlp_norm",
            Stage::GateUp => "gate_up",
            Stage::Activation => "activation",
            Stage::Down => "down",
        }
    }
}

const NULL: CUdeviceptr = 0;

impl Model<'_> {
    /// Runs every layer over `tokens` tokens already uploaded, with attention as `plan` says.
    /// Leaves the last MLP output in `ws.add`, not yet added.
    pub(super) fn layers(
        &self,
        ws: &Workspace,
        kv: &KvCache,
        tokens: usize,
        plan: &AttentionPlan,
    ) -> Result<(), DeviceError> {
        let hidden = self.spec.hidden_size as i32;
        let embed_scale = self.spec.arch.embed_scale.unwrap_or(1.0);
        launch(
            &self.kernels.embedding_gather,
            (tokens as u32, 1, 1),
            ROW_THREADS,
            self.stream,
            &mut [
                arg(&ws.ids.ptr()),
                arg(&self.weights.embed.ptr()),
                arg(&ws.resid.ptr()),
                arg(&hidden),
                arg(&embed_scale),
            ],
        )?;
        for l in 0..self.weights.layers.len() {
            for stage in Stage::ALL {
                self.stage(stage, ws, kv, l, tokens, plan)?;
            }
        }
        Ok(())
    }

    /// Runs one stage of layer `l` (the profiler times each stage on its own).
    pub(super) fn stage(
        &self,
        stage: Stage,
        ws: &Workspace,
        kv: &KvCache,
        l: usize,
        tokens: usize,
        plan: &AttentionPlan,
    ) -> Result<(), DeviceError> {
        let spec = self.spec;
        let layer = &self.weights.layers[l];
        let t = tokens as u32;
        let (d, hd) = (spec.hidden_size, spec.head_dim);
        let (hq, hkv) = (spec.num_heads, spec.num_kv_heads);
        let f = spec.intermediate_size;
        let arch = &spec.arch;
        match stage {
            Stage::InputNorm => {
                // resid += previous MLP output; normed = norm(resid).
                let add = if l == 0 { NULL } else { ws.add.ptr() };
                self.norm(ws, add, NULL, NULL, layer.attn_norm.ptr(), t)
            }
            Stage::Qkv => self.blas.linear(
                ws.normed.ptr(),
                layer.qkv.ptr(),
                ws.qkv.ptr(),
                tokens,
                (hq + 2 * hkv) * hd,
                d,
            ),
            Stage::Rotary => {
                let bias = layer.qkv_bias.as_ref().map_or(NULL, DeviceBuffer::ptr);
                let (inv_freq, rope_scale) = match self.local_inv_freq {
                    Some(local) if arch.local_rope(l) => (local, 1.0f32),
                    _ => (self.inv_freq, self.rope_scale),
                };
                let rot_half = (spec.rotary_dim / 2) as i32;
                let (q_norm, k_norm) = layer
                    .qk_norm
                    .as_ref()
                    .map_or((NULL, NULL), |(q, k)| (q.ptr(), k.ptr()));
                let eps = spec.rms_norm_eps;
                let (q_heads, kv_heads, head_dim) = (hq as i32, hkv as i32, hd as i32);
                launch(
                    &self.kernels.rotary_kv_store,
                    (t, (hq + 2 * hkv) as u32, 1),
                    (hd / 2) as u32,
                    self.stream,
                    &mut [
                        arg(&ws.qkv.ptr()),
                        arg(&bias),
                        arg(&q_norm),
                        arg(&k_norm),
                        arg(&eps),
                        arg(&ws.positions.ptr()),
                        arg(&inv_freq.ptr()),
                        arg(&rot_half),
                        arg(&rope_scale),
                        arg(&ws.slots.ptr()),
                        arg(&ws.q.ptr()),
                        arg(&kv.k[l].ptr()),
                        arg(&kv.v[l].ptr()),
                        arg(&q_heads),
                        arg(&kv_heads),
                        arg(&head_dim),
                    ],
                )
            }
            Stage::Attention => {
                for range in &plan.paged {
                    self.paged_attention(ws, kv, l, range)?;
                }
                for chunk in &plan.dense {
                    self.dense_attention(ws, kv, l, chunk)?;
                }
                Ok(())
            }
            Stage::OutProj => {
                self.blas.linear(
                    ws.attn.ptr(),
                    layer.o.ptr(),
                    ws.add.ptr(),
                    tokens,
                    d,
                    hq * hd,
                )?;
                // A family with output norms has no output bias (the norm would come after it).
                self.output_norm(ws, layer.post_attn_norm.as_ref(), t)
            }
            Stage::MlpNorm => {
                let o_bias = layer.o_bias.as_ref().map_or(NULL, DeviceBuffer::ptr);
                self.norm(ws, ws.add.ptr(), o_bias, NULL, layer.mlp_norm.ptr(), t)
            }
            Stage::GateUp => self.blas.linear(
                ws.normed.ptr(),
                layer.gate_up.ptr(),
                ws.gate_up.ptr(),
                tokens,
                2 * f,
                d,
            ),
            Stage::Activation => {
                let inter = f as i32;
                let gelu = i32::from(arch.activation == Activation::GeluTanh);
                launch(
                    &self.kernels.silu_and_mul,
                    (t, (f as u32).div_ceil(256), 1),
                    256,
                    self.stream,
                    &mut [
                        arg(&ws.gate_up.ptr()),
                        arg(&ws.act.ptr()),
                        arg(&inter),
                        arg(&gelu),
                    ],
                )
            }
            Stage::Down => {
                self.blas
                    .linear(ws.act.ptr(), layer.down.ptr(), ws.add.ptr(), tokens, d, f)?;
                self.output_norm(ws, layer.post_mlp_norm.as_ref(), t)
            }
        }
    }

    /// Adds the last MLP output and applies the final norm to `rows` uploaded rows (all
    /// `rows` tokens when `gather` is false), into `ws.normed`.
    pub(super) fn final_norm(
        &self,
        ws: &Workspace,
        rows: usize,
        gather: bool,
    ) -> Result<(), DeviceError> {
        let rows_ptr = if gather { ws.rows.ptr() } else { NULL };
        self.norm(
            ws,
            ws.add.ptr(),
            NULL,
            rows_ptr,
            self.weights.norm.ptr(),
            rows as u32,
        )
    }

    /// The final norm and the output projection for the uploaded logits rows, into
    /// `ws.logits`.
    pub(super) fn head(&self, ws: &Workspace, rows: usize) -> Result<(), DeviceError> {
        if rows == 0 {
            return Ok(());
        }
        self.final_norm(ws, rows, true)?;
        let spec = self.spec;
        self.blas.linear(
            ws.normed.ptr(),
            self.weights.output().ptr(),
            ws.logits.ptr(),
            rows,
            spec.vocab_size,
            spec.hidden_size,
        )?;
        let Some(cap) = spec.arch.final_softcap else {
            return Ok(());
        };
        let width = spec.vocab_size as i32;
        launch(
            &self.kernels.logit_softcap,
            (rows as u32, (spec.vocab_size as u32).div_ceil(256), 1),
            256,
            self.stream,
            &mut [arg(&ws.logits.ptr()), arg(&width), arg(&cap)],
        )
    }

    /// Normalises the `tokens` rows of `ws.add` in place where the family norms each output
    /// before it joins the residual (Gemma).
    fn output_norm(
        &self,
        ws: &Workspace,
        norm: Option<&DeviceBuffer>,
        tokens: u32,
    ) -> Result<(), DeviceError> {
        let Some(norm) = norm else {
            return Ok(());
        };
        let hidden = self.spec.hidden_size as i32;
        let eps = self.spec.rms_norm_eps;
        launch(
            &self.kernels.rms_norm_rows,
            (tokens, 1, 1),
            ROW_THREADS,
            self.stream,
            &mut [
                arg(&ws.add.ptr()),
                arg(&norm.ptr()),
                arg(&hidden),
                arg(&eps),
            ],
        )
    }

    fn norm(
        &self,
        ws: &Workspace,
        add: CUdeviceptr,
        bias: CUdeviceptr,
        rows: CUdeviceptr,
        weight: CUdeviceptr,
        count: u32,
    ) -> Result<(), DeviceError> {
        let hidden = self.spec.hidden_size as i32;
        let eps = self.spec.rms_norm_eps;
        launch(
            &self.kernels.rms_norm_residual,
            (count, 1, 1),
            ROW_THREADS,
            self.stream,
            &mut [
                arg(&ws.resid.ptr()),
                arg(&add),
                arg(&bias),
                arg(&rows),
                arg(&weight),
                arg(&ws.normed.ptr()),
                arg(&hidden),
                arg(&eps),
            ],
        )
    }

    fn paged_attention(
        &self,
        ws: &Workspace,
        kv: &KvCache,
        layer: usize,
        range: &PagedRange,
    ) -> Result<(), DeviceError> {
        let (tokens, splits) = (range.tokens as u32, range.splits);
        let first_token = range.first as i32;
        let spec = self.spec;
        let block_size = kv.block_size as i32;
        let (q_heads, kv_heads, head_dim) = (
            spec.num_heads as i32,
            spec.num_kv_heads as i32,
            spec.head_dim as i32,
        );
        let scale = spec.arch.attn_scale;
        let softcap = spec.arch.attn_softcap.unwrap_or(0.0);
        let window = spec.arch.windows.get(layer).copied().flatten().unwrap_or(0) as i32;
        launch(
            &self.kernels.paged_attention,
            (tokens, spec.num_heads as u32, splits as u32),
            ATTENTION_THREADS,
            self.stream,
            &mut [
                arg(&ws.q.ptr()),
                arg(&kv.k[layer].ptr()),
                arg(&kv.v[layer].ptr()),
                arg(&ws.context.ptr()),
                arg(&ws.seq_of.ptr()),
                arg(&ws.block_tables.ptr()),
                arg(&ws.table_stride.ptr()),
                arg(&block_size),
                arg(&q_heads),
                arg(&kv_heads),
                arg(&head_dim),
                arg(&scale),
                arg(&softcap),
                arg(&window),
                arg(&first_token),
                arg(&ws.part_max.ptr()),
                arg(&ws.part_sum.ptr()),
                arg(&ws.part_acc.ptr()),
                arg(&ws.attn.ptr()),
            ],
        )?;
        if splits > 1 {
            let splits = splits as i32;
            launch(
                &self.kernels.attention_combine,
                (tokens, spec.num_heads as u32, 1),
                ATTENTION_THREADS,
                self.stream,
                &mut [
                    arg(&ws.part_max.ptr()),
                    arg(&ws.part_sum.ptr()),
                    arg(&ws.part_acc.ptr()),
                    arg(&splits),
                    arg(&head_dim),
                    arg(&first_token),
                    arg(&ws.attn.ptr()),
                ],
            )?;
        }
        Ok(())
    }
}
