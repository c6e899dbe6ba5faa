//! What the servers say about themselves, read every `probe_interval_ms`: `/health` (a failed
//! probe counts toward the server's breaker, a good one closes it) and `/metrics` in the
//! model-server protocol's names (`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, or
//! the older `vllm:gpu_cache_usage_perc`), summed over the server's models. A server whose
//! `/metrics` cannot be read keeps its last report.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tonic_health::server::HealthReporter;

use crate::health::probe;
use crate::run::HttpClient;

use super::choose::{Picker, Reported};

/// The largest `/metrics` page read.
const MAX_METRICS_BYTES: usize = 4 << 20;

/// Probes every server on each tick, and says the picker is ready (gRPC health) while some
/// server is, until the runtime stops.
pub(crate) async fn probe_forever(client: HttpClient, picker: Arc<Picker>, health: HealthReporter) {
    let s = &picker.settings;
    let mut tick = tokio::time::interval(Duration::from_millis(s.probe_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = Duration::from_millis(s.probe_timeout_ms);
    let cooldown = Duration::from_millis(s.breaker_cooldown_ms);
    loop {
        tick.tick().await;
        let replicas = picker.pool.replicas();
        let rounds = replicas.iter().map(|r| {
            let client = client.clone();
            async move {
                let healthy = probe(&client, &r.url, timeout).await;
                let reported = if healthy {
                    metrics(&client, &r.url, timeout).await
                } else {
                    None
                };
                (healthy, reported)
            }
        });
        let answers = futures_util::future::join_all(rounds).await;
        for (r, (healthy, reported)) in replicas.iter().zip(answers) {
            r.probed(healthy, s.breaker_failures, cooldown);
            if let Some(reported) = reported {
                picker.report(&r.url, reported);
            }
        }
        picker.forget_gone();
        for service in super::READY_SERVICES {
            if picker.pool.available() {
                health
                    .set_service_status(service, tonic_health::ServingStatus::Serving)
                    .await;
            } else {
                health
                    .set_service_status(service, tonic_health::ServingStatus::NotServing)
                    .await;
            }
        }
    }
}

/// `url/metrics` read for the load figures, `None` when it cannot be read.
async fn metrics(client: &HttpClient, url: &str, timeout: Duration) -> Option<Reported> {
    let request = hyper::Request::get(format!("{url}/metrics"))
        .body(Full::new(Bytes::new()))
        .ok()?;
    let read = async {
        let response = client.request(request).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = Limited::new(response.into_body(), MAX_METRICS_BYTES)
            .collect()
            .await
            .ok()?;
        Some(parse(&String::from_utf8_lossy(&body.to_bytes())))
    };
    tokio::time::timeout(timeout, read).await.ok().flatten()
}

/// The load figures in a Prometheus text page.
pub(crate) fn parse(page: &str) -> Reported {
    let mut reported = Reported::default();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = sample(line) else {
            continue;
        };
        match name {
            "vllm:num_requests_waiting" => reported.waiting += value,
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                reported.kv_cache = reported.kv_cache.max(value);
            }
            _ => {}
        }
    }
    reported
}

/// A sample line's metric name and value.
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line.find(['{', ' '])?;
    let value = line.rsplit_once('}').map_or(&line[name_end..], |(_, v)| v);
    let value = value.split_whitespace().next()?.parse().ok()?;
    Some((&line[..name_end], value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_figures_are_read_in_the_model_server_protocols_names() {
        let page = "# HELP vllm:num_requests_waiting x\n\
            vllm:num_requests_waiting{model_name=\"a\"} 3\n\
            vllm:num_requests_waiting{model_name=\"b\"} 2\n\
            vllm:gpu_cache_usage_perc{model_name=\"a\"} 0.25\n\
            vllm:kv_cache_usage_perc{model_name=\"b\",x=\"}\"} 0.5\n\
            vllm:num_requests_running 7\n";
        assert_eq!(
            parse(page),
            Reported {
                waiting: 5.0,
                kv_cache: 0.5
            }
        );
    }
}
