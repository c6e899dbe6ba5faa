//! The plugin's configuration (a JSON document given to `create`); unknown keys are refused and
//! every error names its key.

use serde::Deserialize;
use turnpike_engine_api::json::from_json_object;

use crate::cached::{KvEventsConfig, RawKvEvents};
use crate::discovery::Membership;
use crate::wire::Protocol;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    models: Vec<RawModel>,
    #[serde(default = "default_timeout_ms")]
    connect_timeout_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    id: String,
    #[serde(default)]
    upstream_model: Option<String>,
    #[serde(default)]
    protocol: Protocol,
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    endpoints_file: Option<String>,
    #[serde(default)]
    resolve: bool,
    #[serde(default = "default_refresh_ms")]
    refresh_ms: u64,
    vocab_size: u32,
    eos_token_ids: Vec<u32>,
    #[serde(default)]
    tokenizer: Option<String>,
    #[serde(default = "default_context")]
    max_context: u32,
    #[serde(default = "default_max_n")]
    max_n: u32,
    #[serde(default)]
    grammar: bool,
    #[serde(default)]
    speculative: bool,
    #[serde(default = "default_block")]
    affinity_tokens: usize,
    #[serde(default = "default_imbalance")]
    affinity_max_imbalance: u32,
    #[serde(default = "default_retries")]
    retries: u32,
    #[serde(default)]
    breaker: RawBreaker,
    #[serde(default = "default_health_ms")]
    health_interval_ms: u64,
    #[serde(default = "default_first_token_ms")]
    first_token_timeout_ms: u64,
    #[serde(default = "default_stall_ms")]
    stall_timeout_ms: u64,
    #[serde(default = "default_failover")]
    mid_stream_failover: bool,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default)]
    picker: Option<String>,
    #[serde(default = "default_picker_timeout_ms")]
    picker_timeout_ms: u64,
    #[serde(default)]
    kv_events: Option<RawKvEvents>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    #[serde(default = "default_failures")]
    failures: u32,
    #[serde(default = "default_cooldown_ms")]
    cooldown_ms: u64,
}

impl Default for RawBreaker {
    fn default() -> Self {
        Self {
            failures: default_failures(),
            cooldown_ms: default_cooldown_ms(),
        }
    }
}

fn default_timeout_ms() -> u64 {
    2000
}
fn default_context() -> u32 {
    8192
}
fn default_max_n() -> u32 {
    16
}
pub(crate) fn default_block() -> usize {
    64
}
pub(crate) fn default_imbalance() -> u32 {
    8
}
fn default_retries() -> u32 {
    2
}
fn default_health_ms() -> u64 {
    5000
}
pub(crate) fn default_refresh_ms() -> u64 {
    5000
}
fn default_first_token_ms() -> u64 {
    30_000
}
fn default_stall_ms() -> u64 {
    30_000
}
fn default_failover() -> bool {
    true
}
fn default_picker_timeout_ms() -> u64 {
    100
}
fn default_failures() -> u32 {
    3
}
pub(crate) fn default_cooldown_ms() -> u64 {
    5000
}

/// One served model and its pool.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelConfig {
    /// The model's id here.
    pub id: String,
    /// Its name on the nodes (`model` in their requests; not sent when absent: a node that
    /// serves one model takes it, and SGLang refuses unknown keys).
    pub upstream_model: Option<String>,
    /// The interface the nodes speak.
    pub protocol: Protocol,
    /// Where the nodes come from.
    pub members: Membership,
    pub vocab_size: u32,
    pub eos_token_ids: Vec<u32>,
    pub tokenizer: Option<String>,
    pub max_context: u32,
    pub max_n: u32,
    /// The nodes constrain output by grammar (Turnpike nodes and SGLang do).
    pub grammar: bool,
    /// The nodes decode speculatively and take a request's `num_assistant_tokens` and
    /// `assistant_confidence_threshold` (Turnpike nodes that speculate).
    pub speculative: bool,
    /// Leading prompt tokens that pick a replica by affinity (0: load only).
    pub affinity_tokens: usize,
    /// How many more requests than the least-loaded replica the affine one may hold.
    pub affinity_max_imbalance: u32,
    /// Other replicas tried after a failure before the first token.
    pub retries: u32,
    /// Consecutive failures that open a replica's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before one probe.
    pub breaker_cooldown_ms: u64,
    /// How often each replica's `/health` is probed (0: never).
    pub health_interval_ms: u64,
    /// Longest wait from sending a request to its first token (0: none); past it the replica
    /// counts a failure and another one is tried.
    pub first_token_timeout_ms: u64,
    /// Longest silence between chunks once tokens flow (0: none); past it the replica counts a
    /// failure and the request goes on elsewhere (or ends, without `mid_stream_failover`).
    pub stall_timeout_ms: u64,
    /// A replica that fails after tokens were sent hands each unfinished choice, with the
    /// tokens it delivered, to another replica, and the stream goes on (see `run`).
    pub mid_stream_failover: bool,
    /// The bearer key sent to the nodes (their `Authorization`), read from the environment
    /// variable `api_key_env` at start: a key whose endpoints name `generate`.
    pub api_key: Option<ApiKey>,
    /// An external endpoint picker (`http://host:port`, Envoy's `ext_proc`) asked which
    /// replica takes each request; the plugin chooses itself when it cannot answer.
    pub picker: Option<String>,
    /// How long the picker may take to answer before the plugin chooses.
    pub picker_timeout_ms: u64,
    /// The replicas' KV events, followed to route by the blocks they hold.
    pub kv_events: Option<KvEventsConfig>,
}

