//! `mixed-load`: a steady mix of the gateway's protocols at a fixed rate, for the soak
//! (`bench/run-soak.sh mixed`): chat completions plain and streamed, Responses (stored, so the
//! response store fills), Anthropic Messages, embeddings, and chat with a fresh
//! `Idempotency-Key` each (so the idempotency table fills). Each connection sends its share of
//! the rate, one request after another, and reads every answer to its end.
//!
//! ```text
//! mixed-load BASE_URL MODEL RATE CONNECTIONS SECONDS
//! ```
//!
//! Prints one JSON object: requests and status codes per kind, transport errors, the rate
//! reached.

// A command-line tool: its report is its output.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One kind of request in the mix: its name, path, and body for the `i`th request.
struct Kind {
    name: &'static str,
    path: &'static str,
    body: fn(&str, u64) -> Value,
    idempotent: bool,
}

const KINDS: [Kind; 6] = [
    Kind {
        name: "chat",
        path: "/v1/chat/completions",
        body: |m, i| json!({"model": m, "max_tokens": 20, "messages": [{"role": "user", "content": format!("Hello, how are you today? ({i})")}]}),
        idempotent: false,
    },
    Kind {
        name: "chat_stream",
        path: "/v1/chat/completions",
        body: |m, i| {
            json!({"model": m, "max_tokens": 20, "stream": true, "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": format!("Tell me a short story ({i})")}]})
        },
        idempotent: false,
    },
    Kind {
        name: "responses",
        path: "/v1/responses",
        body: |m, i| json!({"model": m, "max_output_tokens": 20, "input": format!("Summarise the day ({i})")}),
        idempotent: false,
    },
    Kind {
        name: "messages",
        path: "/v1/messages",
        body: |m, i| {
            json!({"model": m, "max_tokens": 20, "metadata": {"user_id": format!("user-{}", i % 100)},
                   "messages": [{"role": "user", "content": format!("Hello there ({i})")}]})
        },
        idempotent: false,
    },
    Kind {
        name: "embeddings",
        path: "/v1/embeddings",
        body: |m, i| json!({"model": m, "input": [format!("the river ({i})"), "under the old stone bridge"]}),
        idempotent: false,
    },
    Kind {
        name: "idempotent_chat",
        path: "/v1/chat/completions",
        body: |m, i| json!({"model": m, "max_tokens": 20, "messages": [{"role": "user", "content": format!("Retry-safe ({i})")}]}),
        idempotent: true,
    },
];

#[derive(Default)]
struct Tally {
    statuses: BTreeMap<String, BTreeMap<u16, u64>>,
    errors: BTreeMap<String, u64>,
    sent: u64,
}

async fn one(
    client: &HttpClient,
    base: &str,
    model: &str,
    kind: &Kind,
    i: u64,
    run: u64,
) -> Result<u16, String> {
    let body = (kind.body)(model, i).to_string();
    let mut request = hyper::Request::post(format!("{base}{}", kind.path))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-soak");
    if kind.path == "/v1/messages" {
        request = request.header("anthropic-version", "2023-06-01");
    }
    if kind.idempotent {
        request = request.header("idempotency-key", format!("soak-{run}-{i}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    Ok(status)
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, base, model, rate, connections, seconds] = args.as_slice() else {
        return Err("usage: mixed-load BASE_URL MODEL RATE CONNECTIONS SECONDS".into());
    };
    let rate: f64 = rate.parse().map_err(|_| "RATE is a number")?;
    let connections: u64 = connections.parse().map_err(|_| "CONNECTIONS is a number")?;
    let seconds: u64 = seconds.parse().map_err(|_| "SECONDS is a number")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    runtime.block_on(async {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let period = Duration::from_secs_f64(connections as f64 / rate);
        let end = started + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                let (client, tally, base, model) = (
                    client.clone(),
                    Arc::clone(&tally),
                    base.clone(),
                    model.clone(),
                );
                tokio::spawn(async move {
                    let mut next = Instant::now() + period.mul_f64(c as f64 / connections as f64);
                    let mut i = c;
                    while next < end {
                        tokio::time::sleep_until(next.into()).await;
                        next += period;
                        let kind = &KINDS[(i / connections % KINDS.len() as u64) as usize];
                        let outcome = one(&client, &base, &model, kind, i, run).await;
                        let mut t = tally
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        t.sent += 1;
                        match outcome {
                            Ok(status) => {
                                *t.statuses
                                    .entry(kind.name.to_string())
                                    .or_default()
                                    .entry(status)
                                    .or_default() += 1;
                            }
                            Err(e) => {
                                *t.errors.entry(format!("{}: {e}", kind.name)).or_default() += 1
                            }
                        }
                        i += connections;
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    });
    let t = tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let elapsed = started.elapsed().as_secs_f64();
    let report = json!({
        "seconds": elapsed,
        "requests": t.sent,
        "req_per_s": t.sent as f64 / elapsed,
        "statuses": t.statuses,
        "errors": t.errors,
    });
    println!("{report}");
    Ok(())
}
