//! The model's weights laid out for the devices: q, k and v fused into one matrix, gate and up
//! into another, so each layer runs four matrix products. Every tensor is read as f32 and handed
//! to a conversion as soon as it is read (the CPU keeps it; the GPU rounds it to bf16 and
//! uploads it), so loading holds one tensor on the host at a time, not the model.

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
    /// Attention output projection.
    pub o: T,
    /// Its bias, when the model has one.
    pub o_bias: Option<T>,
    /// RMSNorm before the MLP.
    pub mlp_norm: T,
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

/// The weights in f32 on the host.
pub type CpuWeights = LayeredWeights<Vec<f32>>;

impl CpuWeights {
    /// Reads every tensor in f32, checking shapes against `spec`.
    pub fn load(spec: &ModelSpec, weights: &Weights) -> Result<Self, ModelError> {
        Self::load_with(spec, weights, Ok)
    }
}

impl<T> LayeredWeights<T> {
    /// Reads every tensor, checking shapes against `spec`, and turns each into a `T` with
    /// `convert` as soon as it is read (fused tensors once whole).
    pub fn load_with(
        spec: &ModelSpec,
        weights: &Weights,
        convert: impl Fn(Vec<f32>) -> Result<T, ModelError>,
    ) -> Result<Self, ModelError> {
        let (d, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
        let (q, kv) = (
            spec.num_heads * spec.head_dim,
            spec.num_kv_heads * spec.head_dim,
        );
        let get = |name: &str, shape: &[usize]| weights.get(name, shape).map(|t| t.data);
        let bias = |name: &str, rows: usize| -> Result<Option<Vec<f32>>, ModelError> {
            if weights.contains(name) {
                get(name, &[rows]).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(spec.num_layers);
        for l in 0..spec.num_layers {
            let p = format!("model.layers.{l}");
            let attn = |n: &str| format!("{p}.self_attn.{n}");
            let mut qkv = get(&attn("q_proj.weight"), &[q, d])?;
            qkv.extend(get(&attn("k_proj.weight"), &[kv, d])?);
            qkv.extend(get(&attn("v_proj.weight"), &[kv, d])?);
            let qkv = convert(qkv)?;
            let biases = [
                bias(&attn("q_proj.bias"), q)?,
                bias(&attn("k_proj.bias"), kv)?,
                bias(&attn("v_proj.bias"), kv)?,
            ];
            let qkv_bias = if biases.iter().any(Option::is_some) {
                let sizes = [q, kv, kv];
                Some(convert(
                    biases
                        .into_iter()
                        .zip(sizes)
                        .flat_map(|(b, n)| b.unwrap_or_else(|| vec![0.0; n]))
                        .collect(),
                )?)
            } else {
                None
            };
            let mut gate_up = get(&format!("{p}.mlp.gate_proj.weight"), &[f, d])?;
            gate_up.extend(get(&format!("{p}.mlp.up_proj.weight"), &[f, d])?);
            let gate_up = convert(gate_up)?;
            layers.push(Layer {
                attn_norm: convert(get(&format!("{p}.input_layernorm.weight"), &[d])?)?,
                qkv,
                qkv_bias,
                o: convert(get(&attn("o_proj.weight"), &[d, q])?)?,
                o_bias: bias(&attn("o_proj.bias"), d)?.map(&convert).transpose()?,
                mlp_norm: convert(get(&format!("{p}.post_attention_layernorm.weight"), &[d])?)?,
                gate_up,
                down: convert(get(&format!("{p}.mlp.down_proj.weight"), &[d, f])?)?,
            });
        }
        let lm_head = if weights.contains("lm_head.weight") && !spec.tie_word_embeddings {
            Some(convert(get("lm_head.weight", &[v, d])?)?)
        } else if spec.tie_word_embeddings {
            None
        } else {
            return Err(ModelError::Config(
                "tensor `lm_head.weight` is missing and tie_word_embeddings is false".into(),
            ));
        };
        Ok(Self {
            embed: convert(get("model.embed_tokens.weight", &[v, d])?)?,
            layers,
            norm: convert(get("model.norm.weight", &[d])?)?,
            lm_head,
        })
    }

    /// The output projection (vocab × hidden).
    pub fn output(&self) -> &T {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}
