//! What the HTTP layer is configured with: body and WebSocket limits, stream timings, CORS
//! origins, and the connection limits it hands the accept loop. The configuration layer reads
//! these from `[server]` and hands them here.

use std::time::Duration;

/// Server limits and timings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Largest request body; larger is 413.
    pub max_body_bytes: usize,
    /// A stream that sent nothing for this long gets an SSE comment.
    pub stream_heartbeat: Duration,
    /// Longest a request may take from arrival to its last byte.
    pub request_timeout: Duration,
    /// What `retry-after` says on 429 and 503.
    pub retry_after: Duration,
    /// Browser origins allowed to call the API.
    pub cors: CorsOrigins,
    /// Open WebSocket connections at most (Responses and chat); more are refused with
    /// `websocket_connection_limit_reached`.
    pub websocket_max_connections: usize,
    /// How long one WebSocket connection may stay open.
    pub websocket_max_duration: Duration,
    /// Open WebSocket connections one tenant may hold, unless its plan says
    /// (`max_websockets`); more are refused with `websocket_tenant_limit_reached`.
    pub websocket_max_per_tenant: usize,
    /// How long a WebSocket connection may stay open with no turn running and no message.
    pub websocket_idle_timeout: Duration,
    /// Connections at most, and how long a connection may take to send a request's headers.
    pub connections: crate::listener::ConnectionLimits,
    /// How long a request's whole body may take to arrive once its headers have (408 past it).
    pub body_read_timeout: Duration,
    /// TLS on the listener; `None` serves plain HTTP.
    pub tls: Option<crate::listener::tls::TlsSettings>,
    /// A second, plain-HTTP listener that serves only `/health` and `/ready` (for probes inside a
    /// private network when the main listener speaks TLS); off by default.
    pub health_listen: Option<std::net::SocketAddr>,
    /// How the server stops on SIGTERM.
    pub drain: Drain,
}

/// How the server stops on SIGTERM or Ctrl-C: `/ready` answers 503 at once; after `delay` (time
/// for load balancers to notice) it stops accepting and asks open connections to close after
/// their request in flight; streams still running `timeout` later end with a clean error event
/// (their engine work cancelled), and the process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// Between `/ready` turning 503 and the listener closing.
    pub delay: Duration,
    /// How long requests in flight may go on once the listener has closed.
    pub timeout: Duration,
}

/// Browser origins allowed to call the API (CORS).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsOrigins {
    /// None: no CORS headers, browsers refuse cross-origin calls.
    #[default]
    None,
    /// Any origin (`"*"`).
    Any,
    /// These origins, each `scheme://host[:port]`.
    List(Vec<String>),
}
