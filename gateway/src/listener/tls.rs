//! TLS on the listener (rustls with the ring provider): the certificate chain and key from PEM
//! files, TLS 1.2 or 1.3 at least, HTTP/1.1 by ALPN, and optional client certificates checked
//! against a CA file (mTLS).
//!
//! The files are re-read while serving: [`TlsSource`] holds the rustls configuration behind a
//! lock, each handshake takes the current one, and [`TlsSource::watch`] rebuilds it when a
//! file's modification time or size changes (or on [`TlsSource::reload`], which SIGHUP calls).
//! A rebuild that fails (a half-written file, a key that does not match) keeps the old
//! configuration and says why in the log, so a certificate rotation can never take the listener
//! down. Connections already open keep the session they made.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde::Deserialize;

use crate::observability::metrics;

/// Whether clients present certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Not asked for.
    Off,
    /// Asked for and checked when given; a client without one is still served.
    Optional,
    /// Required: a handshake without a certificate the CA signed fails.
    Required,
}

/// The listener's TLS settings (`[server.tls]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain, PEM, leaf first.
    pub cert_file: PathBuf,
    /// The private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CAs that sign client certificates (PEM), with `client_auth` not `Off`.
    pub client_ca_file: Option<PathBuf>,
    /// Whether clients present certificates.
    pub client_auth: ClientAuth,
    /// Whether TLS 1.2 is offered besides 1.3.
    pub tls12: bool,
    /// How often the files are checked for changes.
    pub reload_interval: Duration,
}

/// `[server.tls]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    cert_file: String,
    key_file: String,
    #[serde(default)]
    client_ca_file: Option<String>,
    #[serde(default)]
    client_auth: Option<String>,
    #[serde(default = "default_min_version")]
    min_version: String,
    #[serde(default = "default_reload_ms")]
    reload_ms: u64,
}

fn default_min_version() -> String {
    "1.2".into()
}

fn default_reload_ms() -> u64 {
    10_000
}

impl RawTls {
    /// Validates, with relative paths taken from `base`, and builds the configuration once so
    /// that bad files are a startup error rather than a failed first handshake.
    pub fn validate(self, base: &Path) -> Result<TlsSettings, String> {
        let tls12 = match self.min_version.as_str() {
            "1.2" => true,
            "1.3" => false,
            other => {
                return Err(format!(
                    "server.tls.min_version: `{other}` is not \"1.2\" or \"1.3\""
                ));
            }
        };
        let client_ca_file = self.client_ca_file.map(|f| base.join(f));
        let client_auth = match (self.client_auth.as_deref(), &client_ca_file) {
            (None | Some("off"), None) => ClientAuth::Off,
            (None | Some("required"), Some(_)) => ClientAuth::Required,
            (Some("optional"), Some(_)) => ClientAuth::Optional,
            (Some("off"), Some(_)) => {
                return Err("server.tls.client_ca_file: set, but client_auth is \"off\"".into());
            }
            (Some("optional" | "required"), None) => {
                return Err("server.tls.client_auth: needs client_ca_file, the CAs that sign client certificates".into());
            }
            (Some(other), _) => {
                return Err(format!(
                    "server.tls.client_auth: `{other}` is not \"off\", \"optional\" or \"required\""
                ));
            }
        };
        if self.reload_ms == 0 {
            return Err("server.tls.reload_ms must be greater than 0".into());
        }
        let settings = TlsSettings {
            cert_file: base.join(self.cert_file),
            key_file: base.join(self.key_file),
            client_ca_file,
            client_auth,
            tls12,
            reload_interval: Duration::from_millis(self.reload_ms),
        };
        build(&settings).map_err(|e| format!("server.tls: {e}"))?;
        Ok(settings)
    }
}

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or holds no usable PEM.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the combination (a key that does not match the certificate, say).
    #[error("{0}")]
    Rustls(String),
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The rustls configuration `settings` describe, read from their files now.
pub fn build(settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(&settings.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&settings.key_file)
        .map_err(|e| file_error(&settings.key_file, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if settings.tls12 {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = match (&settings.client_ca_file, settings.client_auth) {
        (Some(ca), ClientAuth::Optional | ClientAuth::Required) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| file_error(ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if settings.client_auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The current TLS configuration, rebuilt when its files change.
#[derive(Debug)]
pub struct TlsSource {
    settings: TlsSettings,
    current: RwLock<Arc<rustls::ServerConfig>>,
    seen: RwLock<Vec<Option<(SystemTime, u64)>>>,
}

impl TlsSource {
    /// Reads the files now.
    pub fn new(settings: TlsSettings) -> Result<Arc<Self>, TlsError> {
        let current = build(&settings)?;
        let seen = stamps(&settings);
        Ok(Arc::new(Self {
            settings,
            current: RwLock::new(current),
            seen: RwLock::new(seen),
        }))
    }

    /// The acceptor for the next handshake.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }

    /// Rebuilds from the files; on failure the old configuration stays.
    pub fn reload(&self) -> bool {
        *self.seen.write().unwrap_or_else(PoisonError::into_inner) = stamps(&self.settings);
        match build(&self.settings) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = config;
                tracing::info!(
                    target: "turnpike::audit",
                    event = "tls_reloaded",
                    cert = %self.settings.cert_file.display(),
                    "TLS certificate reloaded"
                );
                metrics::tls_reload(true);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS files changed but cannot be used; the previous certificate stays");
                metrics::tls_reload(false);
                false
            }
        }
    }

    /// Checks the files every `reload_interval`, and at once on SIGHUP, and rebuilds when one
    /// changed (on SIGHUP, always), until aborted.
    pub fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut beat = crate::clock::ReloadBeat::new(this.settings.reload_interval);
            loop {
                let forced = beat.next().await;
                let changed = *this.seen.read().unwrap_or_else(PoisonError::into_inner)
                    != stamps(&this.settings);
                if forced || changed {
                    this.reload();
                }
            }
        })
    }
}

/// Each file's modification time and size (`None` for one that cannot be read).
fn stamps(settings: &TlsSettings) -> Vec<Option<(SystemTime, u64)>> {
    [
        Some(&settings.cert_file),
        Some(&settings.key_file),
        settings.client_ca_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    })
    .collect()
}
