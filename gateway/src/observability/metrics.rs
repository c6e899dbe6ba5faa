//! Prometheus metrics, rendered at `GET /metrics`.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `turnpike_http_requests_total` | counter | `endpoint`, `status` |
//! | `turnpike_http_request_duration_seconds` | histogram (to the response head) | `endpoint` |
//! | `turnpike_errors_total` | counter | `code` |
//! | `turnpike_tokens_total` | counter | `model`, `kind` (`prompt`, `completion`) |
//! | `turnpike_prompt_cache_total`, `turnpike_prompt_cache_bytes` | counter (prompts tokenized, `result` `hit` or `miss`), gauge (bytes held, at most 16 MiB) | `model` |
//! | `turnpike_model_resumed_total` | counter (requests a standby engine resumed mid-stream) | `model`, `engine` |
//! | `turnpike_time_to_first_token_seconds` | histogram (streamed and non-streamed) | `model` |
//! | `turnpike_time_per_output_token_seconds` | histogram (per request: decode time over output tokens after the first) | `model` |
//! | `turnpike_decode_tokens_per_second` | gauge (output tokens per second over the last few seconds) | `model` |
//! | `turnpike_active_streams` | gauge | |
//! | `turnpike_engine_queued`, `turnpike_engine_running` | gauge | `engine` |
//! | `turnpike_engine_requests_total` | counter (the engine's own count) | `engine`, `outcome` |
//! | `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (also as `vllm:gpu_cache_usage_perc`, its older name) | gauge (the load figures routers and endpoint pickers read, in vLLM's names, from an engine's per-model stats) | `model_name` |
//! | `turnpike_engine_replica_stat`, `turnpike_engine_replica_breaker` | gauge (per replica of an engine that serves from a pool: in flight, requests, errors, mean time to first token; breaker 0 closed, 1 half-open, 2 open) | `engine`, `model`, `replica`, `stat` |
//! | `turnpike_engine_stat` | gauge (every numeric engine-specific stat: KV blocks, prefix hit rate, preemptions, ...) | `engine`, `model` (empty when engine-wide), `stat` |
//! | `turnpike_engine_queue_depth`, `turnpike_engine_batch_size`, `turnpike_engine_*_total`, `turnpike_engine_kv_cache_*`, `turnpike_gpu_memory_*` | the engine's well-known stats under their own names (see `engine_metrics`) | `engine`, `model`, `phase` |
//! | `turnpike_rate_limit_dropped_total` | counter | `limit` (`requests`, `tokens`, `concurrency`, `websockets`); `tenant` with `[metrics] tenant_label = true` |
//! | `turnpike_spend_nanounits_total` | counter (settled cost, 1e-9 of the currency) | `tenant` with `tenant_label` |
//! | `turnpike_spend_charge_plans` | gauge (callers whose budget counters are kept built for the day; at most 4096) | |
//! | `turnpike_budget_refusals_total` | counter | `period` (`daily`, `monthly`, `total`); `tenant` with `tenant_label` |
//! | `turnpike_usage_log_records`, `turnpike_usage_log_dropped_total` | gauge, counter (in-memory store: usage records waiting for export; the oldest dropped at the cap) | |
//! | `turnpike_usage_journal_bytes`, `turnpike_usage_journal_waiting`, `turnpike_usage_journal_full_total` | gauge, gauge, counter (the usage journal's size, its records Redis does not have yet, records written to Redis directly because the journal was full) | |
//! | `turnpike_state_batch_queue` | gauge (requests waiting for the next grouped Redis call) | `kind` (`settle`, `admit`) |
//! | `turnpike_batches_created_total`, `turnpike_batches_ended_total` | counter (batches created here; batches this replica finished) | `status` (`completed`, `cancelled`, `expired`) on the second |
//! | `turnpike_batch_lines_running` | gauge (batch lines this replica runs now; at most `batches.concurrency`) | |
//! | `turnpike_batch_lines_total` | counter (batch lines this replica answered) | `outcome` (`ok`, `failed`) |
//! | `turnpike_files_swept_total` | counter (objects of lapsed files deleted from the directory or bucket, swept hourly) | |
//! | `turnpike_config_reloads_total`, `turnpike_tls_reloads_total` | counter | `result` (`ok`, `failed`) |
//! | `turnpike_state_errors_total` | counter (state store failures) | `feature` |
//! | `turnpike_concurrency_leases` | gauge (leases this replica holds) | |
//! | `turnpike_queue_running`, `turnpike_queue_waiting` | gauge | `model` |
//! | `turnpike_queue_full_total` | counter | `model` |
//! | `turnpike_idempotency_total` | counter | `outcome` (`started`, `replayed`, `joined`, `resumed` (a `Last-Event-ID` read on), `resume_unknown` (nothing to resume), `conflict`, `in_progress`) |
//! | `turnpike_idempotency_records`, `turnpike_idempotency_bytes` | gauge (in-memory store) | |
//! | `turnpike_stored_values`, `turnpike_stored_value_bytes` | gauge (in-memory store: stored responses) | |
//! | `turnpike_websocket_connections` | gauge (open WebSocket connections; at most `server.websocket_max_connections`) | |
//! | `turnpike_websocket_closed_total` | counter (connections the server closed by its bounds) | `reason` (`idle`, `expired`) |
//! | `turnpike_http_connections` | gauge (open HTTP connections; at most `server.max_connections`) | |
//! | `turnpike_http_connections_closed_total` | counter (connections and requests cut by the server's bounds) | `reason` (`limit`, `header_timeout`, `body_timeout`, `tls_handshake`) |
//! | `turnpike_state_store_up` | gauge (1 while the state store answers its health probe, 0 while it does not) | |
//! | `turnpike_plugin_calls_total` | counter (gateway plugin hook calls) | `plugin`, `hook` (`guard`, `transform`), `outcome` |
//! | `turnpike_plugin_call_duration_seconds` | histogram | `plugin`, `hook` |
//! | `turnpike_admin_changes_total` | counter (admin API changes) | `action`, `result` |
//! | `turnpike_admin_state_revision`, `turnpike_admin_sync_failures_total` | gauge, counter (the admin state in force here; syncs that failed) | |
//! | `turnpike_admin_state_regressed`, `turnpike_admin_state_restores_total` | gauge (1 while the state store is behind the admin state held here), counter (states put back) | |
//!
//! The recorder is process-wide; histogram samples are drained by [`upkeep`], which the server
//! runs every few seconds, so memory stays bounded whether or not anyone scrapes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's metrics handle, installing the recorder on first use (`None` if another
/// recorder was installed first).
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
                .ok()?;
            builder.install_recorder().ok()
        })
        .as_ref()
}

