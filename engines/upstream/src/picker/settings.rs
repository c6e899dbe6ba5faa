//! The picker's settings: a TOML file whose unknown keys are refused, every error naming its key.

use serde::Deserialize;

use crate::cached::{KvEventsConfig, RawKvEvents};
use crate::discovery::Membership;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    listen: String,
    #[serde(default)]
    metrics_listen: Option<String>,
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    endpoints_file: Option<String>,
    #[serde(default)]
    resolve: bool,
    #[serde(default = "crate::config::default_refresh_ms")]
    refresh_ms: u64,
    #[serde(default = "default_probe_ms")]
    probe_interval_ms: u64,
    #[serde(default = "default_probe_timeout_ms")]
    probe_timeout_ms: u64,
    #[serde(default = "default_queue_limit")]
    queue_limit: u32,
    #[serde(default = "default_kv_limit")]
    kv_cache_limit: f64,
    #[serde(default = "crate::config::default_block")]
    affinity_tokens: usize,
    #[serde(default = "crate::config::default_imbalance")]
    affinity_max_imbalance: u32,
    #[serde(default = "default_fallbacks")]
    fallbacks: usize,
    #[serde(default = "default_body")]
    max_body_bytes: usize,
    #[serde(default = "default_failures")]
    breaker_failures: u32,
    #[serde(default = "crate::config::default_cooldown_ms")]
    breaker_cooldown_ms: u64,
    #[serde(default)]
    kv_events: Option<RawKvEvents>,
}

fn default_probe_ms() -> u64 {
    1000
}
fn default_probe_timeout_ms() -> u64 {
    500
}
fn default_queue_limit() -> u32 {
    8
}
fn default_kv_limit() -> f64 {
    0.95
}
fn default_fallbacks() -> usize {
    2
}
fn default_body() -> usize {
    8 << 20
}
fn default_failures() -> u32 {
    2
}

/// The validated settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The gRPC listener (`ext_proc` and `grpc.health.v1`), `host:port`.
    pub listen: String,
    /// An HTTP listener for the picker's Prometheus page (`GET /metrics`); none when absent.
    pub metrics_listen: Option<String>,
    /// Where the model servers come from (base URLs; `ip:port` in the file is taken as one).
    pub(crate) members: Membership,
    /// How often each server's `/health` and `/metrics` are read.
    pub probe_interval_ms: u64,
    /// How long one probe may take.
    pub probe_timeout_ms: u64,
    /// Waiting requests (`vllm:num_requests_waiting`) at which a server counts as busy.
    pub queue_limit: u32,
    /// KV-cache use (`vllm:kv_cache_usage_perc`, 0..1) at which a server counts as busy.
    pub kv_cache_limit: f64,
    /// Leading prompt units (token ids, or four bytes of text each) that pick a server by
    /// affinity (0: load only).
    pub affinity_tokens: usize,
    /// How many more requests than the least-loaded server the affine one may hold.
    pub affinity_max_imbalance: u32,
    /// Endpoints named after the first, for the proxy's retries.
    pub fallbacks: usize,
    /// The largest request body read.
    pub max_body_bytes: usize,
    /// Consecutive failed probes or 5xx answers that take a server out.
    pub breaker_failures: u32,
    /// How long a server stays out before one request probes it.
    pub breaker_cooldown_ms: u64,
    /// The servers' KV events, followed to route token-id prompts to the server holding
    /// their blocks.
    pub(crate) kv_events: Option<KvEventsConfig>,
}

impl Settings {
    /// Parses and checks a TOML document.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawSettings = toml::from_str(text).map_err(|e| format!("picker settings: {e}"))?;
        if raw.endpoints.is_empty() && raw.endpoints_file.is_none() {
            return Err("picker settings: give endpoints or endpoints_file".into());
        }
        let endpoints = raw
            .endpoints
            .iter()
            .map(|e| as_url(e).map_err(|why| format!("picker settings: endpoints: {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        if raw.refresh_ms < 100 || raw.probe_interval_ms < 50 {
            return Err(
                "picker settings: refresh_ms must be at least 100, probe_interval_ms at least 50"
                    .into(),
            );
        }
        if !(0.0..=1.0).contains(&raw.kv_cache_limit) {
            return Err("picker settings: kv_cache_limit must be within 0..1".into());
        }
        if raw.breaker_failures == 0 {
            return Err("picker settings: breaker_failures must be at least 1".into());
        }
        let kv_events = match raw.kv_events.map(RawKvEvents::validate).transpose() {
            Ok(Some(mut k)) => {
                // Servers are named as in `endpoints` (`ip:port` or a base URL).
                k.endpoints = k
                    .endpoints
                    .into_iter()
                    .map(|(e, events)| Ok((as_url(&e)?, events)))
                    .collect::<Result<_, String>>()
                    .map_err(|why| format!("picker settings: kv_events.endpoints: {why}"))?;
                Some(k)
            }
            Ok(None) => None,
            Err(why) => return Err(format!("picker settings: kv_events: {why}")),
        };
        Ok(Self {
            listen: raw.listen,
            metrics_listen: raw.metrics_listen,
            members: Membership {
                endpoints,
                endpoints_file: raw.endpoints_file,
                resolve: raw.resolve,
                refresh_ms: raw.refresh_ms,
            },
            probe_interval_ms: raw.probe_interval_ms,
            probe_timeout_ms: raw.probe_timeout_ms,
            queue_limit: raw.queue_limit.max(1),
            kv_cache_limit: raw.kv_cache_limit,
            affinity_tokens: raw.affinity_tokens,
            affinity_max_imbalance: raw.affinity_max_imbalance,
            fallbacks: raw.fallbacks,
            max_body_bytes: raw.max_body_bytes,
            breaker_failures: raw.breaker_failures,
            breaker_cooldown_ms: raw.breaker_cooldown_ms,
            kv_events,
        })
    }
}

/// `ip:port` (the Gateway API's endpoint form) or `http://host:port` as a base URL.
pub(crate) fn as_url(endpoint: &str) -> Result<String, String> {
    let url = if endpoint.starts_with("http://") {
        endpoint.trim_end_matches('/').to_string()
    } else {
        format!("http://{endpoint}")
    };
    crate::config::base_url(&url)?;
    Ok(url)
}

/// A base URL as the `ip:port` the proxy routes to.
pub(crate) fn as_endpoint(url: &str) -> &str {
    url.strip_prefix("http://").unwrap_or(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_unknown_keys_and_take_both_endpoint_forms() {
        let ok = Settings::parse(
            "listen = \"127.0.0.1:9002\"\nendpoints = [\"10.0.0.1:8000\", \"http://n2:8000/\"]",
        );
        let ok = ok.as_ref().map(|s| s.members.endpoints.clone());
        assert_eq!(
            ok,
            Ok(vec![
                "http://10.0.0.1:8000".to_string(),
                "http://n2:8000".to_string()
            ])
        );
        let unknown = Settings::parse("listen = \"x:1\"\nendpoints = [\"a:1\"]\nqueue = 3");
        assert!(unknown.is_err_and(|e| e.contains("queue")));
        assert!(Settings::parse("listen = \"x:1\"").is_err_and(|e| e.contains("endpoints")));
        assert_eq!(as_endpoint("http://10.0.0.1:8000"), "10.0.0.1:8000");
    }
}
