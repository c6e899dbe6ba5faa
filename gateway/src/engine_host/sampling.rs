//! The sampling a model's makers recommend: its folder's `generation_config.json`
//! (`temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`), as vLLM reads it. A request
//! that leaves a setting unset gets the model's value, else the gateway's `[defaults]`; a value
//! outside the range a request may ask for is ignored.

use serde_json::Value;

/// What a model's generation config recommends.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelSampling {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k` (0: off).
    pub top_k: Option<u32>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f64>,
}

impl ModelSampling {
    /// The recommendations in a `generation_config.json`.
    pub fn from_generation_config(config: &Value) -> Self {
        let within = |key: &str, low: f64, high: f64| {
            config[key]
                .as_f64()
                .filter(|v| v.is_finite() && (low..=high).contains(v))
        };
        Self {
            temperature: within("temperature", 0.0, 2.0),
            top_p: within("top_p", 0.0, 1.0).filter(|p| *p > 0.0),
            top_k: config["top_k"]
                .as_i64()
                .filter(|k| (-1..=1 << 20).contains(k))
                .map(|k| k.max(0) as u32),
            min_p: within("min_p", 0.0, 1.0),
            repetition_penalty: within("repetition_penalty", 0.01, 10.0),
        }
    }

    /// Whether it recommends anything.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recommendations_are_read_and_out_of_range_ones_ignored() {
        let qwen = json!({"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05});
        let s = ModelSampling::from_generation_config(&qwen);
        assert_eq!(
            s,
            ModelSampling {
                temperature: Some(0.7),
                top_p: Some(0.8),
                top_k: Some(20),
                min_p: None,
                repetition_penalty: Some(1.05)
            }
        );
        let odd = json!({"temperature": 9.0, "top_p": 0.0, "top_k": -1, "min_p": "x"});
        let s = ModelSampling::from_generation_config(&odd);
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p),
            (None, None, Some(0), None)
        );
        assert!(ModelSampling::from_generation_config(&json!({"eos_token_id": 2})).is_empty());
    }
}
