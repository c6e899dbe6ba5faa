//! A GGUF file as a model the engine serves: its `config.json` made from the metadata
//! (`general.architecture` and the `<arch>.*` keys), and its tensors under the Hugging Face names
//! the engine reads (`blk.0.attn_q.weight` is `model.layers.0.self_attn.q_proj.weight`).
//!
//! llama.cpp stores a `llama` model's query and key projections with the two halves of each
//! head's rotary dimensions interleaved (its rotation pairs neighbours; Hugging Face's pairs
//! halves); [`unpermute`] undoes that, so the engine computes exactly what it computes on the
//! original checkpoint. A `qwen2` file keeps Hugging Face's order.

use serde_json::{Value, json};

use super::{Gguf, MetaValue};
use crate::model::ModelError;
use crate::model::pooling::{Pooling, PoolingMode};

/// The architectures this engine serves from a GGUF file, and the `model_type` each is.
const ARCHITECTURES: [(&str, &str); 8] = [
    ("bert", "bert"),
    ("nomic-bert", "nomic_bert"),
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("gemma2", "gemma2"),
    ("gemma3", "gemma3_text"),
    ("phi3", "phi3"),
];

/// The `config.json` the file's metadata describes.
pub fn config(file: &Gguf) -> Result<Value, ModelError> {
    let meta = |key: &str| file.metadata.get(key);
    let arch = meta("general.architecture")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    let Some((_, model_type)) = ARCHITECTURES.iter().find(|(a, _)| *a == arch) else {
        return Err(ModelError::Unsupported(format!(
            "GGUF architecture `{arch}` (this engine serves {})",
            ARCHITECTURES.map(|(a, _)| a).join(", ")
        )));
    };
    let int = |key: &str| meta(&format!("{arch}.{key}")).and_then(MetaValue::as_u64);
    let float = |key: &str| meta(&format!("{arch}.{key}")).and_then(MetaValue::as_f64);
    let need = |key: &str| {
        int(key)
            .ok_or_else(|| ModelError::Config(format!("GGUF metadata `{arch}.{key}` is missing")))
    };
    let vocab = match meta("tokenizer.ggml.tokens") {
        Some(MetaValue::Array(tokens)) => Some(tokens.len() as u64),
        _ => int("vocab_size"),
    }
    .or_else(|| file.tensor("token_embd.weight").map(|t| t.shape[0] as u64));
    if matches!(arch, "bert" | "nomic-bert") {
        return Ok(json!({
            "model_type": model_type,
            "hidden_size": need("embedding_length")?,
            "intermediate_size": need("feed_forward_length")?,
            "num_hidden_layers": need("block_count")?,
            "num_attention_heads": need("attention.head_count")?,
            "vocab_size": vocab,
            "max_position_embeddings": need("context_length")?,
            "layer_norm_eps": float("attention.layer_norm_epsilon"),
            "rotary_emb_base": float("rope.freq_base"),
            "type_vocab_size": file.tensor("token_types.weight").map(|t| t.shape[0]),
            "hidden_act": "gelu",
        }));
    }
    let factors = match file.tensor("rope_freqs.weight") {
        Some(tensor) => Some(file.dequantize(tensor).map_err(ModelError::from)?),
        None => None,
    };
    let long_rope = match (
        file.tensor("rope_factors_short.weight"),
        file.tensor("rope_factors_long.weight"),
    ) {
        (Some(short), Some(long)) => Some((
            file.dequantize(short).map_err(ModelError::from)?,
            file.dequantize(long).map_err(ModelError::from)?,
        )),
        (None, None) => None,
        _ => {
            return Err(ModelError::Config(
                "GGUF LongRoPE needs both `rope_factors_short` and `rope_factors_long`".into(),
            ));
        }
    };
    let scaling_type = meta(&format!("{arch}.rope.scaling.type")).and_then(MetaValue::as_str);
    let rope_scaling = match (long_rope, scaling_type) {
        // Phi-3's LongRoPE, as llama.cpp's converter writes it: the two factor tensors, the
        // trained context and the attention factor it computed.
        (Some((short, long)), _) => json!({
            "rope_type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "original_max_position_embeddings": need("rope.scaling.original_context_length")?,
            "attention_factor": float("rope.scaling.attn_factor").unwrap_or(1.0),
        }),
        (None, None | Some("none")) => match factors {
            Some(factors) => json!({"rope_type": "frequency_factors", "factors": factors}),
            None => Value::Null,
        },
        (None, Some("linear")) => {
            json!({"rope_type": "linear", "factor": float("rope.scaling.factor")})
        }
        (None, Some(other)) => {
            return Err(ModelError::Unsupported(format!(
                "GGUF rope scaling `{other}`"
            )));
        }
    };
    let heads = need("attention.head_count")?;
    let eos: Vec<u64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| meta(k).and_then(MetaValue::as_u64))
        .collect();
    let hidden = need("embedding_length")?;
    let head_dim = int("attention.key_length").unwrap_or(hidden / heads.max(1));
    let mut family = json!({"hidden_act": "silu"});
    if let Some(rotated) = int("rope.dimension_count").filter(|&n| n != head_dim) {
        family["partial_rotary_factor"] = json!(rotated as f64 / head_dim as f64);
    }
    if arch.starts_with("gemma") {
        // llama.cpp scales scores by 1/√head_dim, except for the 27B models, whose
        // `query_pre_attn_scalar` is hidden / heads (their block counts tell them apart).
        let blocks = need("block_count")?;
        let large = (arch == "gemma2" && blocks == 46) || (arch == "gemma3" && blocks == 62);
        let scalar = if large {
            hidden / heads.max(1)
        } else {
            head_dim
        };
        family = json!({
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": scalar,
            "attn_logit_softcapping": float("attn_logit_softcapping"),
            "final_logit_softcapping": float("final_logit_softcapping"),
            "rope_local_base_freq": float("rope.freq_base_swa"),
        });
    }
    let mut config = json!({
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length")?,
        "num_hidden_layers": need("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": int("attention.head_count_kv").unwrap_or(heads),
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        "rope_theta": float("rope.freq_base").unwrap_or(10_000.0),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": need("context_length")?,
        "tie_word_embeddings": file.tensor("output.weight").is_none(),
        "eos_token_id": eos,
        "sliding_window": int("attention.sliding_window"),
    });
    if let (Some(config), Value::Object(family)) = (config.as_object_mut(), family) {
        config.extend(family);
    }
    Ok(config)
}

