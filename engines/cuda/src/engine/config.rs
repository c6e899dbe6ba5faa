//! The engine's configuration (the JSON document `create` receives), validated in one step.
//! Unknown keys are refused.

use std::path::PathBuf;

use serde::Deserialize;

/// Which device runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// CUDA when a driver and a GPU are present, else the CPU.
    Auto,
    /// The GPU; an error where there is none.
    Cuda,
    /// The CPU.
    Cpu,
}

/// How much memory the KV cache may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// A number of bytes.
    Bytes(u64),
    /// A fraction of the memory available when the engine starts.
    Fraction(f64),
    /// Enough for `max_running` full contexts, at most a quarter of the available memory.
    Auto,
}

/// One model the engine serves.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSettings {
    /// The id clients name.
    pub id: String,
    /// The Hugging Face model folder.
    pub path: PathBuf,
    /// Who publishes it (for `/v1/models`).
    pub owned_by: Option<String>,
    /// Which device runs it.
    pub device: DeviceChoice,
    /// Tokens per KV block.
    pub block_size: u32,
    /// The KV cache's memory.
    pub kv_cache: KvBudget,
    /// Tokens computed per step at most.
    pub max_batch_tokens: usize,
    /// Sequences running at once at most.
    pub max_running: usize,
    /// Requests waiting at most; more are refused as overloaded.
    pub max_waiting: usize,
    /// Largest `n`.
    pub max_n: u32,
    /// Context window; the model's when absent.
    pub max_context: Option<usize>,
    /// CPU threads; every core when absent.
    pub threads: Option<usize>,
    /// The CPU's inputs to products with 4- and 8-bit weights.
    pub cpu_activations: crate::cpu::Activations,
    /// What the CPU does with an encoder's float weights.
    pub cpu_weights: crate::cpu::FloatWeights,
    /// Which GPU (CUDA device ordinal).
    pub gpu: usize,
    /// Capture decode steps into CUDA graphs.
    pub cuda_graphs: bool,
    /// Append the tokens a grammar forces without sampling each (fast-forward).
    pub grammar_fast_forward: bool,
    /// Speculative decoding by prompt lookup; off when absent.
    pub speculative: Option<crate::speculative::SpeculativeSettings>,
    /// KV-cache events in vLLM's format over ZeroMQ; off when absent.
    pub kv_events: Option<crate::kv::events::KvEventsSettings>,
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// The models.
    pub models: Vec<ModelSettings>,
    /// Seed for requests that bring none; random when absent.
    pub seed: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    models: Vec<RawModel>,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    id: String,
    path: PathBuf,
    #[serde(default)]
    owned_by: Option<String>,
    #[serde(default)]
    device: Option<DeviceChoice>,
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    kv_cache_bytes: Option<u64>,
    #[serde(default)]
    kv_cache_fraction: Option<f64>,
    #[serde(default)]
    max_batch_tokens: Option<usize>,
    #[serde(default)]
    max_running: Option<usize>,
    #[serde(default)]
    max_waiting: Option<usize>,
    #[serde(default)]
    max_n: Option<u32>,
    #[serde(default)]
    max_context: Option<usize>,
    #[serde(default)]
    threads: Option<usize>,
    #[serde(default)]
    cpu_activations: Option<crate::cpu::Activations>,
    #[serde(default)]
    cpu_weights: Option<crate::cpu::FloatWeights>,
    #[serde(default)]
    gpu: Option<usize>,
    #[serde(default)]
    cuda_graphs: Option<bool>,
    #[serde(default)]
    grammar_fast_forward: Option<bool>,
    #[serde(default)]
    speculative: Option<crate::speculative::SpeculativeSettings>,
    #[serde(default)]
    kv_events: Option<crate::kv::events::KvEventsSettings>,
}

impl EngineSettings {
    /// Parses and validates; the error is one line naming the bad key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawSettings = turnpike_engine_api::json::from_json_object(text)?;
        if raw.models.is_empty() {
            return Err("`models` is empty: name at least one model folder".into());
        }
        let mut models = Vec::with_capacity(raw.models.len());
        for m in raw.models {
            let id = m.id.clone();
            if models.iter().any(|s: &ModelSettings| s.id == id) {
                return Err(format!("model `{id}` is listed twice"));
            }
            models.push(m.validate().map_err(|e| format!("model `{id}`: {e}"))?);
        }
        Ok(Self {
            models,
            seed: raw.seed,
        })
    }
}

