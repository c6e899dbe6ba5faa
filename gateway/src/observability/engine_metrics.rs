//! Engine figures under their own metric names. An engine reports plain numbers in its stats
//! (`Stats.extra`, per model under `models`); the keys below are the well-known ones (the
//! default engine reports them all, any plugin may), and each becomes a named metric with its
//! unit in the name, counters as `_total`. Every numeric stat also stays readable as
//! `turnpike_engine_stat{stat=...}`.
//!
//! | stat key(s) | metric | type |
//! |---|---|---|
//! | `waiting`, `prefilling`, `decoding` | `turnpike_engine_queue_depth{phase="waiting"\|"prefill"\|"decode"}` | gauge |
//! | `last_prefill_batch`, `last_decode_batch` | `turnpike_engine_batch_size{phase}` (the last step's sequences) | gauge |
//! | `steps` | `turnpike_engine_steps_total` | counter |
//! | `prefill_sequences`, `decode_sequences` | `turnpike_engine_batched_sequences_total{phase}` (over `steps_total`: the mean batch) | counter |
//! | `prefill_tokens`, `decode_tokens` | `turnpike_engine_computed_tokens_total{phase}` | counter |
//! | `kv_blocks_used` / `kv_blocks_total` | `turnpike_engine_kv_cache_usage_ratio` | gauge |
//! | `gpu_kv_cache_bytes` | `turnpike_engine_kv_cache_bytes` | gauge |
//! | `prefix_hit_tokens` | `turnpike_engine_prefix_cache_hit_tokens_total` | counter |
//! | `evictions` | `turnpike_engine_kv_cache_evictions_total` | counter |
//! | `preemptions` | `turnpike_engine_preemptions_total` | counter |
//! | `spec_drafted_tokens`, `spec_accepted_tokens` | `turnpike_engine_spec_drafted_tokens_total`, `turnpike_engine_spec_accepted_tokens_total` (speculative decoding: drafts checked and kept) | counter |
//! | `gpu_memory_total_bytes`, `gpu_memory_free_bytes` | `turnpike_gpu_memory_total_bytes`, `turnpike_gpu_memory_used_bytes` | gauge |
//! | `gpu_utilization_percent` (NVML, when the driver ships it) | `turnpike_gpu_utilization_ratio` | gauge (0 to 1) |
//! | `busy_seconds` | `turnpike_engine_busy_seconds_total` (time the engine spent running steps: its rate is the device's utilisation) | counter |
//!
//! Labels: `engine` and `model`, both bounded by the configuration.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde_json::Value;

/// Records the well-known figures of `engine`'s `model` (`""` for engine-wide stats).
pub(super) fn record(engine: &str, model: &str, stats: &Value) {
    let figure = |key: &str| stats.get(key).and_then(Value::as_f64);
    let labels = |extra: Option<(&'static str, &'static str)>| {
        let mut l = vec![("engine", engine.to_string()), ("model", model.to_string())];
        if let Some((k, v)) = extra {
            l.push((k, v.to_string()));
        }
        l
    };
    let gauge = |name: &'static str, extra, value: f64| {
        metrics::gauge!(name, &labels(extra)).set(value);
    };
    let counter = |name: &'static str, extra, value: f64| {
        metrics::counter!(name, &labels(extra)).absolute(value as u64);
    };
    for (key, phase) in [
        ("waiting", "waiting"),
        ("prefilling", "prefill"),
        ("decoding", "decode"),
    ] {
        if let Some(v) = figure(key) {
            gauge("turnpike_engine_queue_depth", Some(("phase", phase)), v);
        }
    }
    for (key, phase) in [
        ("last_prefill_batch", "prefill"),
        ("last_decode_batch", "decode"),
    ] {
        if let Some(v) = figure(key) {
            gauge("turnpike_engine_batch_size", Some(("phase", phase)), v);
        }
    }
    for (key, phase) in [
        ("prefill_sequences", "prefill"),
        ("decode_sequences", "decode"),
    ] {
        if let Some(v) = figure(key) {
            counter(
                "turnpike_engine_batched_sequences_total",
                Some(("phase", phase)),
                v,
            );
        }
    }
    for (key, phase) in [("prefill_tokens", "prefill"), ("decode_tokens", "decode")] {
        if let Some(v) = figure(key) {
            counter(
                "turnpike_engine_computed_tokens_total",
                Some(("phase", phase)),
                v,
            );
        }
    }
    for (key, name) in [
        ("steps", "turnpike_engine_steps_total"),
        (
            "prefix_hit_tokens",
            "turnpike_engine_prefix_cache_hit_tokens_total",
        ),
        ("evictions", "turnpike_engine_kv_cache_evictions_total"),
        ("preemptions", "turnpike_engine_preemptions_total"),
        (
            "spec_drafted_tokens",
            "turnpike_engine_spec_drafted_tokens_total",
        ),
        (
            "spec_accepted_tokens",
            "turnpike_engine_spec_accepted_tokens_total",
        ),
    ] {
        if let Some(v) = figure(key) {
            counter(name, None, v);
        }
    }
    if let (Some(used), Some(total)) = (figure("kv_blocks_used"), figure("kv_blocks_total"))
        && total > 0.0
    {
        gauge("turnpike_engine_kv_cache_usage_ratio", None, used / total);
    }
    if let Some(v) = figure("gpu_kv_cache_bytes") {
        gauge("turnpike_engine_kv_cache_bytes", None, v);
    }
    if let Some(percent) = figure("gpu_utilization_percent") {
        gauge("turnpike_gpu_utilization_ratio", None, percent / 100.0);
    }
    if let Some(total) = figure("gpu_memory_total_bytes") {
        gauge("turnpike_gpu_memory_total_bytes", None, total);
        if let Some(free) = figure("gpu_memory_free_bytes") {
            gauge("turnpike_gpu_memory_used_bytes", None, total - free);
        }
    }
    if let Some(seconds) = figure("busy_seconds") {
        // The registry's counters are whole numbers; this one is rendered as text (`render`).
        BUSY.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((engine.to_string(), model.to_string()), seconds);
    }
}

/// Each engine's and model's busy seconds, as last reported.
static BUSY: Mutex<BTreeMap<(String, String), f64>> = Mutex::new(BTreeMap::new());

/// The metrics the registry cannot hold, as exposition text.
pub(super) fn render() -> String {
    let busy = BUSY.lock().unwrap_or_else(PoisonError::into_inner);
    if busy.is_empty() {
        return String::new();
    }
    let mut out = String::from("# TYPE turnpike_engine_busy_seconds_total counter\n");
    for ((engine, model), seconds) in busy.iter() {
        out.push_str(&format!(
            "turnpike_engine_busy_seconds_total{{engine=\"{}\",model=\"{}\"}} {seconds}\n",
            super::metrics::escape(engine),
            super::metrics::escape(model)
        ));
    }
    out
}
