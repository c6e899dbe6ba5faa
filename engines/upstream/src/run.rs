//! One request's life: pick a replica, run the request there ([`attempt`]), and when a replica
//! fails, go on elsewhere.
//!
//! - **Before a leg's first token** (no connection, a refusal, an error event, a stream that
//!   ends early, no first token within `first_token_timeout_ms`) the same leg is tried on
//!   another replica.
//! - **After it** (a broken stream, an error event, no token for `stall_timeout_ms`), with
//!   `mid_stream_failover`, each unfinished choice of the leg becomes a resumption: its prompt
//!   followed by exactly the tokens it delivered, the budget left, and for Turnpike nodes a
//!   `resume` that carries its penalties, grammar and seed on
//!   ([`turnpike_engine_api::resume`]). The caller's stream goes on with no gap, repeat or
//!   error; usage counts each token once. A grammar cannot be carried by the other protocols,
//!   so there such a request ends with an error, as it does without failover.
//!
//! Failures are bounded by `retries` per request. A replica that accepts requests and never
//! answers opens its breaker. Cancelling drops the connection, which the node takes as its
//! cancel. A sampled request without a seed gets one here when it may fail over, so a resumed
//! choice continues the same random stream. A stop token the node streams (llama-server has
//! no stop ids) ends its choice here, and the connection is closed when every choice of the
//! leg has ended so.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::Notify;
use turnpike_engine_api::Status;
use turnpike_engine_api::plugin::{Request, Sink};
use turnpike_engine_api::resume::continuation;

use crate::Model;
use crate::attempt::{Attempt, Target, attempt};
use crate::consult::Advice;
use crate::delivered::{Delivered, Leg, Resumed};
use crate::pool::Replica;

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Runs `req` on `model`'s pool to its end; `body` is its first leg's.
pub(crate) async fn run(
    client: HttpClient,
    model: Arc<Model>,
    req: Request,
    body: Bytes,
    mut sink: Sink,
    cancel: Arc<Notify>,
) {
    let c = &model.config;
    let cooldown = Duration::from_millis(c.breaker_cooldown_ms);
    let mut delivered = Delivered::new(&req, &c.eos_token_ids);
    let mut legs = VecDeque::from([Leg::first(&req, body)]);
    let mut failed: Vec<Arc<Replica>> = Vec::new();
    let mut served: Vec<String> = Vec::new();
    let mut last_error = String::new();
    let mut advice = match &model.picker {
        Some(picker) => {
            let name = c.upstream_model.as_deref().unwrap_or(&c.id);
            picker
                .advise(name, &req.prompt, req.params.tenant.as_deref())
                .await
        }
        None => Advice::default(),
    };
    if advice.shed {
        let why = "the endpoint picker shed the request: every replica is busy";
        return sink.fail(Status::Overloaded, why, delivered.usage);
    }
    while let Some(leg) = legs.pop_front() {
        let prompt = leg.prompt(&req);
        let advised = advice.next(&model.pool, &failed).or_else(|| {
            let view = model.cache_view.as_ref()?;
            view.best(&model.pool, prompt, &failed)
        });
        let Some(replica) = advised.or_else(|| model.pool.pick(prompt, &failed)) else {
            return unavailable(&model, &delivered, sink, &last_error);
        };
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.requests.fetch_add(1, Ordering::Relaxed);
        let target = Target {
            client: &client,
            model: &model,
            replica: &replica,
            req: &req,
            cancel: &cancel,
        };
        let outcome = attempt(target, &leg, &mut delivered, sink).await;
        replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        let (why, back, tokens) = match outcome {
            Attempt::Done(back) => {
                replica.succeeded();
                note_served(&mut served, &replica);
                sink = back;
                continue;
            }
            Attempt::Ended => return replica.released(),
            Attempt::Refused(status, why, back) => {
                replica.released();
                return back.fail(status, why, delivered.usage);
            }
            Attempt::Failed {
                why,
                sink: back,
                tokens,
                charge,
            } => {
                if charge {
                    replica.failed(c.breaker_failures, cooldown);
                } else {
                    replica.released();
                }
                (why, back, tokens)
            }
        };
        sink = back;
        last_error = format!("{}: {why}", replica.url);
        failed.push(Arc::clone(&replica));
        if tokens > 0 {
            note_served(&mut served, &replica);
        }
        let over = failed.len() > c.retries as usize;
        if tokens == 0 {
            // Nothing of this leg was sent: the same leg, elsewhere.
            model.host.warn(&format!(
                "upstream model `{}`: replica {last_error} (before the leg's first token)",
                c.id
            ));
            if over {
                return unavailable(&model, &delivered, sink, &last_error);
            }
            legs.push_front(leg);
            continue;
        }
        if let Err(why) = resumable(&model, &req, over) {
            let why = format!("the node failed mid-stream: {last_error} ({why})");
            return sink.fail(Status::Internal, why, delivered.usage);
        }
        let at = Instant::now();
        for choice in delivered.open_choices(&leg) {
            let output = delivered.outputs.of(choice);
            model.host.warn(&format!(
                "upstream model `{}`: request {} choice {choice} resumes after {} tokens: replica {last_error}",
                c.id,
                req.params.request_id.as_deref().unwrap_or("-"),
                output.len(),
            ));
            match resumption(&model, &req, choice, output, at) {
                Ok(Some(leg)) => legs.push_back(leg),
                // Its budget is spent: it ended by length as the node failed.
                Ok(None) => delivered.end(choice, turnpike_engine_api::Finish::length(), &mut sink),
                Err(why) => return sink.fail(Status::Internal, why, delivered.usage),
            }
        }
    }
    if served.len() > 1 {
        model.host.info(&format!(
            "upstream model `{}`: request {} served by {}",
            c.id,
            req.params.request_id.as_deref().unwrap_or("-"),
            served.join(", ")
        ));
    }
    sink.complete(delivered.outputs.last(), delivered.usage);
}

