//! What distinguishes one decoder family from another, as data: the devices run one forward
//! pass and read these switches, so a new family is a new description, not a new pass.
//!
//! | family | what it sets |
//! |---|---|
//! | Llama, Mistral, Qwen2 | nothing (Mistral: a sliding window on every layer) |
//! | Qwen3 | RMSNorm of each query and key head |
//! | Gemma 2 | GeLU (tanh) gating, norms after attention and after the MLP, norms scaled by `1 + w`, embeddings scaled by √hidden, attention and final logits soft-capped, every other layer a sliding window, scores scaled by `query_pre_attn_scalar^-½` |
//! | Gemma 3 | as Gemma 2 with q/k norms and no soft-capping; five sliding layers to each global one, the sliding ones with their own rotary base |
//! | Phi-3 | nothing beyond Llama's (its fused q/k/v and gate/up matrices are read as they are) |

use serde_json::Value;

use super::ModelError;

/// The activation of the gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up`.
    Silu,
    /// `gelu_tanh(gate) · up` (GeGLU with the tanh approximation).
    GeluTanh,
}

/// A family's switches (see the module's table).
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// The MLP's activation.
    pub activation: Activation,
    /// Added to every norm weight at load (Gemma's checkpoints store `w` for a scale of
    /// `1 + w`; llama.cpp's converter has already added it).
    pub norm_offset: f32,
    /// Each query and key head is RMS-normalised before rotation.
    pub qk_norm: bool,
    /// Norms on the attention output and on the MLP output, before each joins the residual.
    pub sandwich_norms: bool,
    /// The embedding rows are multiplied by this.
    pub embed_scale: Option<f32>,
    /// Attention scores are multiplied by this (`1/√head_dim` unless the family says).
    pub attn_scale: f32,
    /// Attention scores become `cap · tanh(score / cap)`.
    pub attn_softcap: Option<f32>,
    /// Output logits become `cap · tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    /// Per layer: the positions a query sees (itself and the `w - 1` before it), or all.
    pub windows: Vec<Option<usize>>,
    /// The rotary base of the sliding layers, where it differs from the global layers' (whose
    /// scaling it does not share).
    pub local_rope_theta: Option<f32>,
}

impl Architecture {
    /// Llama's: SiLU gating, plain norms, `1/√head_dim`, no window.
    pub fn llama(layers: usize, head_dim: usize) -> Self {
        Self {
            activation: Activation::Silu,
            norm_offset: 0.0,
            qk_norm: false,
            sandwich_norms: false,
            embed_scale: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_softcap: None,
            final_softcap: None,
            windows: vec![None; layers],
            local_rope_theta: None,
        }
    }

    /// The description of `model_type` with the settings of `config` (a `config.json`).
    pub fn from_config(
        model_type: &str,
        config: &Value,
        layers: usize,
        head_dim: usize,
        hidden: usize,
    ) -> Result<Self, ModelError> {
        let mut arch = Self::llama(layers, head_dim);
        let float = |key: &str| config[key].as_f64().map(|v| v as f32);
        let window = config["sliding_window"].as_u64().map(|w| w as usize);
        match model_type {
            "llama" | "qwen2" | "phi3" => {}
            "mistral" => arch.windows = vec![window.filter(|&w| w > 0); layers],
            "qwen3" => arch.qk_norm = true,
            "gemma2" | "gemma3" | "gemma3_text" => {
                let gemma3 = model_type != "gemma2";
                arch.activation = Activation::GeluTanh;
                arch.norm_offset = 1.0;
                arch.qk_norm = gemma3;
                arch.sandwich_norms = true;
                arch.embed_scale = Some((hidden as f32).sqrt());
                if let Some(scalar) = float("query_pre_attn_scalar") {
                    arch.attn_scale = 1.0 / scalar.sqrt();
                }
                arch.attn_softcap = float("attn_logit_softcapping");
                arch.final_softcap = float("final_logit_softcapping");
                // Gemma 2 alternates from a sliding first layer; Gemma 3 makes every sixth
                // layer global. `layer_types`, where written, says it outright.
                let pattern = if gemma3 { 6 } else { 2 };
                let sliding: Vec<bool> = match config["layer_types"].as_array() {
                    Some(types) if types.len() == layers => types
                        .iter()
                        .map(|t| t.as_str() == Some("sliding_attention"))
                        .collect(),
                    _ => (0..layers).map(|l| (l + 1) % pattern != 0).collect(),
                };
                arch.windows = sliding
                    .iter()
                    .map(|&s| if s { window.filter(|&w| w > 0) } else { None })
                    .collect();
                if gemma3 {
                    arch.local_rope_theta = float("rope_local_base_freq")
                        .or_else(|| {
                            config["rope_parameters"]["sliding_attention"]["rope_theta"]
                                .as_f64()
                                .map(|v| v as f32)
                        })
                        .or(Some(10_000.0));
                }
            }
            other => {
                return Err(ModelError::Unsupported(format!("model_type `{other}`")));
            }
        }
        if let Some(cap) = [arch.attn_softcap, arch.final_softcap]
            .into_iter()
            .flatten()
            .find(|c| c.is_nan() || *c <= 0.0)
        {
            return Err(ModelError::Config(format!(
                "soft-capping must be positive, got {cap}"
            )));
        }
        Ok(arch)
    }

    /// Whether layer `layer` uses the sliding layers' rotary base.
    pub fn local_rope(&self, layer: usize) -> bool {
        self.local_rope_theta.is_some() && self.windows.get(layer).is_some_and(Option::is_some)
    }
}

/// `gelu` with the tanh approximation, in f32 as PyTorch computes it.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// `cap · tanh(x / cap)`.
#[inline]
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gemma_layers_alternate_and_gemma3_keeps_every_sixth_global() {
        let config = json!({"sliding_window": 16, "query_pre_attn_scalar": 64,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0});
        let g2 = Architecture::from_config("gemma2", &config, 4, 64, 256).expect("gemma2");
        assert_eq!(g2.windows, vec![Some(16), None, Some(16), None]);
        assert_eq!(g2.attn_scale, 0.125);
        assert_eq!(g2.embed_scale, Some(16.0));
        let g3 = Architecture::from_config("gemma3_text", &json!({"sliding_window": 8}), 7, 64, 64)
            .expect("gemma3");
        let global: Vec<usize> = (0..7).filter(|&l| g3.windows[l].is_none()).collect();
        assert_eq!(global, vec![5]);
        assert!(g3.local_rope(0) && !g3.local_rope(5));
    }
}
