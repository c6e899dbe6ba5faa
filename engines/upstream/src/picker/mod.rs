//! Turnpike as an **endpoint picker** (EPP) for the Gateway API Inference Extension: a proxy
//! (Envoy, or any gateway that implements the extension) asks over Envoy's `ext_proc` gRPC
//! protocol which model server of a pool takes each request, and the picker answers with the
//! `x-gateway-destination-endpoint` header and the same value in the `envoy.lb` dynamic
//! metadata: the first choice, then `fallbacks` more for the proxy's retries.
//!
//! The choice is the upstream plugin's own ([`crate::pool`]: prefix affinity, then load,
//! breakers), over what the servers report on their `/metrics` in the model-server protocol's
//! names ([`scrape`]), with the proxy's subset hint and tenant fairness ([`choose`]). Nothing
//! ready is a 503, a saturated pool sheds an over-share tenant with 429, both in the OpenAI
//! error shape. `grpc.health.v1` answers for `liveness`, `readiness` and the `ext_proc`
//! service (ready while some server is).
//!
//! Servers come from the same places as the upstream plugin's ([`crate::discovery`]): a list,
//! an endpoints file re-read while serving, host names re-resolved (a Kubernetes headless
//! service). Watching `InferencePool` pods through the Kubernetes API is the next step and is
//! not here.
//!
//! Layout: [`settings`] (the TOML file), [`ask`] (a body as affinity units), [`choose`] (the
//! policy and the in-flight leases), [`exchange`] (one `ext_proc` stream), [`wire`] (the
//! protocol's messages), [`scrape`] (probes and load reports), [`exposition`] (its own
//! `/metrics`).

mod ask;
mod choose;
mod exchange;
#[cfg(test)]
mod exchange_tests;
mod exposition;
mod scrape;
mod settings;
mod wire;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tonic::{Request, Response, Status, Streaming};

pub use settings::Settings;

use choose::Picker;

/// The gRPC health services that say whether requests can be routed.
const READY_SERVICES: [&str; 3] = [
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
    "",
];

/// The `ext_proc` service.
#[derive(Debug, Clone)]
struct Service {
    picker: Arc<Picker>,
}

type AnswerStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = AnswerStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<AnswerStream>, Status> {
        // The exchange runs inside the answer stream, as tonic polls it: no task and no
        // channel per request.
        let state = (
            request.into_inner(),
            exchange::Exchange::new(Arc::clone(&self.picker)),
            false,
        );
        let answers =
            futures_util::stream::unfold(state, |(mut inbound, mut x, mut done)| async move {
                loop {
                    let next = x.answers().next();
                    if let Some(answer) = next {
                        return Some((Ok(answer), (inbound, x, done)));
                    }
                    if done {
                        return None;
                    }
                    match inbound.message().await {
                        Ok(Some(message)) => done = !x.on(message),
                        Ok(None) | Err(_) => return None,
                    }
                }
            });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// Errors that stop the picker.
#[derive(Debug, thiserror::Error)]
pub enum PickerError {
    /// The settings are wrong.
    #[error("{0}")]
    Settings(String),
    /// The listener could not be served.
    #[error("serving {0}: {1}")]
    Serve(String, tonic::transport::Error),
}

/// Serves the picker on `settings.listen` until `shutdown` resolves; `ready` gets the bound
/// address once it listens.
pub async fn serve(
    settings: Settings,
    ready: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), PickerError> {
    let urls = crate::discovery::targets(&settings.members)
        .await
        .or_else(|why| {
            tracing::warn!("picker servers: {why}");
            crate::discovery::listed(&settings.members)
        })
        .map_err(PickerError::Settings)?;
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .map_err(|e| PickerError::Settings(format!("cannot listen on {}: {e}", settings.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| PickerError::Settings(e.to_string()))?;
    let members = settings.members.clone();
    let metrics_listener = match &settings.metrics_listen {
        Some(address) => Some(tokio::net::TcpListener::bind(address).await.map_err(|e| {
            PickerError::Settings(format!("cannot listen on {address} (metrics_listen): {e}"))
        })?),
        None => None,
    };
    let timeout = Duration::from_millis(settings.probe_timeout_ms);
    let picker = Arc::new(Picker::new(settings, &urls));
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("liveness", tonic_health::ServingStatus::Serving)
        .await;
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    tokio::spawn(scrape::probe_forever(client, Arc::clone(&picker), health));
    if crate::discovery::dynamic(&members) {
        let pool_picker = Arc::clone(&picker);
        tokio::spawn(async move {
            crate::discovery::keep_current(
                "picker pool",
                &members,
                &pool_picker.pool,
                |warn, l| {
                    if warn {
                        tracing::warn!("{l}");
                    } else {
                        tracing::info!("{l}");
                    }
                },
            )
            .await;
        });
    }
    if let Some(view) = &picker.cache_view {
        let every = Duration::from_millis(picker.settings.members.refresh_ms);
        tokio::spawn(Arc::clone(view).follow_every(every, Arc::clone(&picker), |p| &p.pool));
    }
    if let Some(listener) = metrics_listener {
        tokio::spawn(exposition::serve(listener, Arc::clone(&picker)));
    }
    ready(bound);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(ExternalProcessorServer::new(Service { picker }))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| PickerError::Serve(bound.to_string(), e))
}