/// Exports the gauges of things open at zero, so a dashboard shows 0 before the first one.
pub fn initialize() {
    for gauge in [
        "turnpike_active_streams",
        "turnpike_websocket_connections",
        "turnpike_http_connections",
    ] {
        metrics::gauge!(gauge).increment(0.0);
    }
}

/// The Prometheus text exposition.
pub fn render() -> String {
    handle()
        .map(|h| {
            h.run_upkeep();
            h.render() + &render_replicas() + &super::engine_metrics::render()
        })
        .unwrap_or_default()
}

/// Drains histogram samples and updates the generation rates; run periodically.
pub fn upkeep() {
    if let Some(h) = handle() {
        h.run_upkeep();
    }
    decode_rates();
}

/// One HTTP request finished its response head.
pub fn http_request(endpoint: &str, status: u16, elapsed: Duration) {
    super::metric_handles::http_request(endpoint, status, elapsed.as_secs_f64());
}

/// An error answered to a client (also mid-stream).
pub fn error(code: &str) {
    crate::error::count(code);
}

/// A model's request metrics, found once per request ([`model_metrics`]).
pub(crate) use super::metric_handles::ModelHandles as ModelMetrics;

/// `model`'s request metrics: its tokens, time to first token and time per output token.
pub(crate) fn model_metrics(model: &str) -> std::sync::Arc<ModelMetrics> {
    super::metric_handles::model(model)
}

/// `completion` more tokens generated by `model`, for its generation rate.
pub(super) fn decoded(model: &str, completion: u64) {
    let mut decoded = DECODED.lock().unwrap_or_else(PoisonError::into_inner);
    match decoded.totals.get_mut(model) {
        Some(total) => *total += completion,
        None => {
            decoded.totals.insert(model.to_string(), completion);
        }
    }
}

/// Output tokens per model since the start, and what they were at the last [`upkeep`], for
/// `turnpike_decode_tokens_per_second` (the generation rate over the last upkeep interval).
#[derive(Debug)]
struct Decoded {
    totals: BTreeMap<String, u64>,
    at_last: BTreeMap<String, u64>,
    last: Option<std::time::Instant>,
}

static DECODED: Mutex<Decoded> = Mutex::new(Decoded {
    totals: BTreeMap::new(),
    at_last: BTreeMap::new(),
    last: None,
});

