//! Asking an external endpoint picker which replica takes a request, so Turnpike's tenancy,
//! limits, idempotency and protocols can sit in front of another scheduler (llm-d's, or
//! another `turnpike-epp`). The plugin speaks the proxy's side of Envoy's `ext_proc` protocol
//! in full-duplex mode: the request's headers (with `x-gateway-inference-fairness-id`, the
//! tenant) and a completions body whose `prompt` is the token ids, then it reads the
//! destination from the answer (`x-gateway-destination-endpoint`, or the same key in the
//! `envoy.lb` metadata). The stream stays open while the request runs, so the picker counts it
//! in flight; dropping the [`Advice`] closes it.
//!
//! The picker advises; it does not decide: endpoints outside the pool, or with their breakers
//! open, are skipped; a picker that is down, slow (past `picker_timeout_ms`) or answers 503
//! leaves the plugin to its own choice (fail open), counted in `picker_failed`, and after a
//! few such failures in a row it is not asked for a second, so requests do not each wait on
//! it. A 429 (the picker sheds) refuses the request as overloaded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::value::Kind;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::pool::{Pool, Replica};

/// The destination key (header and metadata) and its metadata namespace.
const DESTINATION: &str = "x-gateway-destination-endpoint";
const LB_NAMESPACE: &str = "envoy.lb";

/// One pool's external picker.
#[derive(Debug)]
pub(crate) struct Picker {
    client: ExternalProcessorClient<Channel>,
    timeout: Duration,
    /// Requests the picker chose for.
    pub chosen: AtomicU64,
    /// Requests it could not advise (down, slow, nothing ready, or resting): the plugin chose.
    pub failed: AtomicU64,
    /// Failures in a row; at [`FAILURES_TO_REST`] the picker rests.
    failures_in_a_row: AtomicU64,
    /// While resting (a picker that keeps failing), requests do not wait for it.
    rest_until: Mutex<Option<Instant>>,
}

/// Failures in a row after which a picker is not asked for [`REST`] (so a picker that is
/// gone, or slow, costs each request nothing after the first few).
const FAILURES_TO_REST: u64 = 3;
const REST: Duration = Duration::from_secs(1);

/// What the picker said for one request.
#[derive(Debug, Default)]
pub(crate) struct Advice {
    /// Base URLs, in the picker's order; taken from the front.
    endpoints: Vec<String>,
    /// The open call, both ways, held as long as the request runs (the picker counts the
    /// request in flight until it closes).
    _stream: Option<(
        mpsc::Sender<ProcessingRequest>,
        tonic::Streaming<ProcessingResponse>,
    )>,
    /// The picker shed the request.
    pub shed: bool,
}