/// A key sent to nodes; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    pub models: Vec<ModelConfig>,
    pub connect_timeout_ms: u64,
}

impl Config {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let raw: RawConfig = from_json_object(text).map_err(|e| format!("upstream config: {e}"))?;
        if raw.models.is_empty() {
            return Err("upstream config: models must not be empty".into());
        }
        let mut models = Vec::with_capacity(raw.models.len());
        for m in raw.models {
            let at = format!("upstream config: models.{}", m.id);
            if m.endpoints.is_empty() && m.endpoints_file.is_none() {
                return Err(format!("{at}: give endpoints or endpoints_file"));
            }
            for e in &m.endpoints {
                base_url(e).map_err(|why| format!("{at}.endpoints: {why}"))?;
            }
            if m.refresh_ms < 100 {
                return Err(format!("{at}.refresh_ms must be at least 100"));
            }
            let max_n = m.protocol.max_n().map_or(m.max_n, |most| m.max_n.min(most));
            if m.eos_token_ids.is_empty() || m.eos_token_ids.iter().any(|&t| t >= m.vocab_size) {
                return Err(format!("{at}.eos_token_ids must be ids below vocab_size"));
            }
            if m.speculative && !m.protocol.carries_drafts() {
                return Err(format!(
                    "{at}.speculative: the {:?} protocol carries no per-request speculation",
                    m.protocol
                ));
            }
            if let Some(url) = &m.picker {
                base_url(url).map_err(|why| format!("{at}.picker: {why}"))?;
            }
            let kv_events = m
                .kv_events
                .map(RawKvEvents::validate)
                .transpose()
                .map_err(|why| format!("{at}.kv_events: {why}"))?;
            if m.breaker.failures == 0 {
                return Err(format!("{at}.breaker.failures must be at least 1"));
            }
            let api_key = match &m.api_key_env {
                None => None,
                Some(var) => Some(ApiKey(
                    std::env::var(var)
                        .ok()
                        .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic()))
                        .ok_or_else(|| format!("{at}.api_key_env: `{var}` is not set to a key"))?,
                )),
            };
            models.push(ModelConfig {
                upstream_model: m.upstream_model,
                protocol: m.protocol,
                members: Membership {
                    endpoints: m
                        .endpoints
                        .iter()
                        .map(|e| e.trim_end_matches('/').to_string())
                        .collect(),
                    endpoints_file: m.endpoints_file,
                    resolve: m.resolve,
                    refresh_ms: m.refresh_ms,
                },
                id: m.id,
                vocab_size: m.vocab_size,
                eos_token_ids: m.eos_token_ids,
                tokenizer: m.tokenizer,
                max_context: m.max_context,
                max_n: max_n.max(1),
                grammar: m.grammar,
                speculative: m.speculative,
                affinity_tokens: m.affinity_tokens,
                affinity_max_imbalance: m.affinity_max_imbalance,
                retries: m.retries,
                breaker_failures: m.breaker.failures,
                breaker_cooldown_ms: m.breaker.cooldown_ms,
                health_interval_ms: m.health_interval_ms,
                first_token_timeout_ms: m.first_token_timeout_ms,
                stall_timeout_ms: m.stall_timeout_ms,
                mid_stream_failover: m.mid_stream_failover,
                api_key,
                picker: m.picker.map(|u| u.trim_end_matches('/').to_string()),
                picker_timeout_ms: m.picker_timeout_ms.max(1),
                kv_events,
            });
        }
        Ok(Self {
            models,
            connect_timeout_ms: raw.connect_timeout_ms,
        })
    }
}

/// Checks a node's base URL: `http://host[:port]`, nothing after.
pub(crate) fn base_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("`{url}` is not an http:// URL"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', ' ', '@']) {
        return Err(format!("`{url}` is not a base URL (http://host:port)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(protocol: &str, speculative: bool) -> String {
        format!(
            r#"{{"models": [{{"id": "m", "protocol": "{protocol}", "endpoints": ["http://127.0.0.1:1"],
                "vocab_size": 10, "eos_token_ids": [1], "speculative": {speculative}}}]}}"#
        )
    }

    #[test]
    fn speculation_is_declared_only_where_the_protocol_carries_it() {
        for protocol in ["sglang", "turnpike"] {
            let parsed = Config::parse(&model(protocol, true));
            assert!(parsed.is_ok_and(|c| c.models[0].speculative), "{protocol}");
        }
        for protocol in ["vllm", "llama_cpp"] {
            let refused = Config::parse(&model(protocol, true)).err();
            assert!(
                refused.is_some_and(|e| e.contains("speculative")),
                "{protocol} carries no per-request speculation"
            );
        }
        assert!(Config::parse(&model("vllm", false)).is_ok());
    }
}
