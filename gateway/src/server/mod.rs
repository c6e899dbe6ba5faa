//! Starting and stopping the HTTP server: the main listener (TLS when configured, its files
//! watched), the optional plain-HTTP health listener, and the drain on a stop signal (see
//! [`crate::routes::settings::Drain`]): `/ready` turns 503, the listeners close after the drain
//! delay, streams still running at the deadline are cut with a clean error event, and what
//! remains open a moment after that is dropped.

pub mod reload;

use crate::lifecycle::Lifecycle;
use crate::listener::{self, tls::TlsSource};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::Admin;
use crate::config::Config;
use crate::engine_host::{self, EngineHostError};
use crate::observability::metrics;
use crate::routes::{AppState, health_router, router};
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
    /// The TLS certificate, key or client CA cannot be used.
    #[error("tls: {0}")]
    Tls(#[from] listener::tls::TlsError),
    /// A gateway plugin failed to load.
    #[error(transparent)]
    Plugins(#[from] crate::plugins::PluginLoadError),
    /// The state store or the tenant directory cannot be set up.
    #[error("tenancy: {0}")]
    State(crate::store::StoreError),
    /// A price names a model that is not served.
    #[error("{0}")]
    Prices(String),
    /// The files directory cannot be used.
    #[error("{0}")]
    Files(String),
    /// The server failed while running.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// A server with its engines loaded and its socket bound, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    health: Option<tokio::net::TcpListener>,
    tls: Option<Arc<TlsSource>>,
    state: AppState,
    /// The configuration it was started with, and how to read it again (see [`reload`]).
    config: Config,
    reload: Option<reload::Source>,
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
        // The recorder first: what the setup below reports (the store's state) must land in it.
        metrics::handle();
        metrics::initialize();
        crate::observability::apply(config.metrics, config.logging);
        let tls = match &config.server.tls {
            Some(settings) => Some(TlsSource::new(settings.clone())?),
            None => None,
        };
        let listener = bind(config.listen).await?;
        let health = match config.server.health_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let tenancy = Arc::new(
            Tenancy::build(&config.tenancy, config.server.retry_after)
                .map_err(ServeError::State)?,
        );
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
        let registry = Arc::new(registry);
        config
            .tenancy
            .spend
            .check_models(&|m| registry.resolve(m).is_some())
            .map_err(ServeError::Prices)?;
        // Exports for the life of the process; a killed one's records are taken over.
        let _usage_export = config
            .tenancy
            .spend
            .export
            .clone()
            .map(|file| crate::spend::export::spawn(Arc::clone(tenancy.store()), file));
        let mut state = AppState::new(
            Arc::clone(&registry),
            Arc::new(config.server.clone()),
            Arc::new(config.defaults.clone()),
            Arc::clone(&tenancy),
        );
        if !config.plugins.is_empty() {
            let settings = config.plugins.clone();
            let retry_after = config.server.retry_after;
            let plugins = tokio::task::spawn_blocking(move || {
                crate::plugins::PluginHost::load(&settings, retry_after)
            })
            .await
            .map_err(|e| std::io::Error::other(format!("plugin loading panicked: {e}")))??;
            state = state.with_plugins(Arc::new(plugins));
        }
        if let Some(settings) = &config.admin {
            let admin = Admin::new(settings.clone(), tenancy, registry);
            admin.load_state_file();
            // The shared state as it stands; a store still away is read by the sync later.
            match admin.sync().await {
                Ok(_) => tracing::info!(revision = admin.snapshot().revision, "admin API ready"),
                Err(e) => tracing::error!(error = %e, "admin state not read yet; the sync retries"),
            }
            state = state.with_admin(admin);
        }
        let state = state
            .with_batches(config.files.clone(), config.batches)
            .map_err(ServeError::Files)?;
        Ok(Self {
            listener,
            health,
            tls,
            state,
            config: config.clone(),
            reload: None,
            store_watch,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        Ok(self.listener.local_addr()?)
    }

    /// Re-reads `file` with `loader` while serving (see [`reload`]); without this only the keys
    /// file is re-read.
    pub fn reload_from(&mut self, source: reload::Source) {
        self.reload = Some(source);
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The health listener's address, when there is one.
    pub fn health_addr(&self) -> Result<Option<SocketAddr>, ServeError> {
        Ok(match &self.health {
            Some(l) => Some(l.local_addr()?),
            None => None,
        })
    }

    /// Serves until `shutdown` completes, then drains (see the module's doc).
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        tracing::info!(
            addr = %self.local_addr()?,
            tls = self.tls.is_some(),
            health = ?self.health_addr()?,
            "serving"
        );
        metrics::handle();
        let upkeep = tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                metrics::upkeep();
            }
        });
        let tls_watch = self.tls.as_ref().map(TlsSource::watch);
        let admin_sync = self.state.admin.as_ref().map(Admin::spawn_sync);
        let config_watch = self.config_watch();
        let lifecycle = self.state.generator.lifecycle().clone();
        if self.state.batches.files().enabled() {
            crate::batches::worker::spawn(Arc::clone(&self.state.batches), lifecycle.clone());
        }
        let (closing_tx, closing) = tokio::sync::watch::channel(Phase::Serving);
        let stopper = tokio::spawn(stop_in_phases(
            shutdown,
            lifecycle,
            self.state.server.drain,
            closing_tx,
        ));
        let limits = self.state.server.connections.clone();
        let health = self.health.map(|health| {
            let app = health_router(self.state.clone());
            let (limits, closed) = (limits.clone(), reached(closing.clone(), Phase::Closed));
            tokio::spawn(async move { listener::serve(health, app, &limits, None, closed).await })
        });
        let app = router(self.state.clone());
        let serving = listener::serve(
            self.listener,
            app,
            &limits,
            self.tls,
            reached(closing.clone(), Phase::Closed),
        );
        tokio::select! {
            () = serving => {}
            () = reached(closing, Phase::Abandoned) => {
                tracing::warn!("connections still open after the drain deadline are dropped");
            }
        }
        stopper.abort();
        upkeep.abort();
        let watches = [
            config_watch,
            self.store_watch,
            tls_watch,
            health,
            admin_sync,
        ];
        for watch in watches.into_iter().flatten() {
            watch.abort();
        }
        // Usage records still in the local journal go to the shared state before the exit (a
        // journal left behind ships when the process starts again on it).
        match self.state.tenancy.store().flush(JOURNAL_FLUSH).await {
            Ok(true) => {}
            Ok(false) | Err(_) => tracing::warn!(
                "usage records are left in the journal; they ship when the gateway starts again on it"
            ),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

impl Server {
    /// The reload watch: the config file when there is a loader, else the keys file alone
    /// (when authentication reads one).
    fn config_watch(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let tenancy = Arc::clone(&self.state.tenancy);
        let current = self.config.clone();
        let (file, loader) = match self.reload.take() {
            Some(source) => (Some(source.file), source.loader),
            None if current.tenancy.auth_required && current.tenancy.keys_file.is_some() => {
                let same = current.clone();
                let loader: reload::Loader = Box::new(move || Ok(same.clone()));
                (None, loader)
            }
            None => return None,
        };
        Some(reload::spawn(reload::Watch {
            file,
            loader,
            current,
            tenancy,
        }))
    }
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// How far a stop has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    /// The listeners have closed; open connections finish their requests.
    Closed,
    /// Past the deadline and its grace: whatever is still open is dropped.
    Abandoned,
}

/// How long cut streams get to send their last event before their connections are dropped.
const CUT_GRACE: Duration = Duration::from_secs(2);

/// How long a stopping gateway waits for its usage journal to ship.
const JOURNAL_FLUSH: Duration = Duration::from_secs(5);

/// Waits for `shutdown`, then walks the drain: not ready, closed, cut, abandoned.
async fn stop_in_phases(
    shutdown: impl Future<Output = ()>,
    lifecycle: Lifecycle,
    drain: crate::routes::settings::Drain,
    phase: tokio::sync::watch::Sender<Phase>,
) {
    shutdown.await;
    lifecycle.drain();
    tracing::info!(
        delay_ms = drain.delay.as_millis() as u64,
        timeout_ms = drain.timeout.as_millis() as u64,
        "draining: /ready answers 503"
    );
    tokio::time::sleep(drain.delay).await;
    let _ = phase.send(Phase::Closed);
    tokio::time::sleep(drain.timeout).await;
    tracing::warn!("drain deadline reached: ending the generations still running");
    lifecycle.cut();
    tokio::time::sleep(CUT_GRACE).await;
    let _ = phase.send(Phase::Abandoned);
}

/// Completes once the stop has reached `at`.
async fn reached(mut phase: tokio::sync::watch::Receiver<Phase>, at: Phase) {
    if phase.wait_for(|p| *p >= at).await.is_err() {
        // The stopper is gone without getting there: never.
        std::future::pending::<()>().await;
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
