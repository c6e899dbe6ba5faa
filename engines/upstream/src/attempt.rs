//! One leg of a request on one replica: send it, read the node's stream, hand each token to the
//! sink under its original choice, and say how it ended. What happens next (another replica,
//! a resumption, the end) is `run`'s decision.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::sync::Notify;
use turnpike_engine_api::Status;
use turnpike_engine_api::plugin::{Request, Sink};

use crate::Model;
use crate::delivered::{Delivered, Leg, LegProgress};
use crate::lines::{Lines, MAX_LINE_BYTES, TooLong};
use crate::pool::Replica;
use crate::run::HttpClient;

/// How a leg on one replica ended.
pub(crate) enum Attempt {
    /// The node finished the leg (the sink comes back: other legs may follow).
    Done(Sink),
    /// The request ended (cancelled): the sink is spent.
    Ended,
    /// The replica failed; `tokens` is how many the leg had delivered, `charge` whether its
    /// breaker counts it (not when the node itself reported the error).
    Failed {
        why: String,
        sink: Sink,
        tokens: u32,
        charge: bool,
    },
    /// The node refused the request itself (4xx): no replica would take it.
    Refused(Status, String, Sink),
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

/// Everything one attempt reads.
pub(crate) struct Target<'a> {
    pub client: &'a HttpClient,
    pub model: &'a Model,
    pub replica: &'a Replica,
    pub req: &'a Request,
    pub cancel: &'a Notify,
}

/// Runs `leg` on the target's replica.
pub(crate) async fn attempt(
    t: Target<'_>,
    leg: &Leg,
    delivered: &mut Delivered,
    mut sink: Sink,
) -> Attempt {
    let c = &t.model.config;
    let started = Instant::now();
    let stall = limit(c.stall_timeout_ms);
    // Until the first token: the first-token limit from the start; then the stall limit from
    // the newest token.
    let mut deadline = limit(c.first_token_timeout_ms).map(|d| started + d);
    let mut builder = hyper::Request::post(format!("{}{}", t.replica.url, c.protocol.path()))
        .header("content-type", "application/json");
    if let Some(key) = &c.api_key {
        builder = builder.header("authorization", format!("Bearer {}", key.0));
    }
    if !t.req.trace_context.is_empty() {
        // The gateway's trace goes on to the server (W3C trace context).
        builder = builder.header("traceparent", t.req.trace_context.as_str());
    }
    let request = match builder.body(Full::new(leg.body.clone())) {
        Ok(r) => r,
        Err(e) => return Attempt::Refused(Status::Internal, e.to_string(), sink),
    };
    let failed = |why: String, sink: Sink, tokens: u32| Attempt::Failed {
        why,
        sink,
        tokens,
        charge: true,
    };
    let silent = format!("no first token within {} ms", c.first_token_timeout_ms);
    let response = tokio::select! {
        r = t.client.request(request) => r,
        () = t.cancel.notified() => {
            sink.cancelled(delivered.usage);
            return Attempt::Ended;
        }
        () = expiry(deadline) => return failed(silent, sink, 0),
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => return failed(format!("cannot reach it: {e}"), sink, 0),
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
            failed(format!("{status}: {why}"), sink, 0)
        };
    }
    let mut p = LegProgress::new(leg);
    let mut lines = Lines::new(MAX_LINE_BYTES);
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            () = t.cancel.notified() => {
                drop(body);
                sink.cancelled(delivered.usage);
                return Attempt::Ended;
            }
            () = expiry(deadline) => {
                // Dropping the body closes the connection: the node's cancel.
                let why = match p.tokens {
                    0 => silent,
                    _ => format!("no token for {} ms", c.stall_timeout_ms),
                };
                return failed(why, sink, p.tokens);
            }
        };
        let Some(frame) = frame else { break };
        let data = match frame {
            Ok(frame) => frame.into_data().unwrap_or_default(),
            Err(e) => return failed(format!("the stream broke: {e}"), sink, p.tokens),
        };
        lines.push(&data);
        loop {
            let line = match lines.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(TooLong(bytes)) => {
                    let why = format!("a line passed {MAX_LINE_BYTES} bytes ({bytes})");
                    return failed(why, sink, p.tokens);
                }
            };
            let Some(payload) = line.strip_prefix(b"data: ") else {
                continue;
            };
            let payload = payload.trim_ascii_end();
            if payload == b"[DONE]" {
                return done(leg, &p, delivered, sink);
            }
            let seen = |index: usize| p.seen.get(index).copied().unwrap_or(0);
            let chunk = match c.protocol.chunk(payload, seen) {
                Ok(c) => c,
                Err(why) => {
                    return Attempt::Failed {
                        why,
                        sink,
                        tokens: p.tokens,
                        charge: false,
                    };
                }
            };
            let first = p.tokens == 0;
            if delivered.deliver(leg, &mut p, &mut sink, chunk) {
                deadline = stall.map(|d| Instant::now() + d);
                if first {
                    first_token(t.model, t.replica, leg, started);
                }
            }
            if p.stopped_here && delivered.open_choices(leg).is_empty() {
                // Dropping the body closes the connection: the node's cancel.
                return done(leg, &p, delivered, sink);
            }
        }
    }
    done(leg, &p, delivered, sink)
}

/// The leg's first token: the replica's time to it, and a resumption's added latency.
fn first_token(model: &Model, replica: &Replica, leg: &Leg, started: Instant) {
    replica
        .first_token_us
        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    if let Some(at) = leg.resumed.as_ref().map(|r| r.at) {
        model.resumptions.fetch_add(1, Ordering::Relaxed);
        model
            .resume_us
            .fetch_add(at.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

/// The node's stream ended: its open choices end as its last one did; a stream that ended
/// before anything is a failure.
fn done(leg: &Leg, p: &LegProgress, delivered: &mut Delivered, mut sink: Sink) -> Attempt {
    let open = delivered.open_choices(leg);
    if p.tokens == 0 && open.len() == leg.choices.len() {
        return Attempt::Failed {
            why: "the stream ended before any token".into(),
            sink,
            tokens: 0,
            charge: true,
        };
    }
    for c in open {
        delivered.end(c, p.last, &mut sink);
    }
    Attempt::Done(sink)
}
