//! The picker's own Prometheus page (`metrics_listen`): its decisions, and what it knows of
//! each server. A plain HTTP/1 listener apart from the gRPC one, so a scraper needs no gRPC.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `turnpike_epp_requests_total` | counter (decisions) | `outcome` (`routed`, `shed`, `unavailable`) |
//! | `turnpike_epp_endpoint_in_flight` | gauge (requests the picker sent there, not yet ended) | `endpoint` |
//! | `turnpike_epp_endpoint_waiting`, `turnpike_epp_endpoint_kv_cache_usage` | gauge (the server's last report) | `endpoint` |
//! | `turnpike_epp_endpoint_breaker` | gauge (0 closed, 1 half-open, 2 open) | `endpoint` |

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::pool::Breaker;

use super::choose::Picker;
use super::settings::as_endpoint;

/// The page now.
pub(crate) fn render(picker: &Picker) -> String {
    let mut out = String::with_capacity(1024);
    out.push_str("# TYPE turnpike_epp_requests_total counter\n");
    for (outcome, n) in [
        ("routed", &picker.routed),
        ("shed", &picker.shed),
        ("unavailable", &picker.unavailable),
    ] {
        let _ = writeln!(
            out,
            "turnpike_epp_requests_total{{outcome=\"{outcome}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    for name in ["in_flight", "waiting", "kv_cache_usage", "breaker"] {
        let _ = writeln!(out, "# TYPE turnpike_epp_endpoint_{name} gauge");
    }
    for r in picker.pool.replicas().iter() {
        let e = as_endpoint(&r.url);
        let reported = picker.reported(&r.url);
        let breaker = match r.breaker() {
            Breaker::Closed { .. } => 0,
            Breaker::HalfOpen => 1,
            Breaker::Open { .. } => 2,
        };
        let _ = writeln!(
            out,
            "turnpike_epp_endpoint_in_flight{{endpoint=\"{e}\"}} {}\n\
             turnpike_epp_endpoint_waiting{{endpoint=\"{e}\"}} {}\n\
             turnpike_epp_endpoint_kv_cache_usage{{endpoint=\"{e}\"}} {}\n\
             turnpike_epp_endpoint_breaker{{endpoint=\"{e}\"}} {breaker}",
            r.in_flight.load(Ordering::Relaxed),
            reported.waiting,
            reported.kv_cache,
        );
    }
    out
}

/// Serves the page on `listener` until the runtime stops.
pub(crate) async fn serve(listener: tokio::net::TcpListener, picker: Arc<Picker>) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let picker = Arc::clone(&picker);
            async move { render(&picker) }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!("picker metrics listener stopped: {e}");
    }
}
