//! Files in an S3-compatible bucket (AWS S3, MinIO, Ceph, moto): `object_store`'s S3 client,
//! signed with `ring` (the provider rustls already links), over the blocking HTTP client the
//! gateway already has for the Hub (`ureq`, rustls), each call on a blocking thread. A response
//! body is handed on in pieces through a bounded channel, so a large download is never held
//! whole. Credentials come from the environment under AWS's own names
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).

use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use object_store::prefix::PrefixStore;
use tokio::sync::{mpsc, oneshot};

/// Pieces of a response body in flight between the blocking reader and the caller.
const PIECES: usize = 4;
/// Bytes read at a time.
const PIECE: usize = 64 << 10;

/// The bucket `url` names (`s3://bucket/prefix`), at `endpoint` when it is not AWS's.
pub(crate) fn open(
    url: &str,
    endpoint: Option<&str>,
    region: Option<&str>,
) -> Result<Arc<dyn ObjectStore>, String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("files.url: `{url}` is not an s3:// URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("files.url: `{url}` names no bucket"));
    }
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_http_connector(Connector);
    if let Some(endpoint) = endpoint {
        builder = builder
            .with_endpoint(endpoint)
            .with_allow_http(endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    if let Some(region) = region {
        builder = builder.with_region(region);
    }
    let store = builder
        .build()
        .map_err(|e| format!("files.url: `{url}`: {e}"))?;
    let prefix = prefix.trim_matches('/');
    Ok(if prefix.is_empty() {
        Arc::new(store)
    } else {
        Arc::new(PrefixStore::new(store, prefix))
    })
}

/// Makes [`Service`]s.
#[derive(Debug, Clone, Copy)]
struct Connector;

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let _ = options;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(std::time::Duration::from_secs(10)))
            .build()
            .new_agent();
        Ok(HttpClient::new(Service { agent }))
    }
}

/// One HTTP client.
#[derive(Debug)]
struct Service {
    agent: ureq::Agent,
}

fn error(kind: HttpErrorKind, e: impl std::error::Error + Send + Sync + 'static) -> HttpError {
    HttpError::new(kind, e)
}

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| error(HttpErrorKind::Request, e))?
            .to_bytes();
        let request = axum::http::Request::from_parts(parts, body.to_vec());
        let agent = self.agent.clone();
        let (head_tx, head_rx) = oneshot::channel();
        let (tx, rx) = mpsc::channel(PIECES);
        tokio::task::spawn_blocking(move || {
            let response = match agent.run(request) {
                Ok(response) => response,
                Err(e) => {
                    let kind = match &e {
                        ureq::Error::Timeout(_) => HttpErrorKind::Timeout,
                        ureq::Error::Io(_) | ureq::Error::HostNotFound => HttpErrorKind::Connect,
                        _ => HttpErrorKind::Request,
                    };
                    let _ = head_tx.send(Err(error(kind, e)));
                    return;
                }
            };
            let (head, body) = response.into_parts();
            if head_tx.send(Ok(head)).is_err() {
                return;
            }
            let mut reader = body.into_reader();
            let mut buffer = vec![0u8; PIECE];
            loop {
                let piece = match reader.read(&mut buffer) {
                    Ok(0) => return,
                    Ok(n) => Ok(Bytes::copy_from_slice(&buffer[..n])),
                    Err(e) => Err(error(HttpErrorKind::Interrupted, e)),
                };
                let failed = piece.is_err();
                if tx.blocking_send(piece).is_err() || failed {
                    return;
                }
            }
        });
        let head = head_rx
            .await
            .map_err(|e| error(HttpErrorKind::Unknown, e))??;
        Ok(HttpResponse::from_parts(
            head,
            HttpResponseBody::new(Pieces { rx }),
        ))
    }
}

/// A response body read from the channel.
#[derive(Debug)]
struct Pieces {
    rx: mpsc::Receiver<Result<Bytes, HttpError>>,
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, HttpError>>> {
        self.rx
            .poll_recv(cx)
            .map(|piece| piece.map(|p| p.map(hyper::body::Frame::data)))
    }
}
