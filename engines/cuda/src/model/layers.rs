//! The model's weights laid out for the devices: q, k and v fused into one matrix, gate and up
//! into another, so each layer runs four matrix products. A [`TensorReader`] says how each
//! tensor is read (the CPU keeps every matrix in its own precision, [`PackedReader`]; the GPU
//! reads f32, [`F32Reader`], and rounds it to bf16 as it uploads it), and each is handed to a
//! conversion as soon as it is read, so loading holds one tensor on the host at a time.

use super::packed::Packed;
use super::{ModelError, ModelSpec, Weights};

/// One transformer block, each tensor as a `T`.
#[derive(Debug)]
pub struct Layer<T> {
    /// RMSNorm before attention.
    pub attn_norm: T,
    /// Rows: q (heads × head_dim), then k, then v (kv_heads × head_dim each).
    pub qkv: T,
    /// Bias of `qkv` (Qwen2, or Llama with `attention_bias`).
    pub qkv_bias: Option<T>,
    /// RMSNorm weights (head_dim each) applied to every query head and every key head before
    /// rotation, when the model normalises them (Qwen3).
    pub qk_norm: Option<(T, T)>,
    /// Attention output projection.
    pub o: T,
    /// Its bias, when the model has one.
    pub o_bias: Option<T>,
    /// RMSNorm of the attention output before it joins the residual (Gemma).
    pub post_attn_norm: Option<T>,
    /// RMSNorm before the MLP.
    pub mlp_norm: T,
    /// RMSNorm of the MLP output before it joins the residual (Gemma).
    pub post_mlp_norm: Option<T>,
    /// Rows: gate, then up.
    pub gate_up: T,
    /// MLP output projection.
    pub down: T,
}

/// Every weight of the model, each tensor as a `T`.
#[derive(Debug)]
pub struct LayeredWeights<T> {
    /// Token embeddings, vocab × hidden.
    pub embed: T,
    /// The blocks.
    pub layers: Vec<Layer<T>>,
    /// Final RMSNorm.
    pub norm: T,
    /// The output projection; `None` when tied to `embed`.
    pub lm_head: Option<T>,
}

/// How a loader reads tensors: matrices in the representation it keeps, vectors (norms and
/// biases) handed over in f32, and fused matrices stacked row-wise.
pub trait TensorReader {
    /// A tensor as this reader keeps it.
    type Tensor;
    /// The `rows × cols` matrix called `name`.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Self::Tensor, ModelError>;
    /// A vector of f32 values.
    fn vector(&self, values: Vec<f32>) -> Self::Tensor;
    /// Matrices of equal width, one under another.
    fn stack(&self, parts: Vec<Self::Tensor>) -> Self::Tensor;
}

/// Reads every tensor as f32 (the GPU converts each to bf16 as it uploads it).
#[derive(Debug)]
pub struct F32Reader<'a>(pub &'a Weights);

impl TensorReader for F32Reader<'_> {
    type Tensor = Vec<f32>;

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, ModelError> {
        self.0.get(name, &[rows, cols]).map(|t| t.data)
    }

    fn vector(&self, values: Vec<f32>) -> Vec<f32> {
        values
    }

    fn stack(&self, parts: Vec<Vec<f32>>) -> Vec<f32> {
        parts.concat()
    }
}

/// Reads matrices in their own precision (quantized GGUF types stay quantized), each as the
/// parts it is stacked from: neighbours in one layout joined, the others kept apart
/// ([`Packed::stack_runs`]) for a device that multiplies each part in its own layout.
#[derive(Debug)]
pub struct PackedReader<'a>(pub &'a Weights);

impl TensorReader for PackedReader<'_> {
    type Tensor = Vec<Packed>;

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<Packed>, ModelError> {
        Ok(vec![self.0.packed(name, &[rows, cols])?])
    }

    fn vector(&self, values: Vec<f32>) -> Vec<Packed> {
        vec![Packed::f32(1, values.len(), values)]
    }

    fn stack(&self, parts: Vec<Vec<Packed>>) -> Vec<Packed> {
        Packed::stack_runs(parts.into_iter().flatten().collect())
    }
}

