//! `config.json` of a Hugging Face model folder, validated into a [`ModelSpec`] in one step.
//!
//! Only what the engine can serve passes: decoders with gated MLPs, RMSNorm, rotary embeddings
//! (plain, `linear`, `llama3` or `longrope` scaling, GGUF's per-frequency factors, over the whole
//! head or its leading part) and grouped-query
//! attention, in the families [`super::architecture`] describes (`llama`, `mistral`, `qwen2`,
//! `qwen3`, `gemma2`, `gemma3_text`, `phi3`). Anything else is an error that names what is
//! unsupported.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::ModelError;
use super::architecture::Architecture;

/// The architectures this engine serves (`model_type` in `config.json`).
pub const SUPPORTED_TYPES: [&str; 8] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "phi3",
];

/// How rotary frequencies are scaled for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Scale of the low frequencies.
        factor: f32,
        /// Wavelengths above `original / low_freq_factor` are scaled fully.
        low_freq_factor: f32,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context the model was trained on before extension.
        original_max_position: f32,
    },
    /// Each inverse frequency divided by its own factor (GGUF's `rope_freqs.weight`, which is
    /// how llama.cpp's converter carries Llama 3 scaling: one factor per rotated pair).
    Factors(Vec<f32>),
    /// Phi-3's LongRoPE: per-pair factors, `short` for a context within the trained one and
    /// `long` beyond it, and cosines and sines scaled by `attention_factor`.
    LongRope {
        /// Factors for a served context within `original_max_position`.
        short: Vec<f32>,
        /// Factors for a longer served context.
        long: Vec<f32>,
        /// The context the model was trained on before extension.
        original_max_position: usize,
        /// Scale of the cosines and sines (so of attention scores, squared).
        attention_factor: f32,
    },
}

/// The validated shape of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// `model_type`.
    pub model_type: String,
    /// Embedding width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// How many of a head's leading values rotate (`head_dim` unless `partial_rotary_factor`
    /// says less); the rest pass through.
    pub rotary_dim: usize,
    /// Rows of the embedding matrix.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Context window the engine serves (`max_position_embeddings`, capped by a sliding window
    /// and by the engine's settings before a device opens: LongRoPE picks its factors by it).
    pub max_context: usize,
    /// The output projection is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// What the family does beyond Llama's pass.
    pub arch: Architecture,
    /// End-of-sequence ids from `config.json` (the folder's `generation_config.json` may add more).
    pub eos_token_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<Value>,
    /// Newer `transformers` write the RoPE settings (theta included) here.
    #[serde(default)]
    rope_parameters: Option<Value>,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    hidden_activation: Option<String>,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    eos_token_id: Option<Value>,
}

fn default_eps() -> f64 {
    1e-6
}

/// The language model's config of a multimodal Gemma 3 folder. `transformers` writes a nested
/// config as its difference from that class's defaults, so the defaults of `Gemma3TextConfig`
/// fill what is left out.
fn gemma3_language_model(mut doc: Value) -> Value {
    let mut text = serde_json::json!({
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "tie_word_embeddings": true,
    });
    let eos = doc["eos_token_id"].take();
    if let (Some(text), Some(given)) = (text.as_object_mut(), doc["text_config"].as_object()) {
        text.extend(given.clone());
        // Newer `transformers` write the rotary bases in `rope_parameters`, which then rule.
        if given.contains_key("rope_parameters") {
            text.remove("rope_theta");
            text.remove("rope_local_base_freq");
        }
        text.insert("model_type".into(), "gemma3_text".into());
        if !given.contains_key("eos_token_id") {
            text.insert("eos_token_id".into(), eos);
        }
    }
    text
}

fn default_max_positions() -> usize {
    2048
}

/// Token ids from a number or a list of numbers.
pub fn token_ids(value: &Value) -> Vec<u32> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        Value::Array(items) => items.iter().flat_map(token_ids).collect(),
        _ => Vec::new(),
    }
}

