//! The accept loop: HTTP/1.1 connections with the bounds an exposed server needs. It owns its
//! settings ([`ConnectionLimits`]) and knows nothing of the application it serves, so the
//! configuration composes it and the server runs it.
//!
//! `axum::serve` has no header-read timeout and no cap on connections, so a client that opens
//! connections and never finishes its headers (slowloris) holds a file descriptor each for as
//! long as it likes. Here every connection is served by hyper with a header-read timeout (which
//! also closes an idle keep-alive connection waiting for its next request), at most
//! `max_connections` HTTP connections are open at once (an upgraded WebSocket is bounded by its
//! own limit) (one more is accepted and closed at once, so the kernel's
//! backlog never fills with them), and each cut is counted in
//! `turnpike_http_connections_closed_total`. The whole-body deadline lives with the request
//! (see [`crate::body`]).
//!
//! With [`tls::TlsSource`] every connection first completes a TLS handshake, within the same
//! header-read timeout; one that fails is counted (`tls_handshake`) and closed.
//!
//! Shutdown stops accepting, asks every open connection to finish its request in flight, and
//! returns once all have.

pub mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::observability::metrics;

/// The client certificate a TLS connection presented and the server verified: a request
/// extension on every request of that connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// `sha256:<hex>` of the leaf certificate (DER).
    pub fingerprint: String,
}

impl ClientCertificate {
    /// The verified leaf certificate of a completed handshake, if the client sent one.
    fn of(connection: &rustls::ServerConnection) -> Option<Self> {
        use sha2::Digest as _;
        let leaf = connection.peer_certificates()?.first()?;
        let hex: String = sha2::Sha256::digest(leaf.as_ref())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(Self {
            fingerprint: format!("sha256:{hex}"),
        })
    }
}

/// Bounds on connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open HTTP connections at most (one upgraded to a WebSocket leaves this count for
    /// `server.websocket_max_connections`).
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (and may sit idle between
    /// requests).
    pub header_read_timeout: Duration,
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &ConnectionLimits,
    tls: Option<Arc<tls::TlsSource>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a clone; `recv` ends once all are gone.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            metrics::connection_closed("limit");
            drop(tcp);
            continue;
        };
        // Token streams are many small writes: without TCP_NODELAY, Nagle's algorithm holds each
        // one until the client's delayed ACK (tens of milliseconds).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let alive = alive_tx.clone();
        match &tls {
            None => {
                let task = connection(&builder, tcp, app.clone(), stop_rx.clone());
                tokio::spawn(async move {
                    task.await;
                    drop((permit, alive));
                });
            }
            Some(source) => {
                let (builder, app, stop) = (builder.clone(), app.clone(), stop_rx.clone());
                let acceptor = source.acceptor();
                let handshake_timeout = limits.header_read_timeout;
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let app = match ClientCertificate::of(stream.get_ref().1) {
                                Some(certificate) => app.layer(axum::Extension(certificate)),
                                None => app,
                            };
                            connection(&builder, stream, app, stop).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            metrics::connection_closed("tls_handshake");
                        }
                        Err(_) => metrics::connection_closed("tls_handshake"),
                    }
                    drop((permit, alive));
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let _ = alive_rx.recv().await;
}

/// Serves one connection until it closes, or finishes its request in flight once `stop` says so.
fn connection<Io>(
    builder: &http1::Builder,
    io: Io,
    app: Router,
    mut stop: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + 'static
where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    async move {
        let _open = metrics::OpenGuard::connection();
        tokio::pin!(conn);
        let stopping = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let served = tokio::select! {
            served = conn.as_mut() => served,
            () = stopping => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = served {
            if e.is_timeout() {
                metrics::connection_closed("header_timeout");
            } else {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
    }
}
