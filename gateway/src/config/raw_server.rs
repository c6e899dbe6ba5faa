//! `[server]` as written, and its validation into the HTTP layer's settings (listener, TLS,
//! drain, body and WebSocket limits, CORS origins).

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{CorsOrigins, ServerConfig};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawServer {
    pub(super) listen: Option<String>,
    max_body_bytes: u64,
    stream_heartbeat_ms: u64,
    request_timeout_ms: u64,
    retry_after_ms: u64,
    cors_allowed_origins: Vec<String>,
    websocket_max_connections: u64,
    websocket_max_duration_s: u64,
    websocket_max_per_tenant: u64,
    websocket_idle_timeout_s: u64,
    max_connections: u64,
    header_read_timeout_ms: u64,
    body_read_timeout_ms: u64,
    tls: Option<crate::listener::tls::RawTls>,
    health_listen: Option<String>,
    drain_timeout_ms: u64,
    drain_delay_ms: u64,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: None,
            max_body_bytes: 4 << 20,
            stream_heartbeat_ms: 15_000,
            request_timeout_ms: 60_000,
            retry_after_ms: 1_000,
            cors_allowed_origins: Vec::new(),
            websocket_max_connections: 1024,
            websocket_max_duration_s: 3600,
            websocket_max_per_tenant: 256,
            websocket_idle_timeout_s: 300,
            max_connections: 8192,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 30_000,
            tls: None,
            health_listen: None,
            drain_timeout_ms: 30_000,
            drain_delay_ms: 0,
        }
    }
}

impl RawServer {
    pub(super) fn validate(self, base: &Path) -> Result<ServerConfig, String> {
        let health_listen = match &self.health_listen {
            None => None,
            Some(text) => Some(text.parse().map_err(|e| {
                format!("server.health_listen: `{text}` is not an address like 0.0.0.0:8081 ({e})")
            })?),
        };
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(format!("server.{name} must be greater than 0"))
            } else {
                Ok(v)
            }
        };
        Ok(ServerConfig {
            max_body_bytes: positive("max_body_bytes", self.max_body_bytes)? as usize,
            stream_heartbeat: Duration::from_millis(positive(
                "stream_heartbeat_ms",
                self.stream_heartbeat_ms,
            )?),
            request_timeout: Duration::from_millis(positive(
                "request_timeout_ms",
                self.request_timeout_ms,
            )?),
            retry_after: Duration::from_millis(positive("retry_after_ms", self.retry_after_ms)?),
            cors: cors_origins(&self.cors_allowed_origins)?,
            websocket_max_connections: positive(
                "websocket_max_connections",
                self.websocket_max_connections,
            )? as usize,
            websocket_max_duration: Duration::from_secs(positive(
                "websocket_max_duration_s",
                self.websocket_max_duration_s,
            )?),
            websocket_max_per_tenant: positive(
                "websocket_max_per_tenant",
                self.websocket_max_per_tenant,
            )? as usize,
            websocket_idle_timeout: Duration::from_secs(positive(
                "websocket_idle_timeout_s",
                self.websocket_idle_timeout_s,
            )?),
            connections: crate::listener::ConnectionLimits {
                max_connections: positive("max_connections", self.max_connections)? as usize,
                header_read_timeout: Duration::from_millis(positive(
                    "header_read_timeout_ms",
                    self.header_read_timeout_ms,
                )?),
            },
            body_read_timeout: Duration::from_millis(positive(
                "body_read_timeout_ms",
                self.body_read_timeout_ms,
            )?),
            tls: self.tls.map(|t| t.validate(base)).transpose()?,
            health_listen,
            drain: crate::routes::settings::Drain {
                delay: Duration::from_millis(self.drain_delay_ms),
                timeout: Duration::from_millis(self.drain_timeout_ms),
            },
        })
    }
}

/// `["*"]` for any origin, else each origin as a browser sends it (`Origin` is compared byte for
/// byte): `http(s)://host[:port]`, written here in any case and with or without the scheme's
/// default port, and kept lower-cased without it.
fn cors_origins(list: &[String]) -> Result<CorsOrigins, String> {
    if list.is_empty() {
        return Ok(CorsOrigins::None);
    }
    if list.iter().any(|o| o == "*") {
        return if list.len() == 1 {
            Ok(CorsOrigins::Any)
        } else {
            Err("server.cors_allowed_origins: `*` allows every origin and cannot be listed with others".into())
        };
    }
    list.iter()
        .map(|origin| {
            canonical_origin(origin).ok_or_else(|| {
                format!(
                    "server.cors_allowed_origins: `{origin}` is not an origin like https://app.example.com or http://localhost:3000 (no path, no trailing slash)"
                )
            })
        })
        .collect::<Result<_, _>>()
        .map(CorsOrigins::List)
}

fn canonical_origin(origin: &str) -> Option<String> {
    let lower = origin.to_ascii_lowercase();
    let (scheme, rest, default_port) = if let Some(rest) = lower.strip_prefix("https://") {
        ("https", rest, 443)
    } else {
        ("http", lower.strip_prefix("http://")?, 80)
    };
    let authority: axum::http::uri::Authority = rest.parse().ok()?;
    let host = authority.host();
    let valid = authority.as_str() == rest
        && !rest.contains('@')
        && !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    if !valid {
        return None;
    }
    Some(match authority.port_u16() {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}
