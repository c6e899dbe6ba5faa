//! One `ext_proc` stream: one HTTP request through the proxy, from its headers to the end of
//! its response.
//!
//! In full-duplex mode (the protocol's own) the picker holds the request headers until the
//! body is whole, chooses, then answers the headers with the destination and hands the body
//! back unchanged; response headers and body chunks pass straight through, and the response
//! headers' served-endpoint feedback moves the request's load to the server that took it. With
//! a buffered body the headers go on at once and the body's answer carries the destination.
//! A request without a body is routed on its headers. The request counts as in flight on its
//! server until the stream ends.

use std::collections::VecDeque;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};

use super::ask::prompt_units;
use super::choose::{Ask, Choice, Lease, Picker};
use super::settings::{as_endpoint, as_url};
use super::wire;

/// One stream's state.
pub(crate) struct Exchange {
    picker: Arc<Picker>,
    /// Answers not yet taken.
    out: VecDeque<ProcessingResponse>,
    duplex_request: bool,
    duplex_response: bool,
    ask: Ask,
    body: Vec<u8>,
    routed: bool,
    lease: Option<Lease>,
}

impl Exchange {
    /// A stream's state before its first message.
    pub(crate) fn new(picker: Arc<Picker>) -> Self {
        Self {
            picker,
            out: VecDeque::new(),
            duplex_request: false,
            duplex_response: false,
            ask: Ask::default(),
            body: Vec::new(),
            routed: false,
            lease: None,
        }
    }

    /// The answers to the messages so far, in order, each taken as the iterator reaches it.
    pub(crate) fn answers(&mut self) -> impl Iterator<Item = ProcessingResponse> + '_ {
        std::iter::from_fn(|| self.out.pop_front())
    }

    /// Handles one message; `false` ends the stream (after its answers are sent).
    pub(crate) fn on(&mut self, message: ProcessingRequest) -> bool {
        if let Some(modes) = &message.protocol_config {
            let duplex = BodySendMode::FullDuplexStreamed as i32;
            self.duplex_request = modes.request_body_mode == duplex;
            self.duplex_response = modes.response_body_mode == duplex;
        }
        let Some(request) = message.request else {
            return true;
        };
        match request {
            Request::RequestHeaders(h) => {
                self.ask.tenant = wire::header(h.headers.as_ref(), wire::FAIRNESS)
                    .unwrap_or_else(|| "default".into());
                self.ask.subset = wire::subset(message.metadata_context.as_ref()).map(|s| {
                    s.iter()
                        .filter_map(|e| as_url(e).ok())
                        .collect::<Vec<String>>()
                });
                if h.end_of_stream {
                    return self.route(None);
                }
                if !self.duplex_request {
                    self.send(wire::request_headers_unchanged());
                }
                true
            }
            Request::RequestBody(b) => {
                if self.routed {
                    // After the choice (a buffered body's later parts): unchanged.
                    self.pass_request_body(b.body, b.end_of_stream);
                    return true;
                }
                if self.body.len() + b.body.len() > self.picker.settings.max_body_bytes {
                    let why = format!(
                        "the request body is over {} bytes",
                        self.picker.settings.max_body_bytes
                    );
                    self.send(wire::refuse(413, "request_too_large", &why));
                    return false;
                }
                self.body.extend_from_slice(&b.body);
                if b.end_of_stream || !self.duplex_request {
                    return self.route_with_body();
                }
                true
            }
            Request::RequestTrailers(_) => {
                if !self.routed && !self.route_with_body() {
                    return false;
                }
                self.send(wire::trailers_unchanged(true));
                true
            }
            Request::ResponseHeaders(h) => {
                let status = wire::header(h.headers.as_ref(), ":status")
                    .and_then(|s| s.parse::<u16>().ok())
                    .unwrap_or(200);
                self.feedback(
                    wire::served(message.metadata_context.as_ref(), &message.attributes),
                    status,
                );
                let endpoint = self
                    .lease
                    .as_ref()
                    .map(|l| as_endpoint(&l.replica.url).to_string());
                if h.end_of_stream {
                    self.lease = None;
                }
                self.send(wire::response_headers(endpoint.as_deref()));
                true
            }
            Request::ResponseBody(b) => {
                let end = b.end_of_stream;
                if self.duplex_response {
                    self.send(wire::streamed(false, b.body, end));
                } else {
                    self.send(wire::body_unchanged(false));
                }
                if end {
                    self.lease = None;
                }
                true
            }
            Request::ResponseTrailers(_) => {
                self.lease = None;
                self.send(wire::trailers_unchanged(false));
                true
            }
        }
    }

    fn pass_request_body(&mut self, body: Vec<u8>, end: bool) {
        if self.duplex_request {
            self.send(wire::streamed(true, body, end));
        } else {
            self.send(wire::body_unchanged(true));
        }
    }

    /// Chooses now that the body is whole, and answers.
    fn route_with_body(&mut self) -> bool {
        (self.ask.prompt, self.ask.token_ids) = prompt_units(&self.body);
        let body = std::mem::take(&mut self.body);
        if !self.route(Some(body.len())) {
            return false;
        }
        if self.duplex_request {
            self.send(wire::streamed(true, body, true));
        }
        true
    }

    /// Chooses and sends the destination (or the refusal); `body_len` when a body follows.
    fn route(&mut self, body_len: Option<usize>) -> bool {
        self.routed = true;
        let chosen = match self.picker.choose(&self.ask) {
            Choice::Route(chosen) => chosen,
            Choice::Unavailable => {
                self.send(wire::refuse(
                    503,
                    "no_endpoint_ready",
                    "no model server is ready for this request",
                ));
                return false;
            }
            Choice::Shed => {
                self.send(wire::refuse(
                    429,
                    "pool_saturated",
                    "every model server is busy; retry later",
                ));
                return false;
            }
        };
        let endpoints = chosen
            .iter()
            .map(|r| as_endpoint(&r.url))
            .collect::<Vec<_>>()
            .join(",");
        if let Some(first) = chosen.into_iter().next() {
            self.lease = Some(
                self.picker
                    .lease(first, std::mem::take(&mut self.ask.tenant)),
            );
        }
        let answer = if body_len.is_some() && !self.duplex_request {
            wire::route_body(&endpoints)
        } else {
            wire::route_headers(&endpoints, body_len)
        };
        self.send(answer);
        true
    }

    /// The response began: the load moves to the server that served it, and its status
    /// counts toward that server's breaker.
    fn feedback(&mut self, served: Option<String>, status: u16) {
        let Some(lease) = &mut self.lease else {
            return;
        };
        if let Some(replica) = served
            .and_then(|s| as_url(s.split(',').next().unwrap_or_default().trim()).ok())
            .and_then(|url| self.picker.replica(&url))
        {
            lease.moved_to(replica);
        }
        let s = &self.picker.settings;
        if status >= 500 {
            lease.replica.failed(
                s.breaker_failures,
                std::time::Duration::from_millis(s.breaker_cooldown_ms),
            );
        } else {
            lease.replica.succeeded();
        }
    }

    fn send(&mut self, answer: ProcessingResponse) {
        self.out.push_back(answer);
    }
}