impl ModelSpec {
    /// Reads and validates `folder/config.json`.
    pub fn from_folder(folder: &Path) -> Result<Self, ModelError> {
        let path = folder.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        Self::from_json(&text)
    }

    /// Validates the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let mut doc: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        // A multimodal Gemma 3 folder: its language model is served (text in, text out); the
        // vision tower's weights stay unread.
        if doc["model_type"] == "gemma3" && doc["text_config"].is_object() {
            doc = gemma3_language_model(doc);
        }
        let raw: RawConfig = serde_json::from_value(doc.clone())
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        let model_type = raw.model_type.clone().unwrap_or_default();
        if !SUPPORTED_TYPES.contains(&model_type.as_str()) {
            return Err(ModelError::Unsupported(format!(
                "model_type `{model_type}` (this engine serves {})",
                SUPPORTED_TYPES.join(", ")
            )));
        }
        let gemma = model_type.starts_with("gemma");
        let act = raw
            .hidden_activation
            .as_deref()
            .or(raw.hidden_act.as_deref());
        let expected = if gemma { "gelu_pytorch_tanh" } else { "silu" };
        if let Some(act) = act.filter(|a| *a != expected) {
            return Err(ModelError::Unsupported(format!(
                "hidden_act `{act}` (`{model_type}` runs `{expected}`)"
            )));
        }
        if raw.mlp_bias {
            return Err(ModelError::Unsupported("mlp_bias = true".into()));
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let positive = [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("num_key_value_heads", num_kv_heads),
            ("vocab_size", raw.vocab_size),
            ("max_position_embeddings", raw.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ModelError::Config(format!("{name} must be positive")));
        }
        if !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(ModelError::Config(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({num_kv_heads})",
                raw.num_attention_heads
            )));
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ModelError::Config(format!(
                "head_dim must be even and positive, got {head_dim}"
            )));
        }
        // Gemma 3 writes one set of rotary settings per layer kind; the global layers' set is
        // the model's (the sliding layers' base is in its `Architecture`).
        let rope = raw
            .rope_parameters
            .as_ref()
            .map(|r| r.get("full_attention").unwrap_or(r))
            .or(raw.rope_scaling.as_ref());
        let partial = rope
            .and_then(|r| r["partial_rotary_factor"].as_f64())
            .or_else(|| doc["partial_rotary_factor"].as_f64())
            .unwrap_or(1.0);
        // As `transformers` sizes it: the factor's share of the head, truncated.
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if !(0.0..=1.0).contains(&partial) || rotary_dim < 2 || !rotary_dim.is_multiple_of(2) {
            return Err(ModelError::Config(format!(
                "partial_rotary_factor {partial} leaves {rotary_dim} rotated values of {head_dim}: an even number from 2 is needed"
            )));
        }
        let rope_theta = raw
            .rope_theta
            .or_else(|| rope.and_then(|r| r["rope_theta"].as_f64()))
            .unwrap_or(10_000.0);
        let rope_scaling = rope_scaling(rope, raw.max_position_embeddings)?;
        let pairs = rotary_dim / 2;
        let bad = |factors: &[f32]| {
            factors.len() != pairs || factors.iter().any(|f| f.is_nan() || *f <= 0.0)
        };
        let wrong = match &rope_scaling {
            RopeScaling::Factors(factors) => bad(factors).then_some(factors.len()),
            RopeScaling::LongRope { short, long, .. } => {
                (bad(short) || bad(long)).then_some(short.len().min(long.len()))
            }
            _ => None,
        };
        if let Some(got) = wrong {
            return Err(ModelError::Config(format!(
                "rotary frequency factors: {pairs} positive values needed (one per rotated pair), got {got}"
            )));
        }
        // Qwen2's window, where used, caps the context (its lower layers attend to all of it);
        // the other families' windows are per layer (see `Architecture`).
        let window = match (model_type.as_str(), raw.use_sliding_window) {
            ("qwen2" | "qwen3", Some(true)) => raw.sliding_window,
            _ => None,
        };
        let mut arch = Architecture::from_config(
            &model_type,
            &doc,
            raw.num_hidden_layers,
            head_dim,
            raw.hidden_size,
        )?;
        if model_type == "phi3" {
            arch.windows = vec![raw.sliding_window.filter(|&w| w > 0); raw.num_hidden_layers];
        }
        let max_context = window.map_or(raw.max_position_embeddings, |w| {
            w.min(raw.max_position_embeddings)
        });
        Ok(Self {
            arch,
            model_type,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope_theta: rope_theta as f32,
            rope_scaling,
            max_context,
            tie_word_embeddings: raw.tie_word_embeddings,
            eos_token_ids: raw.eos_token_id.as_ref().map(token_ids).unwrap_or_default(),
        })
    }

    /// The shape of an encoder, for what sizes a model by its shape (the scheduler, stats);
    /// an encoder runs on its own device, never a decoder's pass.
    pub fn of_encoder(encoder: &super::encoder::EncoderSpec) -> Self {
        let head_dim = encoder.head_dim();
        Self {
            model_type: encoder.model_type.clone(),
            hidden_size: encoder.hidden_size,
            intermediate_size: encoder.intermediate_size,
            num_layers: encoder.num_layers,
            num_heads: encoder.num_heads,
            num_kv_heads: encoder.num_heads,
            head_dim,
            rotary_dim: head_dim,
            vocab_size: encoder.vocab_size,
            rms_norm_eps: encoder.eps,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::None,
            max_context: encoder.max_positions,
            tie_word_embeddings: true,
            arch: Architecture::llama(encoder.num_layers, head_dim),
            eos_token_ids: Vec::new(),
        }
    }

    /// Key and value cache entries per token (every layer).
    pub fn kv_values_per_token(&self) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim
    }

    /// Weights a decoding step reads: every layer's products and the head.
    pub fn step_weights(&self) -> usize {
        let d = self.hidden_size;
        let attention = d * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
            + self.num_heads * self.head_dim * d;
        let mlp = 3 * d * self.intermediate_size;
        self.num_layers * (attention + mlp) + self.vocab_size * d
    }
}

