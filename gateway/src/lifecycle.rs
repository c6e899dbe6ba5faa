//! The server's life after a stop signal, as plain shared state that the layers below read:
//! serving, then draining (`/ready` answers 503, requests in flight go on), then cut (every
//! generation still running ends now with a clean `server_shutting_down` error, which its
//! protocol renders as its own failure event, and its engine work is cancelled).
//!
//! The server ([`crate::server`]) moves it along; the readiness route and every generation
//! stream ([`crate::pipeline::run`]) only observe it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Where the server is in its life; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    draining: AtomicBool,
    cut: CancellationToken,
}

impl Lifecycle {
    /// Stops reporting ready; requests go on.
    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// Whether a stop signal has arrived.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Relaxed)
    }

    /// Ends every generation still running.
    pub fn cut(&self) {
        self.drain();
        self.inner.cut.cancel();
    }

    /// Whether [`Self::cut`] has been called.
    pub fn is_cut(&self) -> bool {
        self.inner.cut.is_cancelled()
    }

    /// Completes once [`Self::cut`] is called.
    pub fn cut_signal(&self) -> WaitForCancellationFutureOwned {
        self.inner.cut.clone().cancelled_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cut_drains_and_wakes_every_waiter() {
        let life = Lifecycle::default();
        assert!(!life.is_draining());
        let waiter = tokio::spawn(life.cut_signal());
        life.drain();
        assert!(life.is_draining() && !life.is_cut());
        life.cut();
        assert!(life.is_cut());
        assert!(waiter.await.is_ok());
        // A signal asked for after the cut is already complete.
        life.cut_signal().await;
    }
}
