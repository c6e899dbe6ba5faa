//! One request's life: pick a replica, stream the request from it in the pool's protocol, hand
//! each token to the sink;
//! on a failure before the first token (no connection, a refusal, an error event, a stream that
//! ends early, no first token within `first_token_timeout_ms`) mark the replica and try
//! another, up to the model's `retries`; after the first token a failure (a broken stream, no
//! token for `stall_timeout_ms`) marks the replica and ends the request (its tokens were sent).
//! Either way a replica that accepts requests and never answers opens its breaker. Cancelling
//! drops the connection, which the node takes as its cancel. A stop token the node streams
//! (llama-server has no stop ids) ends its choice here, and the connection is closed when every
//! choice has ended so.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;
use tokio::sync::Notify;
use turnpike_engine_api::plugin::{Request, Sink};
use turnpike_engine_api::{Finish, Status, TopLogprob, Usage};

use crate::Model;
use crate::lines::{Lines, MAX_LINE_BYTES, TooLong};
use crate::pool::Replica;
use crate::wire;

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How an attempt on one replica ended.
enum Attempt {
    /// The request completed well.
    Done,
    /// The request ended otherwise (cancelled, or by the node's own error after its first
    /// token): nothing to retry.
    Ended,
    /// The replica failed after the first token (the request ended with an error).
    Broke,
    /// Nothing was sent yet; another replica may serve it (the sink comes back).
    Retry(String, Sink),
    /// The node refused the request itself (4xx): no replica would take it.
    Refused(Status, String, Sink),
}

/// Runs `req` on `model`'s pool to its end.
pub(crate) async fn run(
    client: HttpClient,
    model: Arc<Model>,
    req: Request,
    body: Bytes,
    mut sink: Sink,
    cancel: Arc<Notify>,
) {
    let mut tried: Vec<Arc<Replica>> = Vec::new();
    let mut last_error = String::new();
    loop {
        let Some(replica) = model.pool.pick(&req.prompt, &tried) else {
            let why = if last_error.is_empty() {
                format!(
                    "no replica of model `{}` is available (every breaker is open)",
                    model.config.id
                )
            } else {
                format!(
                    "no replica of model `{}` could serve the request: {last_error}",
                    model.config.id
                )
            };
            return sink.fail(Status::Unavailable, why, Usage::default());
        };
        tried.push(Arc::clone(&replica));
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.requests.fetch_add(1, Ordering::Relaxed);
        let outcome = attempt(&client, &model, &replica, &body, &req, sink, &cancel).await;
        replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        let c = &model.config;
        let cooldown = Duration::from_millis(c.breaker_cooldown_ms);
        match outcome {
            Attempt::Done => return replica.succeeded(),
            Attempt::Ended => return replica.released(),
            Attempt::Broke => return replica.failed(c.breaker_failures, cooldown),
            Attempt::Refused(status, why, back) => {
                replica.released();
                return back.fail(status, why, Usage::default());
            }
            Attempt::Retry(why, back) => {
                sink = back;
                replica.failed(c.breaker_failures, cooldown);
                last_error = format!("{}: {why}", replica.url);
                model.host.warn(&format!(
                    "upstream model `{}`: replica {last_error} (before the first token)",
                    c.id
                ));
                if tried.len() > c.retries as usize {
                    return sink.fail(Status::Unavailable, last_error, Usage::default());
                }
            }
        }
    }
}

/// Per-choice progress of a streamed answer.
struct Progress {
    seen: Vec<usize>,
    ended: Vec<bool>,
    usage: Usage,
    last: Finish,
    /// Tokens that end a choice when a node streams one.
    stops: Vec<u32>,
    /// Alternatives asked for per token.
    top_logprobs: usize,
    /// Some choice ended here on a stop token, not by the node.
    stopped_here: bool,
}

