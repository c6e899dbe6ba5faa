//! Active health checks: every `health_interval_ms`, each replica's `/health` is asked (within
//! the connect timeout). A failed probe counts toward the replica's breaker as a failed request
//! does; a good one closes an open breaker, so a replica that comes back is used again without
//! waiting for live traffic to probe it, and one that dies is avoided before a request finds out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use crate::Model;
use crate::run::HttpClient;

/// Probes `model`'s replicas every `interval`, until the runtime stops.
pub(crate) async fn probe_forever(
    client: HttpClient,
    model: Arc<Model>,
    interval: Duration,
    timeout: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let c = &model.config;
    let cooldown = Duration::from_millis(c.breaker_cooldown_ms);
    loop {
        tick.tick().await;
        for replica in model.pool.replicas().iter() {
            let healthy = probe(&client, &replica.url, timeout).await;
            replica.probed(healthy, c.breaker_failures, cooldown);
        }
    }
}

/// Whether `url/health` answers 2xx in time.
pub(crate) async fn probe(client: &HttpClient, url: &str, timeout: Duration) -> bool {
    let Ok(request) = hyper::Request::get(format!("{url}/health")).body(Full::new(Bytes::new()))
    else {
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, client.request(request)).await,
        Ok(Ok(response)) if response.status().is_success()
    )
}