impl RawModel {
    fn validate(self) -> Result<ModelSettings, String> {
        if self.id.trim().is_empty() {
            return Err("`id` is empty".into());
        }
        let kv_cache = match (self.kv_cache_bytes, self.kv_cache_fraction) {
            (Some(_), Some(_)) => {
                return Err("give kv_cache_bytes or kv_cache_fraction, not both".into());
            }
            (Some(b), None) => KvBudget::Bytes(b),
            (None, Some(f)) if f > 0.0 && f <= 1.0 => KvBudget::Fraction(f),
            (None, Some(f)) => return Err(format!("kv_cache_fraction must be in (0, 1], got {f}")),
            (None, None) => KvBudget::Auto,
        };
        let block_size = self.block_size.unwrap_or(16);
        if !(1..=1024).contains(&block_size) {
            return Err(format!("block_size must be in 1..=1024, got {block_size}"));
        }
        let max_running = self.max_running.unwrap_or(64);
        let max_batch_tokens = self.max_batch_tokens.unwrap_or(512);
        if max_running == 0 || max_batch_tokens < max_running {
            return Err(format!(
                "max_batch_tokens ({max_batch_tokens}) must be at least max_running ({max_running}), which must be positive"
            ));
        }
        let max_n = self.max_n.unwrap_or(8);
        if max_n == 0 {
            return Err("max_n must be positive".into());
        }
        // Every choice of every running request decodes a token each step; a smaller budget
        // would leave the last choices waiting behind the first.
        let decodes = max_running.saturating_mul(max_n as usize);
        if max_batch_tokens < decodes {
            return Err(format!(
                "max_batch_tokens ({max_batch_tokens}) must be at least max_running × max_n ({max_running} × {max_n} = {decodes})"
            ));
        }
        if self.threads == Some(0) || self.max_context == Some(0) {
            return Err("threads and max_context must be positive".into());
        }
        if let Some(speculative) = &self.speculative {
            speculative.validate()?;
        }
        Ok(ModelSettings {
            id: self.id,
            path: self.path,
            owned_by: self.owned_by,
            device: self.device.unwrap_or(DeviceChoice::Auto),
            block_size,
            kv_cache,
            max_batch_tokens,
            max_running,
            max_waiting: self.max_waiting.unwrap_or(1024),
            max_n,
            max_context: self.max_context,
            threads: self.threads,
            cpu_activations: self.cpu_activations.unwrap_or_default(),
            cpu_weights: self.cpu_weights.unwrap_or_default(),
            gpu: self.gpu.unwrap_or(0),
            cuda_graphs: self.cuda_graphs.unwrap_or(true),
            grammar_fast_forward: self.grammar_fast_forward.unwrap_or(true),
            speculative: self.speculative.filter(|s| s.tokens > 0),
            kv_events: self.kv_events,
        })
    }
}

/// Memory available to the process now (`MemAvailable`), in bytes.
pub(crate) fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let ok = EngineSettings::parse(r#"{"models": [{"id": "m", "path": "/x"}]}"#);
        let m = &ok.expect("valid").models[0];
        assert_eq!(
            (m.block_size, m.device, m.kv_cache),
            (16, DeviceChoice::Auto, KvBudget::Auto)
        );
        for (bad, word) in [
            (
                r#"{"models": [{"id": "m", "path": "/x", "devise": "cpu"}]}"#,
                "devise",
            ),
            (
                r#"{"models": [{"id": "m", "path": "/x", "device": "tpu"}]}"#,
                "tpu",
            ),
            (r#"{"models": []}"#, "empty"),
            (
                r#"{"models": [{"id": "m", "path": "/x", "max_running": 9, "max_batch_tokens": 4}]}"#,
                "max_batch_tokens",
            ),
            (
                r#"{"models": [{"id": "m", "path": "/x", "kv_cache_fraction": 2}]}"#,
                "fraction",
            ),
            (
                r#"{"models": [{"id": "m", "path": "/x", "max_running": 64, "max_batch_tokens": 256}]}"#,
                "max_n",
            ),
            (
                r#"{"models": [{"id": "m", "path": "/x", "speculative": {"min_ngram": 0}}]}"#,
                "min_ngram",
            ),
            (
                r#"{"models": [{"id": "m", "path": "/x", "speculative": {"token": 3}}]}"#,
                "token",
            ),
        ] {
            let err = EngineSettings::parse(bad).expect_err(bad);
            assert!(err.contains(word), "{err}");
        }
    }
}