/// A limit in milliseconds, 0 for none.
fn limit(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Waits until `deadline`, or for ever without one.
async fn expiry(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

async fn attempt(
    client: &HttpClient,
    model: &Model,
    replica: &Replica,
    body: &Bytes,
    req: &Request,
    mut sink: Sink,
    cancel: &Notify,
) -> Attempt {
    let c = &model.config;
    let protocol = c.protocol;
    let started = Instant::now();
    let first_token = limit(c.first_token_timeout_ms);
    let stall = limit(c.stall_timeout_ms);
    // Until the first token: the first-token limit from the start; then the stall limit from
    // the newest token.
    let mut deadline = first_token.map(|d| started + d);
    let mut builder = hyper::Request::post(format!("{}{}", replica.url, protocol.path()))
        .header("content-type", "application/json");
    if let Some(key) = &c.api_key {
        builder = builder.header("authorization", format!("Bearer {}", key.0));
    }
    if !req.trace_context.is_empty() {
        // The gateway's trace goes on to the server (W3C trace context).
        builder = builder.header("traceparent", req.trace_context.as_str());
    }
    let request = match builder.body(Full::new(body.clone())) {
        Ok(r) => r,
        Err(e) => return Attempt::Refused(Status::Internal, e.to_string(), sink),
    };
    let silent = |ms: u64| format!("no first token within {ms} ms");
    let response = tokio::select! {
        r = client.request(request) => r,
        () = cancel.notified() => {
            sink.cancelled(Usage::default());
            return Attempt::Ended;
        }
        () = expiry(deadline) => {
            return Attempt::Retry(silent(c.first_token_timeout_ms), sink);
        }
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => return Attempt::Retry(format!("cannot reach it: {e}"), sink),
    };
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let text = tokio::select! {
            b = body.collect() => b.map(|b| b.to_bytes()).unwrap_or_default(),
            () = expiry(deadline) => Bytes::new(),
        };
        let why = String::from_utf8_lossy(&text)
            .chars()
            .take(300)
            .collect::<String>();
        // 401 and 403 say the front's key is wrong for this node, not the request: like a 429,
        // another replica may take it, and the breaker learns of it.
        return if status.is_client_error() && !matches!(status.as_u16(), 401 | 403 | 429) {
            Attempt::Refused(
                Status::InvalidRequest,
                format!("the node refused it ({status}): {why}"),
                sink,
            )
        } else {
            Attempt::Retry(format!("{status}: {why}"), sink)
        };
    }
    let n = req.params.n.max(1) as usize;
    let mut stops = req.params.stop_token_ids.clone();
    if !req.params.ignore_eos {
        stops.extend(&c.eos_token_ids);
    }
    let mut p = Progress {
        seen: vec![0; n],
        ended: vec![false; n],
        usage: Usage {
            prompt_tokens: req.prompt.len() as u32,
            ..Usage::default()
        },
        last: Finish::default(),
        stops,
        top_logprobs: req.params.top_logprobs as usize,
        stopped_here: false,
    };
    let mut lines = Lines::new(MAX_LINE_BYTES);
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            () = cancel.notified() => {
                drop(body);
                sink.cancelled(p.usage);
                return Attempt::Ended;
            }
            () = expiry(deadline) => {
                // Dropping the body closes the connection: the node's cancel.
                return match p.usage.completion_tokens {
                    0 => Attempt::Retry(silent(c.first_token_timeout_ms), sink),
                    _ => after_start(&p, sink, format!("no token for {} ms", c.stall_timeout_ms)),
                };
            }
        };
        let Some(frame) = frame else { break };
        let data = match frame {
            Ok(frame) => frame.into_data().unwrap_or_default(),
            Err(e) => return after_start(&p, sink, format!("the stream broke: {e}")),
        };
        lines.push(&data);
        loop {
            let line = match lines.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(TooLong(bytes)) => {
                    let why = format!("a line passed {MAX_LINE_BYTES} bytes ({bytes})");
                    return after_start(&p, sink, why);
                }
            };
            let Some(payload) = line.strip_prefix(b"data: ") else {
                continue;
            };
            let payload = payload.trim_ascii_end();
            if payload == b"[DONE]" {
                return finish(&p, sink);
            }
            let value: Value = match serde_json::from_slice(payload) {
                Ok(v) => v,
                Err(e) => return after_start(&p, sink, format!("a chunk is not JSON: {e}")),
            };
            let index = value["index"].as_u64().unwrap_or(0) as usize;
            let chunk = match protocol.chunk(&value, p.seen.get(index).copied().unwrap_or(0)) {
                Ok(c) => c,
                Err(why) => return node_error(&p, sink, why),
            };
            let first = p.usage.completion_tokens == 0;
            if deliver(&mut p, &mut sink, chunk) {
                deadline = stall.map(|d| Instant::now() + d);
                if first {
                    replica
                        .first_token_us
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
            }
            if p.stopped_here && p.ended.iter().all(|e| *e) {
                // Dropping the body closes the connection: the node's cancel.
                return finish(&p, sink);
            }
        }
    }
    finish(&p, sink)
}

/// Sends a chunk's tokens and ends its choice when it says so; whether it held tokens.
fn deliver(p: &mut Progress, sink: &mut Sink, chunk: wire::Chunk) -> bool {
    let c = chunk.index as usize;
    // Usage may come on its own, after every choice ended (vLLM).
    p.usage.prompt_tokens = chunk.prompt_tokens.max(p.usage.prompt_tokens);
    p.usage.cached_prompt_tokens = chunk.cached_tokens.max(p.usage.cached_prompt_tokens);
    if c >= p.seen.len() || p.ended[c] {
        return false;
    }
    let any = !chunk.tokens.is_empty();
    let mut finish = chunk.finish;
    for token in chunk.tokens {
        p.seen[c] += 1;
        if p.stops.contains(&token.id) {
            finish = Some(Finish::stop(token.id));
            p.stopped_here = true;
            break;
        }
        let top: Vec<TopLogprob> = token
            .top
            .into_iter()
            .take(p.top_logprobs)
            .map(|(token_id, logprob)| TopLogprob { token_id, logprob })
            .collect();
        sink.token_with_logprobs(chunk.index, token.id, token.logprob, &top);
        p.usage.completion_tokens += 1;
    }
    if let Some(finish) = finish {
        p.ended[c] = true;
        p.last = finish;
        if p.ended.iter().any(|e| !e) {
            sink.end_choice(chunk.index, finish);
        }
    }
    any
}

/// The stream ended: the request is complete.
fn finish(p: &Progress, sink: Sink) -> Attempt {
    if p.usage.completion_tokens == 0 && p.ended.iter().all(|e| !e) {
        return Attempt::Retry("the stream ended before any token".into(), sink);
    }
    sink.complete(p.last, p.usage);
    Attempt::Done
}

/// The replica failed: retried while nothing was sent, else the request's end (and a failure
/// counted against the replica).
fn after_start(p: &Progress, sink: Sink, why: String) -> Attempt {
    if p.usage.completion_tokens == 0 {
        return Attempt::Retry(why, sink);
    }
    sink.fail(
        Status::Internal,
        format!("the node failed mid-stream: {why}"),
        p.usage,
    );
    Attempt::Broke
}

/// The node reported an error in its stream: retried while nothing was sent, else the
/// request's end (the node answered; its breaker is not charged).
fn node_error(p: &Progress, sink: Sink, why: String) -> Attempt {
    match after_start(p, sink, why) {
        Attempt::Broke => Attempt::Ended,
        other => other,
    }
}