/// How an embedding model in the file pools (`<arch>.pooling_type`: 1 mean, 2 the first token,
/// 3 the last); llama.cpp normalises embeddings, and so does the engine.
pub fn pooling(file: &Gguf) -> Pooling {
    let arch = file
        .metadata
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    let kind = file
        .metadata
        .get(&format!("{arch}.pooling_type"))
        .and_then(MetaValue::as_u64);
    let mode = match kind {
        Some(2) => PoolingMode::Cls,
        Some(3) => PoolingMode::LastToken,
        _ => PoolingMode::Mean,
    };
    Pooling {
        mode,
        normalize: true,
    }
}

/// How a tensor is stored in the file relative to the Hugging Face checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As is.
    Same,
    /// Rotary halves interleaved within each of this many heads.
    Interleaved(usize),
}

/// The file's name for the Hugging Face tensor `name`, and how it is laid out.
pub fn file_name(file: &Gguf, name: &str) -> Option<(String, Layout)> {
    let meta = |key: &str| file.metadata.get(key).and_then(MetaValue::as_u64);
    let arch = file
        .metadata
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    if matches!(arch, "bert" | "nomic-bert") {
        return crate::model::encoder::file_name(name).map(|n| (n, Layout::Same));
    }
    let heads = meta(&format!("{arch}.attention.head_count")).unwrap_or(1) as usize;
    let kv_heads = meta(&format!("{arch}.attention.head_count_kv")).map_or(heads, |n| n as usize);
    let interleaved = |n| {
        if arch == "llama" {
            Layout::Interleaved(n)
        } else {
            Layout::Same
        }
    };
    let fixed = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(fixed) = fixed {
        return Some((fixed.to_string(), Layout::Same));
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let gemma = arch.starts_with("gemma");
    let (short, layout) = match part {
        "post_attention_layernorm.weight" if gemma => ("post_attention_norm.weight", Layout::Same),
        "pre_feedforward_layernorm.weight" => ("ffn_norm.weight", Layout::Same),
        "post_feedforward_layernorm.weight" => ("post_ffw_norm.weight", Layout::Same),
        "self_attn.qkv_proj.weight" => ("attn_qkv.weight", Layout::Same),
        "mlp.gate_up_proj.weight" if arch == "phi3" => ("ffn_up.weight", Layout::Same),
        "input_layernorm.weight" => ("attn_norm.weight", Layout::Same),
        "self_attn.q_proj.weight" => ("attn_q.weight", interleaved(heads)),
        "self_attn.k_proj.weight" => ("attn_k.weight", interleaved(kv_heads)),
        "self_attn.v_proj.weight" => ("attn_v.weight", Layout::Same),
        "self_attn.o_proj.weight" => ("attn_output.weight", Layout::Same),
        "self_attn.q_proj.bias" => ("attn_q.bias", interleaved(heads)),
        "self_attn.k_proj.bias" => ("attn_k.bias", interleaved(kv_heads)),
        "self_attn.v_proj.bias" => ("attn_v.bias", Layout::Same),
        "self_attn.o_proj.bias" => ("attn_output.bias", Layout::Same),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", Layout::Same),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", Layout::Same),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", Layout::Same),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", Layout::Same),
        "mlp.up_proj.weight" => ("ffn_up.weight", Layout::Same),
        "mlp.down_proj.weight" => ("ffn_down.weight", Layout::Same),
        _ => return None,
    };
    Some((format!("blk.{layer}.{short}"), layout))
}

/// Where each checkpoint row comes from in the file, for a tensor of `rows` rows in `heads`
/// heads: within each head, file row `2i + j` is checkpoint row `j·(head_dim / 2) + i`.
pub fn unpermuted_rows(rows: usize, heads: usize) -> Option<Vec<usize>> {
    if heads == 0 || rows == 0 || !rows.is_multiple_of(heads) {
        return None;
    }
    let head_dim = rows / heads;
    if !head_dim.is_multiple_of(2) {
        return None;
    }
    let half = head_dim / 2;
    let mut order = vec![0; rows];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                order[h * head_dim + j * half + i] = h * head_dim + 2 * i + j;
            }
        }
    }
    Some(order)
}

/// The rows of `values` (`rows` of them) back in Hugging Face's order (see
/// [`unpermuted_rows`]).
pub fn unpermute(values: &[f32], rows: usize, heads: usize) -> Option<Vec<f32>> {
    if rows == 0 || !values.len().is_multiple_of(rows) {
        return None;
    }
    let order = unpermuted_rows(rows, heads)?;
    let width = values.len() / rows;
    Some(
        order
            .iter()
            .flat_map(|&from| &values[from * width..(from + 1) * width])
            .copied()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermuting_restores_the_halves_of_each_head() {
        // Two heads of dimension 4, one column: file rows are (a0 b0 a1 b1) per head, where a
        // is the first half and b the second.
        let file = [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0];
        let hf = unpermute(&file, 8, 2).expect("shape");
        assert_eq!(hf, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert!(unpermute(&file, 8, 3).is_none());
    }
}