/// Sets each model's generation rate since the last call.
fn decode_rates() {
    let mut decoded = DECODED.lock().unwrap_or_else(PoisonError::into_inner);
    let now = std::time::Instant::now();
    if let Some(last) = decoded.last {
        let seconds = now.duration_since(last).as_secs_f64();
        if seconds > 0.0 {
            for (model, total) in &decoded.totals {
                let before = decoded.at_last.get(model).copied().unwrap_or(0);
                metrics::gauge!("turnpike_decode_tokens_per_second", "model" => model.clone())
                    .set((total - before) as f64 / seconds);
            }
        }
    }
    decoded.at_last = decoded.totals.clone();
    decoded.last = Some(now);
}

/// An engine's own counters, read at scrape time.
pub fn engine_stats(engine: &str, stats: &turnpike_engine_api::Stats) {
    metrics::gauge!("turnpike_engine_queued", "engine" => engine.to_string())
        .set(stats.queued as f64);
    metrics::gauge!("turnpike_engine_running", "engine" => engine.to_string())
        .set(stats.running as f64);
    for (outcome, value) in [
        ("completed", stats.completed),
        ("cancelled", stats.cancelled),
        ("failed", stats.failed),
    ] {
        metrics::counter!("turnpike_engine_requests_total", "engine" => engine.to_string(), "outcome" => outcome)
            .absolute(value);
    }
    let mut replicas = ReplicaText::default();
    for (name, value) in &stats.extra {
        match value {
            serde_json::Value::Object(models) if name == "models" => {
                for (model, per_model) in models {
                    for (stat, value) in per_model.as_object().into_iter().flatten() {
                        engine_stat(engine, model, stat, value);
                    }
                    load_gauges(model, per_model);
                    super::engine_metrics::record(engine, model, per_model);
                    replica_stats(engine, model, per_model, &mut replicas);
                }
            }
            value => engine_stat(engine, "", name, value),
        }
    }
    REPLICAS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(engine.to_string(), replicas);
}

/// The load figures the field's routers read, in the names vLLM exports them under:
/// `vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
/// (a fraction, as vLLM's is), per model, from the engine's per-model stats where it has them.
fn load_gauges(model: &str, stats: &serde_json::Value) {
    let figure = |key: &str| stats.get(key).and_then(serde_json::Value::as_f64);
    if let Some(running) = figure("running") {
        metrics::gauge!("vllm:num_requests_running", "model_name" => model.to_string())
            .set(running);
    }
    if let Some(waiting) = figure("waiting") {
        metrics::gauge!("vllm:num_requests_waiting", "model_name" => model.to_string())
            .set(waiting);
    }
    if let (Some(used), Some(total)) = (figure("kv_blocks_used"), figure("kv_blocks_total"))
        && total > 0.0
    {
        metrics::gauge!("vllm:kv_cache_usage_perc", "model_name" => model.to_string())
            .set(used / total);
        // The name vLLM used before 0.10, which pickers of that time still read.
        metrics::gauge!("vllm:gpu_cache_usage_perc", "model_name" => model.to_string())
            .set(used / total);
    }
}

/// An engine that serves a model from replicas (the upstream plugin) lists them under
/// `replicas`, each with its `url`: its numeric figures become `turnpike_engine_replica_stat`,
/// and its breaker state (`closed`, `half_open`, `open`) `turnpike_engine_replica_breaker`
/// (0, 1, 2). A pool's members change while it serves (an endpoints file, DNS), so these are
/// not kept in the registry: each scrape's figures replace the engine's last ones whole
/// ([`REPLICAS`]), and a replica that left its pool leaves the metrics too.
fn replica_stats(engine: &str, model: &str, stats: &serde_json::Value, out: &mut ReplicaText) {
    let Some(replicas) = stats.get("replicas").and_then(serde_json::Value::as_array) else {
        return;
    };
    let labels = |url: &str| {
        format!(
            "engine=\"{}\",model=\"{}\",replica=\"{}\"",
            escape(engine),
            escape(model),
            escape(url)
        )
    };
    for replica in replicas {
        let Some(url) = replica.get("url").and_then(serde_json::Value::as_str) else {
            continue;
        };
        for (stat, value) in replica.as_object().into_iter().flatten() {
            if let Some(v) = value.as_f64() {
                let line = format!(
                    "turnpike_engine_replica_stat{{{},stat=\"{}\"}} {v}\n",
                    labels(url),
                    escape(stat)
                );
                out.stats.push_str(&line);
            }
        }
        let state = match replica.get("breaker").and_then(serde_json::Value::as_str) {
            Some("closed") => 0,
            Some("half_open") => 1,
            Some("open") => 2,
            _ => continue,
        };
        let line = format!(
            "turnpike_engine_replica_breaker{{{}}} {state}\n",
            labels(url)
        );
        out.breakers.push_str(&line);
    }
}

