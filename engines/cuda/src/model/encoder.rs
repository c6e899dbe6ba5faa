//! Encoder embedding models: BERT (`bert`: absolute positions, GELU MLP, biases everywhere) and
//! Nomic's BERT (`nomic_bert` / GGUF `nomic-bert`: rotary positions, SwiGLU MLP, a fused q/k/v
//! matrix). Both attend in both directions and norm after each block (LayerNorm with a bias);
//! they serve `/v1/embeddings` only. The shape comes from a folder's `config.json` or a GGUF
//! file's metadata; how a text's token states become one vector is the folder's
//! [`super::pooling`].

use serde_json::Value;

use super::ModelError;

/// Where positions come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Positions {
    /// A learned embedding row per position, added to the token's.
    Absolute,
    /// Rotary embeddings (rotate-half pairs) with this base.
    Rotary(f32),
}

/// The MLP of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderMlp {
    /// `down(gelu(up(x)))`, with biases (BERT; GELU by `erf`).
    Gelu,
    /// `down(up(x) · silu(gate(x)))` (Nomic).
    SwiGlu,
}

/// The validated shape of an encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec {
    /// `bert` or `nomic_bert`.
    pub model_type: String,
    /// Embedding width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Longest input in tokens.
    pub max_positions: usize,
    /// Rows of the token-type (segment) embedding.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// Position encoding.
    pub positions: Positions,
    /// MLP kind.
    pub mlp: EncoderMlp,
}

/// The `model_type`s served as encoders.
pub const ENCODER_TYPES: [&str; 2] = ["bert", "nomic_bert"];

impl EncoderSpec {
    /// The encoder `config.json` (or a GGUF file's metadata made into one) describes.
    pub fn from_config(config: &Value) -> Result<Self, ModelError> {
        let model_type = config["model_type"].as_str().unwrap_or("").to_string();
        let int = |keys: &[&str]| -> Result<usize, ModelError> {
            keys.iter()
                .find_map(|k| config[k].as_u64())
                .map(|v| v as usize)
                .filter(|&v| v > 0)
                .ok_or_else(|| ModelError::Config(format!("config.json: `{}` is missing", keys[0])))
        };
        let float = |keys: &[&str]| keys.iter().find_map(|k| config[k].as_f64());
        let (positions, mlp) = match model_type.as_str() {
            "bert" => {
                if let Some(act) = config["hidden_act"].as_str().filter(|a| *a != "gelu") {
                    return Err(ModelError::Unsupported(format!(
                        "hidden_act `{act}` in a BERT model (only `gelu`)"
                    )));
                }
                (Positions::Absolute, EncoderMlp::Gelu)
            }
            "nomic_bert" => {
                if float(&["rotary_emb_fraction"]).is_some_and(|f| f != 1.0) {
                    return Err(ModelError::Unsupported(
                        "partial rotary embeddings in a Nomic BERT model".into(),
                    ));
                }
                let theta = float(&["rotary_emb_base"]).unwrap_or(10_000.0) as f32;
                (Positions::Rotary(theta), EncoderMlp::SwiGlu)
            }
            other => {
                return Err(ModelError::Unsupported(format!(
                    "encoder model_type `{other}` (this engine serves {})",
                    ENCODER_TYPES.join(", ")
                )));
            }
        };
        let hidden = int(&["hidden_size", "n_embd"])?;
        let heads = int(&["num_attention_heads", "n_head"])?;
        if !hidden.is_multiple_of(heads) || !(hidden / heads).is_multiple_of(2) {
            return Err(ModelError::Config(format!(
                "hidden size {hidden} does not split into {heads} heads of an even width"
            )));
        }
        Ok(Self {
            model_type,
            hidden_size: hidden,
            intermediate_size: int(&["intermediate_size", "n_inner"])?,
            num_layers: int(&["num_hidden_layers", "n_layer"])?,
            num_heads: heads,
            vocab_size: int(&["vocab_size"])?,
            max_positions: int(&["max_position_embeddings", "n_positions"])?,
            type_vocab_size: config["type_vocab_size"].as_u64().unwrap_or(2) as usize,
            eps: float(&["layer_norm_eps", "layer_norm_epsilon"]).unwrap_or(1e-12) as f32,
            positions,
            mlp,
        })
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

/// The Hugging Face name `name` of an encoder tensor as llama.cpp's converter names it
/// (`bert.` and `model.` prefixes ignored); `None` for a name that is not an encoder's.
pub fn file_name(name: &str) -> Option<String> {
    let name = name
        .strip_prefix("bert.")
        .or_else(|| name.strip_prefix("model."))
        .unwrap_or(name);
    let fixed = match name {
        "embeddings.word_embeddings.weight" => Some("token_embd.weight"),
        "embeddings.position_embeddings.weight" => Some("position_embd.weight"),
        "embeddings.token_type_embeddings.weight" => Some("token_types.weight"),
        "embeddings.LayerNorm.weight" | "emb_ln.weight" => Some("token_embd_norm.weight"),
        "embeddings.LayerNorm.bias" | "emb_ln.bias" => Some("token_embd_norm.bias"),
        _ => None,
    };
    if let Some(fixed) = fixed {
        return Some(fixed.to_string());
    }
    let rest = name
        .strip_prefix("encoder.layer.")
        .or_else(|| name.strip_prefix("encoder.layers."))?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = part.rsplit_once('.')?;
    let short = match part {
        "attention.self.query" => "attn_q",
        "attention.self.key" => "attn_k",
        "attention.self.value" => "attn_v",
        "attn.Wqkv" => "attn_qkv",
        "attention.output.dense" | "attn.out_proj" => "attn_output",
        "attention.output.LayerNorm" | "norm1" => "attn_output_norm",
        "intermediate.dense" | "mlp.fc11" => "ffn_up",
        "mlp.fc12" => "ffn_gate",
        "output.dense" | "mlp.fc2" => "ffn_down",
        "output.LayerNorm" | "norm2" => "layer_output_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bert_and_nomic_configs_validate_and_name_their_tensors() {
        let bert = json!({"model_type": "bert", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
            "max_position_embeddings": 128, "hidden_act": "gelu"});
        let spec = EncoderSpec::from_config(&bert).expect("bert");
        assert_eq!((spec.head_dim(), spec.positions), (16, Positions::Absolute));
        let nomic = json!({"model_type": "nomic_bert", "n_embd": 64, "n_inner": 128,
            "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 2048,
            "rotary_emb_base": 1000});
        let spec = EncoderSpec::from_config(&nomic).expect("nomic");
        assert_eq!(spec.positions, Positions::Rotary(1000.0));
        assert_eq!(
            file_name("bert.encoder.layer.1.attention.output.LayerNorm.bias").as_deref(),
            Some("blk.1.attn_output_norm.bias")
        );
        assert_eq!(
            file_name("encoder.layers.0.mlp.fc12.weight").as_deref(),
            Some("blk.0.ffn_gate.weight")
        );
        let gelu_new = json!({"model_type": "bert", "hidden_act": "relu"});
        assert!(EncoderSpec::from_config(&gelu_new).is_err());
    }
}
