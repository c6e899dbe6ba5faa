//! Starting and stopping the HTTP server.

use crate::listener;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::engine_host::{self, EngineHostError};
use crate::observability::metrics;
use crate::routes::{AppState, router};
use crate::tenancy::Tenancy;

/// Why the server cannot start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An engine or model failed to load.
    #[error(transparent)]
    Engines(#[from] EngineHostError),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The state store or the tenant directory cannot be set up.
    #[error("tenancy: {0}")]
    State(crate::store::StoreError),
    /// The server failed while running.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// A server with its engines loaded and its socket bound, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    state: AppState,
    keys_watch: Option<tokio::task::JoinHandle<()>>,
    store_watch: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Loads the engines and models (on a blocking thread: a real engine may take a while) and
    /// binds.
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let loading = config.clone();
        let registry = tokio::task::spawn_blocking(move || {
            engine_host::load(
                &loading.engines,
                loading.models.as_deref(),
                &loading.defaults,
            )
        })
        .await
        .map_err(|e| std::io::Error::other(format!("engine loading panicked: {e}")))??;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: config.listen,
                source,
            })?;
        let tenancy = Arc::new(
            Tenancy::build(&config.tenancy, config.server.retry_after)
                .map_err(ServeError::State)?,
        );
        let keys_watch = tenancy.watch_keys_file(config.tenancy.clone());
        let store_watch = tenancy
            .store_health
            .watch(Arc::clone(tenancy.limiter.store()));
        tracing::info!(
            authentication = config.tenancy.auth_required,
            state = if config.tenancy.redis_url.is_some() {
                "redis"
            } else {
                "memory"
            },
            idempotency = config.tenancy.idempotency.is_some(),
            "tenancy ready"
        );
        let state = AppState::new(
            Arc::new(registry),
            Arc::new(config.server.clone()),
            Arc::new(config.defaults.clone()),
            tenancy,
        );
        Ok(Self {
            listener,
            state,
            keys_watch,
            store_watch,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` completes, then finishes the requests in flight.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        tracing::info!(addr = %self.local_addr()?, "serving");
        metrics::handle();
        let upkeep = tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                metrics::upkeep();
            }
        });
        let app = router(self.state.clone());
        let limits = self.state.server.connections.clone();
        listener::serve(self.listener, app, &limits, shutdown).await;
        upkeep.abort();
        for watch in [self.keys_watch, self.store_watch].into_iter().flatten() {
            watch.abort();
        }
        Ok(())
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}