impl<T> LayeredWeights<T> {
    /// Reads every tensor through `reader`, checking shapes against `spec`, and turns each into
    /// a `T` with `convert` as soon as it is read (fused tensors once whole).
    pub fn load_with<R: TensorReader>(
        spec: &ModelSpec,
        weights: &Weights,
        reader: &R,
        convert: impl Fn(R::Tensor) -> Result<T, ModelError>,
    ) -> Result<Self, ModelError> {
        let (d, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
        let (q, kv) = (
            spec.num_heads * spec.head_dim,
            spec.num_kv_heads * spec.head_dim,
        );
        let get = |name: &str, rows: usize, cols: usize| reader.matrix(name, rows, cols);
        // Norm weights, with the family's offset (Gemma scales by `1 + w`).
        let offset = spec.arch.norm_offset;
        let vector = |name: &str, len: usize| -> Result<R::Tensor, ModelError> {
            let mut values = weights.get(name, &[len])?.data;
            if offset != 0.0 {
                values.iter_mut().for_each(|w| *w += offset);
            }
            Ok(reader.vector(values))
        };
        // A matrix the checkpoint fuses already (Phi-3's qkv_proj and gate_up_proj), else its
        // parts stacked.
        let fused = |name: &str, parts: &[(String, usize)]| -> Result<R::Tensor, ModelError> {
            if weights.contains(name) {
                return get(name, parts.iter().map(|(_, rows)| rows).sum(), d);
            }
            let read: Result<Vec<_>, _> = parts.iter().map(|(n, rows)| get(n, *rows, d)).collect();
            Ok(reader.stack(read?))
        };
        let bias = |name: &str, rows: usize| -> Result<Option<Vec<f32>>, ModelError> {
            if weights.contains(name) {
                weights.get(name, &[rows]).map(|t| Some(t.data))
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(spec.num_layers);
        for l in 0..spec.num_layers {
            let p = format!("model.layers.{l}");
            let attn = |n: &str| format!("{p}.self_attn.{n}");
            let qkv = convert(fused(
                &attn("qkv_proj.weight"),
                &[
                    (attn("q_proj.weight"), q),
                    (attn("k_proj.weight"), kv),
                    (attn("v_proj.weight"), kv),
                ],
            )?)?;
            let biases = [
                bias(&attn("q_proj.bias"), q)?,
                bias(&attn("k_proj.bias"), kv)?,
                bias(&attn("v_proj.bias"), kv)?,
            ];
            let qkv_bias = if biases.iter().any(Option::is_some) {
                let sizes = [q, kv, kv];
                Some(convert(
                    reader.vector(
                        biases
                            .into_iter()
                            .zip(sizes)
                            .flat_map(|(b, n)| b.unwrap_or_else(|| vec![0.0; n]))
                            .collect(),
                    ),
                )?)
            } else {
                None
            };
            let gate_up = convert(fused(
                &format!("{p}.mlp.gate_up_proj.weight"),
                &[
                    (format!("{p}.mlp.gate_proj.weight"), f),
                    (format!("{p}.mlp.up_proj.weight"), f),
                ],
            )?)?;
            let norm = |name: &str| -> Result<T, ModelError> {
                convert(vector(&format!("{p}.{name}.weight"), d)?)
            };
            // Gemma's `post_attention_layernorm` is the attention output's norm and
            // `pre_feedforward_layernorm` the MLP's; elsewhere the former is the MLP's.
            let (post_attn_norm, mlp_norm, post_mlp_norm) = if spec.arch.sandwich_norms {
                (
                    Some(norm("post_attention_layernorm")?),
                    norm("pre_feedforward_layernorm")?,
                    Some(norm("post_feedforward_layernorm")?),
                )
            } else {
                (None, norm("post_attention_layernorm")?, None)
            };
            let o_bias = bias(&attn("o_proj.bias"), d)?.map(|b| convert(reader.vector(b)));
            let qk_norm = if spec.arch.qk_norm {
                let hd = spec.head_dim;
                Some((
                    convert(vector(&attn("q_norm.weight"), hd)?)?,
                    convert(vector(&attn("k_norm.weight"), hd)?)?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: norm("input_layernorm")?,
                qkv,
                qkv_bias,
                qk_norm,
                o: convert(get(&attn("o_proj.weight"), d, q)?)?,
                o_bias: o_bias.transpose()?,
                post_attn_norm,
                mlp_norm,
                post_mlp_norm,
                gate_up,
                down: convert(get(&format!("{p}.mlp.down_proj.weight"), d, f)?)?,
            });
        }
        let lm_head = if weights.contains("lm_head.weight") && !spec.tie_word_embeddings {
            Some(convert(get("lm_head.weight", v, d)?)?)
        } else if spec.tie_word_embeddings {
            None
        } else {
            return Err(ModelError::Config(
                "tensor `lm_head.weight` is missing and tie_word_embeddings is false".into(),
            ));
        };
        Ok(Self {
            embed: convert(get("model.embed_tokens.weight", v, d)?)?,
            layers,
            norm: convert(vector("model.norm.weight", d)?)?,
            lm_head,
        })
    }

    /// The output projection (vocab × hidden).
    pub fn output(&self) -> &T {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}