/// One engine's replica figures as exposition lines, by metric.
#[derive(Debug, Default)]
struct ReplicaText {
    stats: String,
    breakers: String,
}

/// The last replica figures of each engine.
static REPLICAS: Mutex<BTreeMap<String, ReplicaText>> = Mutex::new(BTreeMap::new());

/// A label value as the exposition format writes it.
pub(super) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The replica metrics, each family with its type line.
fn render_replicas() -> String {
    let replicas = REPLICAS.lock().unwrap_or_else(PoisonError::into_inner);
    let stats: String = replicas.values().map(|t| t.stats.as_str()).collect();
    let breakers: String = replicas.values().map(|t| t.breakers.as_str()).collect();
    let mut out = String::new();
    for (name, lines) in [
        ("turnpike_engine_replica_stat", stats),
        ("turnpike_engine_replica_breaker", breakers),
    ] {
        if !lines.is_empty() {
            out.push_str(&format!("# TYPE {name} gauge\n{lines}"));
        }
    }
    out
}

/// One numeric engine-specific counter (KV blocks, prefix hit rate, preemptions, ...);
/// values that are not numbers are not metrics and are skipped.
fn engine_stat(engine: &str, model: &str, stat: &str, value: &serde_json::Value) {
    if let Some(v) = value.as_f64() {
        metrics::gauge!("turnpike_engine_stat", "engine" => engine.to_string(), "model" => model.to_string(), "stat" => stat.to_string())
            .set(v);
    }
}

/// Counts something open in a gauge while it lives: `turnpike_active_streams`,
/// `turnpike_websocket_connections`, `turnpike_http_connections`.
#[derive(Debug)]
pub struct OpenGuard(&'static str);

impl OpenGuard {
    /// An open stream.
    pub fn stream() -> Self {
        Self::open("turnpike_active_streams")
    }

    /// An open WebSocket connection.
    pub fn websocket() -> Self {
        Self::open("turnpike_websocket_connections")
    }

    /// An open HTTP connection.
    pub fn connection() -> Self {
        Self::open("turnpike_http_connections")
    }

    fn open(gauge: &'static str) -> Self {
        metrics::gauge!(gauge).increment(1.0);
        Self(gauge)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        metrics::gauge!(self.0).decrement(1.0);
    }
}

/// A connection (or a request's body) cut by one of the server's bounds: `limit` (refused past
/// `server.max_connections`), `header_timeout`, `body_timeout`, `tls_handshake` (failed or too
/// slow).
pub fn connection_closed(reason: &'static str) {
    metrics::counter!("turnpike_http_connections_closed_total", "reason" => reason).increment(1);
}

/// A WebSocket connection the server closed by one of its bounds (`idle`, `expired`).
pub fn websocket_closed(reason: &'static str) {
    metrics::counter!("turnpike_websocket_closed_total", "reason" => reason).increment(1);
}

/// A rebuild of the listener's TLS configuration after its files changed (`result`: `ok`, or
/// `failed`, when the previous certificate stays).
pub fn tls_reload(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!("turnpike_tls_reloads_total", "result" => result).increment(1);
}

/// A reload of the configuration (`result`: `ok`, or `failed`, when the running one stays).
pub fn config_reload(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!("turnpike_config_reloads_total", "result" => result).increment(1);
}

/// One call of a gateway plugin's hook (`outcome`: `allow`, `reject`, `rewrite`, `ok`,
/// `failed`, `timeout`), and how long it took.
pub fn plugin_call(plugin: &str, hook: &'static str, outcome: &'static str, took: Duration) {
    plugin_calls(plugin, hook, outcome, 1, took);
}

/// `count` calls of a plugin's hook that took `total` together (a response's transform feeds,
/// counted when its transform closes: the histogram observes the total per response).
pub fn plugin_calls(
    plugin: &str,
    hook: &'static str,
    outcome: &'static str,
    count: u64,
    total: Duration,
) {
    let plugin = plugin.to_string();
    metrics::counter!("turnpike_plugin_calls_total", "plugin" => plugin.clone(), "hook" => hook, "outcome" => outcome)
        .increment(count);
    metrics::histogram!("turnpike_plugin_call_duration_seconds", "plugin" => plugin, "hook" => hook)
        .record(total.as_secs_f64());
}

/// A change through the admin API (`action`: `tenant.put`, …; `result`: `ok` or why not).
pub fn admin_change(action: &'static str, result: &'static str) {
    metrics::counter!("turnpike_admin_changes_total", "action" => action, "result" => result)
        .increment(1);
}

/// The admin state's revision in force on this replica.
pub fn admin_revision(revision: u64) {
    metrics::gauge!("turnpike_admin_state_revision").set(revision as f64);
}

/// A shared admin state this replica could not read or apply (it keeps the one in force).
pub fn admin_sync_failed() {
    metrics::counter!("turnpike_admin_sync_failures_total").increment(1);
}

/// Whether the state store is behind the admin state held here (until it is put back).
pub fn admin_state_regressed(regressed: bool) {
    metrics::gauge!("turnpike_admin_state_regressed").set(if regressed { 1.0 } else { 0.0 });
}

/// The admin state held here was put back into a store that lost it.
pub fn admin_state_restored() {
    metrics::counter!("turnpike_admin_state_restores_total").increment(1);
}

/// What `[metrics]` configures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Per-tenant metrics carry a `tenant` label (one series per tenant; off by default).
    pub tenant_label: bool,
}