impl Picker {
    /// A picker at `url` (`http://host:port`); connects on first use, inside a Tokio runtime.
    pub(crate) fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| format!("picker `{url}`: {e}"))?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        Ok(Self {
            client: ExternalProcessorClient::new(endpoint.connect_lazy()),
            timeout,
            chosen: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            failures_in_a_row: AtomicU64::new(0),
            rest_until: Mutex::new(None),
        })
    }

    /// Asks which replica takes `prompt` of `model` for `tenant`.
    pub(crate) async fn advise(&self, model: &str, prompt: &[u32], tenant: Option<&str>) -> Advice {
        let resting = *self
            .rest_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if resting.is_some_and(|until| Instant::now() < until) {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Advice::default();
        }
        match tokio::time::timeout(self.timeout, self.ask(model, prompt, tenant)).await {
            Ok(Ok(advice)) => {
                self.failures_in_a_row.store(0, Ordering::Relaxed);
                if !advice.shed {
                    self.chosen.fetch_add(1, Ordering::Relaxed);
                }
                advice
            }
            Ok(Err(())) | Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1 >= FAILURES_TO_REST {
                    self.failures_in_a_row.store(0, Ordering::Relaxed);
                    *self
                        .rest_until
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + REST);
                }
                Advice::default()
            }
        }
    }

    async fn ask(&self, model: &str, prompt: &[u32], tenant: Option<&str>) -> Result<Advice, ()> {
        let (tx, rx) = mpsc::channel(4);
        let body = serde_json::json!({"model": model, "prompt": prompt}).to_string();
        let mut headers = vec![
            header(":method", "POST"),
            header(":path", "/v1/completions"),
            header("content-type", "application/json"),
            header("content-length", &body.len().to_string()),
        ];
        if let Some(tenant) = tenant {
            headers.push(header("x-gateway-inference-fairness-id", tenant));
        }
        let duplex = BodySendMode::FullDuplexStreamed as i32;
        let first = ProcessingRequest {
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: duplex,
                ..ProtocolConfiguration::default()
            }),
            request: Some(Phase::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap { headers }),
                ..HttpHeaders::default()
            })),
            ..ProcessingRequest::default()
        };
        let second = ProcessingRequest {
            request: Some(Phase::RequestBody(HttpBody {
                body: body.into_bytes(),
                end_of_stream: true,
                ..HttpBody::default()
            })),
            ..ProcessingRequest::default()
        };
        for message in [first, second] {
            tx.send(message).await.map_err(drop)?;
        }
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let mut client = self.client.clone();
        let mut answers = client.process(outbound).await.map_err(drop)?.into_inner();
        while let Some(answer) = answers.message().await.map_err(drop)? {
            match read(&answer) {
                None => {}
                Some(Said::Route(endpoints)) => {
                    return Ok(Advice {
                        endpoints,
                        _stream: Some((tx, answers)),
                        shed: false,
                    });
                }
                Some(Said::Shed) => {
                    return Ok(Advice {
                        shed: true,
                        ..Advice::default()
                    });
                }
                Some(Said::Nothing) => return Err(()),
            }
        }
        Err(())
    }
}

/// What one answer says.
enum Said {
    Route(Vec<String>),
    Shed,
    Nothing,
}

/// The advice in one answer (`None`: read on).
fn read(answer: &ProcessingResponse) -> Option<Said> {
    match answer.response.as_ref()? {
        Answer::ImmediateResponse(r) => Some(match r.status.as_ref().map(|s| s.code) {
            Some(429) => Said::Shed,
            _ => Said::Nothing,
        }),
        Answer::RequestHeaders(h) => {
            let from_header = h
                .response
                .as_ref()
                .and_then(|c| c.header_mutation.as_ref())
                .and_then(|m| {
                    m.set_headers
                        .iter()
                        .filter_map(|o| o.header.as_ref())
                        .find(|h| h.key.eq_ignore_ascii_case(DESTINATION))
                        .map(|h| {
                            if h.raw_value.is_empty() {
                                h.value.clone()
                            } else {
                                String::from_utf8_lossy(&h.raw_value).into_owned()
                            }
                        })
                });
            let from_metadata = || {
                let lb = answer.dynamic_metadata.as_ref()?.fields.get(LB_NAMESPACE)?;
                let Some(Kind::StructValue(lb)) = &lb.kind else {
                    return None;
                };
                match &lb.fields.get(DESTINATION)?.kind {
                    Some(Kind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                }
            };
            let Some(value) = from_header.or_else(from_metadata) else {
                return Some(Said::Nothing);
            };
            Some(Said::Route(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(|e| format!("http://{e}"))
                    .collect(),
            ))
        }
        _ => None,
    }
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        raw_value: value.as_bytes().to_vec(),
        ..HeaderValue::default()
    }
}

impl Advice {
    /// The next advised replica that is in `pool`, not of `failed`, and would take a request
    /// now; `None` when the advice is spent (the plugin chooses).
    pub(crate) fn next(&mut self, pool: &Pool, failed: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        while !self.endpoints.is_empty() {
            let url = self.endpoints.remove(0);
            if let Some(r) = pool.member(&url)
                && !failed.iter().any(|f| Arc::ptr_eq(f, &r))
                && r.admits_now()
            {
                return Some(r);
            }
        }
        None
    }
}