fn rope_scaling(value: Option<&Value>, max_positions: usize) -> Result<RopeScaling, ModelError> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = v["rope_type"].as_str().or_else(|| v["type"].as_str());
    let num = |key: &str| -> Result<f32, ModelError> {
        v[key].as_f64().map(|x| x as f32).ok_or_else(|| {
            ModelError::Config(format!("rope scaling `{key}` is missing or not a number"))
        })
    };
    let list = |key: &str| -> Vec<f32> {
        v[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_f64)
                    .map(|x| x as f32)
                    .collect()
            })
            .unwrap_or_default()
    };
    match kind {
        None | Some("default") => Ok(RopeScaling::None),
        Some("linear") => Ok(RopeScaling::Linear {
            factor: num("factor")?,
        }),
        Some("llama3") => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position: num("original_max_position_embeddings")?,
        }),
        Some("frequency_factors") => Ok(RopeScaling::Factors(list("factors"))),
        Some("longrope" | "su") => {
            let original = num("original_max_position_embeddings")? as usize;
            if original == 0 {
                return Err(ModelError::Config(
                    "rope scaling `original_max_position_embeddings` must be positive".into(),
                ));
            }
            // As `transformers`: the given factor, else the extension's ratio, sets the
            // default attention factor.
            let factor = v["factor"]
                .as_f64()
                .unwrap_or(max_positions as f64 / original as f64);
            let attention_factor = match v["attention_factor"].as_f64() {
                Some(given) => given,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short: list("short_factor"),
                long: list("long_factor"),
                original_max_position: original,
                attention_factor: attention_factor as f32,
            })
        }
        Some(other) => Err(ModelError::Unsupported(format!(
            "rope scaling `{other}` (supported: linear, llama3, longrope)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 100, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
        "eos_token_id": [1, 4]}"#;

    #[test]
    fn llama_config_validates() {
        let spec = ModelSpec::from_json(LLAMA).expect("valid");
        assert_eq!(spec.head_dim, 16);
        assert_eq!(spec.eos_token_ids, vec![1, 4]);
        assert!(matches!(spec.rope_scaling, RopeScaling::Llama3 { .. }));
    }

    #[test]
    fn unsupported_configs_name_what_is_unsupported() {
        let cases = [
            (LLAMA.replace("\"llama\"", "\"gpt2\""), "gpt2"),
            (LLAMA.replace("\"llama3\"", "\"yarn\""), "yarn"),
            (
                LLAMA.replace("\"vocab_size\"", "\"hidden_act\": \"gelu\", \"vocab_size\""),
                "gelu",
            ),
        ];
        for (text, word) in cases {
            let err = ModelSpec::from_json(&text)
                .expect_err("refused")
                .to_string();
            assert!(err.contains(word), "{err}");
        }
    }

    #[test]
    fn mistral_window_is_kept_per_layer() {
        let text = LLAMA
            .replace("\"llama\"", "\"mistral\"")
            .replace("\"vocab_size\"", "\"sliding_window\": 64, \"vocab_size\"");
        let spec = ModelSpec::from_json(&text).expect("mistral");
        assert_eq!(spec.max_context, 2048);
        assert_eq!(spec.arch.windows, vec![Some(64); 2]);
    }

    #[test]
    fn phi4_mini_rotates_part_of_each_head_with_longrope() {
        let factors = |f: f32| format!("[{}]", vec![f.to_string(); 6].join(", "));
        let text = format!(
            r#"{{"model_type": "phi3", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
            "max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
            "rope_scaling": {{"type": "longrope", "original_max_position_embeddings": 256,
            "short_factor": {}, "long_factor": {}}}}}"#,
            factors(1.5),
            factors(4.0)
        );
        let mut spec = ModelSpec::from_json(&text).expect("phi4-mini");
        assert_eq!((spec.head_dim, spec.rotary_dim), (16, 12));
        let RopeScaling::LongRope {
            attention_factor, ..
        } = spec.rope_scaling
        else {
            panic!("{:?}", spec.rope_scaling);
        };
        // sqrt(1 + ln(4096 / 256) / ln(256)) as transformers computes it.
        assert!((attention_factor - 1.224_745).abs() < 1e-5);
        let long = crate::model::RotaryTables::new(&spec);
        spec.max_context = 256;
        let short = crate::model::RotaryTables::new(&spec);
        assert_eq!(long.global.len(), 6);
        assert!((short.global[1] / long.global[1] - 4.0 / 1.5).abs() < 1e-5);
        assert_eq!(long.global_scale, attention_factor);

        let wrong = text.replace("0.75", "0.7");
        let err = ModelSpec::from_json(&wrong)
            .expect_err("5.6 values")
            .to_string();
        assert!(err.contains("partial_rotary_factor"), "{err}");
    }

    #[test]
    fn a_multimodal_gemma3_folder_is_its_language_model_with_its_class_defaults() {
        let text = r#"{"model_type": "gemma3", "eos_token_id": [1, 106],
            "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
            "intermediate_size": 10240, "num_hidden_layers": 34, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
            "vision_config": {"model_type": "siglip_vision_model"}}"#;
        let spec = ModelSpec::from_json(text).expect("gemma 3 4b");
        assert_eq!(spec.model_type, "gemma3_text");
        assert_eq!(
            (spec.num_heads, spec.num_kv_heads, spec.head_dim),
            (8, 4, 256)
        );
        assert_eq!(spec.vocab_size, 262_208);
        assert_eq!(spec.rope_theta, 1_000_000.0);
        assert_eq!(spec.arch.local_rope_theta, Some(10_000.0));
        assert_eq!(spec.eos_token_ids, vec![1, 106]);
        assert!(spec.tie_word_embeddings);
        assert_eq!(spec.arch.windows[5], None);
        assert_eq!(spec.arch.windows[0], Some(1024));
    }
}