/// `[metrics]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawMetrics {
    tenant_label: bool,
}

impl RawMetrics {
    /// The settings (every combination is valid).
    pub fn validate(self) -> MetricsSettings {
        MetricsSettings {
            tenant_label: self.tenant_label,
        }
    }
}

/// Whether per-tenant metrics carry a `tenant` label (`[metrics] tenant_label`): off by default,
/// so the number of series does not grow with the number of tenants.
static TENANT_LABEL: AtomicBool = AtomicBool::new(false);

/// Sets whether per-tenant metrics carry a `tenant` label.
pub fn set_tenant_label(on: bool) {
    TENANT_LABEL.store(on, Ordering::Relaxed);
}

/// A request's settled cost in nano-units of the currency, a counter so sums stay exact
/// (`turnpike_spend_nanounits_total`; per tenant only with the tenant label).
pub fn spent(tenant: &str, nanos: u64) {
    if TENANT_LABEL.load(Ordering::Relaxed) {
        metrics::counter!("turnpike_spend_nanounits_total", "tenant" => tenant.to_string())
            .increment(nanos);
    } else {
        // Every priced request adds to it: its handle is looked up once, with the recorder
        // in place.
        static SPENT: OnceLock<metrics::Counter> = OnceLock::new();
        SPENT
            .get_or_init(|| {
                handle();
                metrics::counter!("turnpike_spend_nanounits_total")
            })
            .increment(nanos);
    }
}

/// Callers whose budget counters are kept built (`turnpike_spend_charge_plans`).
pub fn charge_plans(count: usize) {
    metrics::gauge!("turnpike_spend_charge_plans").set(count as f64);
}

/// A spend budget refused a request (`turnpike_budget_refusals_total` by `period`).
pub fn budget_refused(tenant: &str, period: &'static str) {
    if TENANT_LABEL.load(Ordering::Relaxed) {
        metrics::counter!("turnpike_budget_refusals_total", "period" => period, "tenant" => tenant.to_string())
            .increment(1);
    } else {
        metrics::counter!("turnpike_budget_refusals_total", "period" => period).increment(1);
    }
}

/// A tenant limit refused a request.
pub fn rate_limited(tenant: &str, limit: &'static str) {
    if TENANT_LABEL.load(Ordering::Relaxed) {
        metrics::counter!("turnpike_rate_limit_dropped_total", "limit" => limit, "tenant" => tenant.to_string())
            .increment(1);
    } else {
        metrics::counter!("turnpike_rate_limit_dropped_total", "limit" => limit).increment(1);
    }
}

/// A state store operation failed.
pub fn state_error(feature: &'static str) {
    metrics::counter!("turnpike_state_errors_total", "feature" => feature).increment(1);
}

/// Concurrency leases held by this replica changed by `delta`.
pub fn active_leases(delta: f64) {
    metrics::gauge!("turnpike_concurrency_leases").increment(delta);
}

/// A model's queue: its running and waiting gauges, for the queue to keep and set.
pub fn queue_gauges(model: &str) -> (metrics::Gauge, metrics::Gauge) {
    // The recorder first: a handle taken before it is installed would count nowhere.
    handle();
    (
        metrics::gauge!("turnpike_queue_running", "model" => model.to_string()),
        metrics::gauge!("turnpike_queue_waiting", "model" => model.to_string()),
    )
}

/// A model's queue refused a request.
pub fn queue_full(model: &str) {
    metrics::counter!("turnpike_queue_full_total", "model" => model.to_string()).increment(1);
}

/// An idempotent request's outcome on arrival.
pub fn idempotency(outcome: &'static str) {
    metrics::counter!("turnpike_idempotency_total", "outcome" => outcome).increment(1);
}
