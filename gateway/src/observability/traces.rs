//! Traces: OpenTelemetry spans made from the gateway's `tracing` spans of target
//! [`TARGET`], exported as OTLP over HTTP (protobuf), sampled by trace id at a ratio, off by
//! default (`[tracing]`).
//!
//! The `tracing` layer that turns spans into OpenTelemetry spans is installed with the logger at
//! startup, before the configuration is read; what is not known then is held in two switches:
//! the span queue (`trace_batch`, drained into the exporter, set by [`install`]) and the
//! sampler. Until
//! [`install`], the log filter leaves [`TARGET`] off, so no span is even created and tracing
//! costs nothing; `install` turns it on (see `logging`).
//!
//! A request's trace: `request` (the root, or the child of the caller's W3C `traceparent`),
//! with `auth`, `limits`, `idempotency`, `tokenize`, `queue_wait`, `engine` (`prefill` to the
//! first token, `decode` after it, with token counts) and `render` beneath it. The engine
//! request carries the `traceparent` of its `engine` span ([`traceparent`]), so a plugin can
//! join the trace and the upstream plugin sends it on to the engine servers it calls.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracerProvider, ShouldSample, SpanData, SpanExporter as _, SpanProcessor,
};
use serde::Deserialize;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::trace_batch::{Queue, Sizes};

/// The `tracing` target of every span that becomes a trace span.
pub const TARGET: &str = "turnpike::trace";

/// What `[tracing]` configures.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// Where spans go: an OTLP/HTTP traces URL (`http://collector:4318/v1/traces`).
    pub endpoint: String,
    /// The share of new traces kept (a caller's sampled `traceparent` is always followed).
    pub sample_ratio: f64,
    /// The `service.name` of every span.
    pub service_name: String,
}

/// `[tracing]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    otlp_endpoint: String,
    #[serde(default = "one")]
    sample_ratio: f64,
    #[serde(default = "service")]
    service_name: String,
}

fn one() -> f64 {
    1.0
}

fn service() -> String {
    "turnpike".into()
}

impl RawTracing {
    /// The settings, or why not.
    pub fn validate(self) -> Result<TracingSettings, String> {
        let url: hyper::Uri = self.otlp_endpoint.parse().map_err(|e| {
            format!(
                "tracing.otlp_endpoint: `{}` is not a URL ({e})",
                self.otlp_endpoint
            )
        })?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(format!(
                "tracing.otlp_endpoint: `{}` must be an http:// URL such as http://127.0.0.1:4318/v1/traces",
                self.otlp_endpoint
            ));
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err("tracing.sample_ratio must be between 0 and 1".into());
        }
        if self.service_name.is_empty() {
            return Err("tracing.service_name must not be empty".into());
        }
        Ok(TracingSettings {
            endpoint: self.otlp_endpoint,
            sample_ratio: self.sample_ratio,
            service_name: self.service_name,
        })
    }
}

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the trace exporter: {0}")]
pub struct TracesError(String);

/// The provider behind the layer, and the switch it reads.
struct Switches {
    provider: SdkTracerProvider,
    queue: Arc<OnceLock<Arc<Queue>>>,
}

/// What [`flush`] needs: the queue, the exporter and the runtime its requests run on.
struct Export {
    queue: Arc<Queue>,
    exporter: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
}

static EXPORT: OnceLock<Export> = OnceLock::new();

static SWITCHES: OnceLock<Switches> = OnceLock::new();
/// The sampler [`install`] sets: a sampled parent is followed, else the configured share of
/// new traces is kept. Nothing is sampled before.
static SAMPLER: OnceLock<Sampler> = OnceLock::new();

/// The layer that makes OpenTelemetry spans of [`TARGET`] spans, for the logger to install.
pub(super) fn layer<S>()
-> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let switches = SWITCHES.get_or_init(|| {
        let queue = Arc::new(OnceLock::new());
        let provider = SdkTracerProvider::builder()
            .with_sampler(RatioSampler)
            .with_span_processor(Switched(Arc::clone(&queue)))
            .build();
        Switches { provider, queue }
    });
    tracing_opentelemetry::layer()
        .with_tracer(switches.provider.tracer("turnpike"))
        // Only what a trace needs: no busy/idle times, thread, source location or target
        // attributes on every span, and no OpenTelemetry context switch on every enter (a
        // stream's body enters its span at each poll).
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_target(false)
        .with_context_activation(false)
}

