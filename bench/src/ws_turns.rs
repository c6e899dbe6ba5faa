//! WebSocket turn load: `CONNECTIONS` connections each send one message, read frames until the
//! turn ends (a `[DONE]` frame, or an event of type `response.completed`, `response.incomplete`,
//! `response.failed` or `error`), and go again, for `SECONDS` after a one-second warm-up. The
//! same tool drives every server in `bench/run-responses.sh`, as oha does for HTTP.
//!
//! ```text
//! ws-turns URL MESSAGE_JSON CONNECTIONS SECONDS [BEARER_TOKEN]
//! ```
//!
//! Prints one JSON object: turns, errors, turns per second, and p50 / p99 turn latency in ms.

// A command-line tool: its output is its result.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// What one connection measured.
#[derive(Default)]
struct Measured {
    latencies_ms: Vec<f64>,
    errors: u64,
}

/// Whether `text`, one frame, ends a turn; and whether as an error.
fn ends_turn(text: &str) -> Option<bool> {
    if text == "[DONE]" {
        return Some(false);
    }
    // Only a frame that may end the turn is parsed: the load tool must not cost more than the
    // server it measures.
    let ends = [
        "response.completed",
        "response.incomplete",
        "response.failed",
        "\"error\"",
    ];
    if !ends.iter().any(|end| text.contains(end)) {
        return None;
    }
    let value: Value = serde_json::from_str(text).ok()?;
    match value.get("type").and_then(Value::as_str)? {
        "response.completed" | "response.incomplete" => Some(false),
        "response.failed" | "error" => Some(true),
        _ => None,
    }
}

async fn connection(
    url: String,
    message: String,
    token: Option<String>,
    warm_until: Instant,
    stop_at: Instant,
) -> Result<Measured, String> {
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(token) = token {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| e.to_string())?;
        request.headers_mut().insert("authorization", value);
    }
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| e.to_string())?;
    let mut measured = Measured::default();
    while Instant::now() < stop_at {
        let sent = Instant::now();
        socket
            .send(Message::text(message.clone()))
            .await
            .map_err(|e| e.to_string())?;
        let failed = loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    if let Some(failed) = ends_turn(&text) {
                        break failed;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("the server closed the connection".into()),
            }
        };
        if sent >= warm_until {
            if failed {
                measured.errors += 1;
            } else {
                measured
                    .latencies_ms
                    .push(sent.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    let _ = socket.close(None).await;
    Ok(measured)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, message, connections, seconds, rest @ ..] = args.as_slice() else {
        return Err("usage: ws-turns URL MESSAGE_JSON CONNECTIONS SECONDS [BEARER_TOKEN]".into());
    };
    let connections: usize = connections.parse().map_err(|_| "CONNECTIONS: a number")?;
    let seconds: f64 = seconds.parse().map_err(|_| "SECONDS: a number")?;
    let token = rest.first().cloned();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + Duration::from_secs_f64(seconds);
    let results = runtime.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|_| {
                tokio::spawn(connection(
                    url.clone(),
                    message.clone(),
                    token.clone(),
                    warm_until,
                    stop_at,
                ))
            })
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.map_err(|e| e.to_string()).and_then(|r| r));
        }
        results
    });
    let mut latencies = Vec::new();
    let (mut errors, mut failed_connections) = (0, 0);
    for result in results {
        match result {
            Ok(m) => {
                latencies.extend(m.latencies_ms);
                errors += m.errors;
            }
            Err(e) => {
                failed_connections += 1;
                eprintln!("connection failed: {e}");
            }
        }
    }
    latencies.sort_by(f64::total_cmp);
    let report = json!({
        "connections": connections,
        "failed_connections": failed_connections,
        "seconds": seconds,
        "turns": latencies.len(),
        "errors": errors,
        "turns_per_s": latencies.len() as f64 / seconds,
        "p50_ms": percentile(&latencies, 0.50),
        "p99_ms": percentile(&latencies, 0.99),
    });
    println!("{report}");
    Ok(())
}
