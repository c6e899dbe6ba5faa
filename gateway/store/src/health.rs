//! The state store's health, probed in the background.
//!
//! A shared store (Redis) is pinged every [`PROBE_INTERVAL`]. The result is the gauge
//! `turnpike_state_store_up` and what `/ready` reports; the probe also keeps the connection
//! manager reconnecting while Redis is away, so the first request after Redis returns finds a
//! live connection instead of paying for the reconnect (and taking its feature's failure mode).
//! The in-memory store is always up and is not probed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Store;
use crate::gauges as metrics;

/// How often a shared store is pinged.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Whether the store answered its last probe.
#[derive(Debug)]
pub struct StoreHealth {
    up: AtomicBool,
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self {
            up: AtomicBool::new(true),
        }
    }
}

impl StoreHealth {
    /// Whether the store answered its last probe (always, for a store that is not probed).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    fn set(&self, up: bool) {
        if self.up.swap(up, Ordering::Relaxed) != up {
            if up {
                tracing::info!("the state store answers again");
            } else {
                tracing::warn!("the state store does not answer");
            }
        }
        metrics::state_store_up(up);
    }

    /// Probes `store` every [`PROBE_INTERVAL`] while the task lives; `None` for a store that is
    /// not shared (in memory).
    pub fn watch(self: &Arc<Self>, store: Arc<dyn Store>) -> Option<tokio::task::JoinHandle<()>> {
        metrics::state_store_up(true);
        if !store.shared() {
            return None;
        }
        let this = Arc::clone(self);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                this.set(store.ping().await.is_ok());
            }
        }))
    }
}
