//! The model's weights in f32, laid out for the CPU kernels: q, k and v fused into one matrix,
//! gate and up into another, so each layer runs four matrix products.

use crate::model::{ModelError, ModelSpec, Weights};

/// One transformer block.
#[derive(Debug)]
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Rows: q (heads × head_dim), then k, then v (kv_heads × head_dim each).
    pub qkv: Vec<f32>,
    /// Bias of `qkv` (Qwen2, or Llama with `attention_bias`).
    pub qkv_bias: Option<Vec<f32>>,
    /// Attention output projection.
    pub o: Vec<f32>,
    /// Its bias, when the model has one.
    pub o_bias: Option<Vec<f32>>,
    /// RMSNorm before the MLP.
    pub mlp_norm: Vec<f32>,
    /// Rows: gate, then up.
    pub gate_up: Vec<f32>,
    /// MLP output projection.
    pub down: Vec<f32>,
}

/// Every weight of the model.
#[derive(Debug)]
pub struct CpuWeights {
    /// Token embeddings, vocab × hidden.
    pub embed: Vec<f32>,
    /// The blocks.
    pub layers: Vec<Layer>,
    /// Final RMSNorm.
    pub norm: Vec<f32>,
    /// The output projection; `None` when tied to `embed`.
    pub lm_head: Option<Vec<f32>>,
}

impl CpuWeights {
    /// Reads and converts every tensor, checking shapes against `spec`.
    pub fn load(spec: &ModelSpec, weights: &Weights) -> Result<Self, ModelError> {
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
            let biases = [
                bias(&attn("q_proj.bias"), q)?,
                bias(&attn("k_proj.bias"), kv)?,
                bias(&attn("v_proj.bias"), kv)?,
            ];
            let qkv_bias = if biases.iter().any(Option::is_some) {
                let sizes = [q, kv, kv];
                Some(
                    biases
                        .into_iter()
                        .zip(sizes)
                        .flat_map(|(b, n)| b.unwrap_or_else(|| vec![0.0; n]))
                        .collect(),
                )
            } else {
                None
            };
            let mut gate_up = get(&format!("{p}.mlp.gate_proj.weight"), &[f, d])?;
            gate_up.extend(get(&format!("{p}.mlp.up_proj.weight"), &[f, d])?);
            layers.push(Layer {
                attn_norm: get(&format!("{p}.input_layernorm.weight"), &[d])?,
                qkv,
                qkv_bias,
                o: get(&attn("o_proj.weight"), &[d, q])?,
                o_bias: bias(&attn("o_proj.bias"), d)?,
                mlp_norm: get(&format!("{p}.post_attention_layernorm.weight"), &[d])?,
                gate_up,
                down: get(&format!("{p}.mlp.down_proj.weight"), &[d, f])?,
            });
        }
        let lm_head = if weights.contains("lm_head.weight") && !spec.tie_word_embeddings {
            Some(get("lm_head.weight", &[v, d])?)
        } else if spec.tie_word_embeddings {
            None
        } else {
            return Err(ModelError::Config(
                "tensor `lm_head.weight` is missing and tie_word_embeddings is false".into(),
            ));
        };
        Ok(Self {
            embed: get("model.embed_tokens.weight", &[v, d])?,
            layers,
            norm: get("model.norm.weight", &[d])?,
            lm_head,
        })
    }

    /// The output projection (vocab × hidden).
    pub fn output(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }
}