/// Remembers a replica that delivered tokens, once.
fn note_served(served: &mut Vec<String>, replica: &Replica) {
    if !served.contains(&replica.url) {
        served.push(replica.url.clone());
    }
}

/// Whether a request whose replica failed after tokens may go on elsewhere.
fn resumable(model: &Model, req: &Request, over: bool) -> Result<(), &'static str> {
    let c = &model.config;
    if !c.mid_stream_failover {
        return Err("mid_stream_failover is off");
    }
    if over {
        return Err("no retries left");
    }
    if req.params.grammar.is_some() && !c.protocol.resumes_exactly() {
        return Err("this protocol cannot carry a grammar's state");
    }
    Ok(())
}

/// The leg that continues `choice` after `output`; `None` when its budget is spent.
fn resumption(
    model: &Model,
    req: &Request,
    choice: u32,
    output: &[u32],
    at: Instant,
) -> Result<Option<Leg>, String> {
    let c = &model.config;
    let exact = c.protocol.resumes_exactly();
    let Some((prompt, params)) = continuation(&req.prompt, &req.params, choice, output, exact)
    else {
        return Ok(None);
    };
    let resumed = Request {
        id: req.id,
        model: req.model.clone(),
        prompt,
        params,
        trace_context: req.trace_context.clone(),
    };
    let rid = format!("tp-{}-{choice}-{}", req.id, output.len());
    let body = c
        .protocol
        .body(c.upstream_model.as_deref(), &resumed, &rid)
        .map_err(|why| format!("cannot resume choice {choice}: {why}"))?;
    Ok(Some(Leg {
        choices: vec![choice],
        body: Bytes::from(body),
        resumed: Some(Resumed {
            prompt: resumed.prompt,
            at,
        }),
    }))
}

/// No replica can take the request: unavailable before anything was sent, an internal failure
/// after.
fn unavailable(model: &Model, delivered: &Delivered, sink: Sink, last_error: &str) {
    let id = &model.config.id;
    let why = if last_error.is_empty() {
        format!("no replica of model `{id}` is available (every breaker is open)")
    } else {
        format!("no replica of model `{id}` could serve the request: {last_error}")
    };
    let status = if delivered.started() {
        Status::Internal
    } else {
        Status::Unavailable
    };
    sink.fail(status, why, delivered.usage);
}