/// Starts exporting: spans of [`TARGET`] are created from now on and sent to `settings`'
/// endpoint in batches, on `runtime`. A second call keeps the first exporter.
pub fn install(
    settings: &TracingSettings,
    runtime: tokio::runtime::Handle,
) -> Result<(), TracesError> {
    let Some(switches) = SWITCHES.get() else {
        return Err(TracesError(
            "the logger was set up without the trace layer".into(),
        ));
    };
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(SpawnedClient::new(runtime.clone()))
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| TracesError(e.to_string()))?;
    exporter.set_resource(
        &opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .build(),
    );
    let queue = Queue::new(Sizes::from_env());
    if switches.queue.set(Arc::clone(&queue)).is_err() {
        tracing::warn!("traces were already being exported; the first [tracing] stays");
        return Ok(());
    }
    let exporter = Arc::new(exporter);
    runtime.spawn(Arc::clone(&queue).run(Arc::clone(&exporter)));
    let _ = EXPORT.set(Export {
        queue,
        exporter,
        runtime,
    });
    let _ = SAMPLER.set(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
        settings.sample_ratio,
    ))));
    super::logging::enable_traces();
    tracing::info!(endpoint = %settings.endpoint, ratio = settings.sample_ratio, "exporting traces");
    Ok(())
}

/// Sends the spans still queued (on shutdown); call it from outside the runtime.
pub fn flush() {
    if let Some(export) = EXPORT.get() {
        export
            .runtime
            .block_on(export.queue.export_all(export.exporter.as_ref()));
    }
}

/// The W3C `traceparent` of `span`, when it is traced and sampled.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` the child of the caller's `traceparent` (and `tracestate`) in `headers`.
pub fn follow(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if span.is_disabled() || !headers.contains_key("traceparent") {
        return;
    }
    let carrier: std::collections::HashMap<String, String> = ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|name| {
            let value = headers.get(name)?.to_str().ok()?;
            Some((name.to_string(), value.to_string()))
        })
        .collect();
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The trace id of `span` (32 hex digits), when it is traced.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let id = span.context().span().span_context().trace_id();
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

/// Follows a sampled parent, else keeps the configured share of new traces.
#[derive(Debug, Clone)]
struct RatioSampler;

impl ShouldSample for RatioSampler {
    fn should_sample(
        &self,
        parent_context: Option<&opentelemetry::Context>,
        trace_id: opentelemetry::trace::TraceId,
        name: &str,
        span_kind: &opentelemetry::trace::SpanKind,
        attributes: &[opentelemetry::KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        SAMPLER.get().unwrap_or(&Sampler::AlwaysOff).should_sample(
            parent_context,
            trace_id,
            name,
            span_kind,
            attributes,
            links,
        )
    }
}

/// Queues finished spans once there is a queue.
#[derive(Debug)]
struct Switched(Arc<OnceLock<Arc<Queue>>>);

impl SpanProcessor for Switched {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if let Some(queue) = self.0.get() {
            queue.push(span);
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// The exporter's HTTP client: each request runs on the server's runtime, so an export started
/// from outside it (the flush on shutdown) works as well as the queue's own task.
#[derive(Debug, Clone)]
struct SpawnedClient {
    runtime: tokio::runtime::Handle,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
}

impl SpawnedClient {
    fn new(runtime: tokio::runtime::Handle) -> Self {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        // A request's head and body go out as separate writes: without this, Nagle's
        // algorithm holds the body until the collector's delayed ACK (tens of milliseconds).
        connector.set_nodelay(true);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        Self { runtime, client }
    }
}

type HttpResult = Result<axum::http::Response<Bytes>, opentelemetry_http::HttpError>;

impl opentelemetry_http::HttpClient for SpawnedClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: axum::http::Request<Bytes>,
    ) -> Pin<Box<dyn std::future::Future<Output = HttpResult> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let response = client
                .request(axum::http::Request::from_parts(parts, Full::new(body)))
                .await?;
            let (parts, body) = response.into_parts();
            // The collector's answer is small; more than this is not one.
            let body = http_body_util::Limited::new(body, 1 << 20)
                .collect()
                .await?;
            Ok::<_, opentelemetry_http::HttpError>(axum::http::Response::from_parts(
                parts,
                body.to_bytes(),
            ))
        });
        Box::pin(async move {
            match task.await {
                Ok(result) => result,
                Err(e) => Err(e.into()),
            }
        })
    }
}
