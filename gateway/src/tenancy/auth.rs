//! Authentication: a bearer credential becomes a [`Principal`].
//!
//! `Authorization: Bearer <credential>` carries an API key (`tp-...`) or a JWT (three
//! dot-separated parts). Browsers, which cannot set headers on a WebSocket, may send the key as
//! the subprotocol `openai-insecure-api-key.<key>`. Without authentication (switched off
//! explicitly) every caller is the one local tenant.

use std::sync::{Arc, Mutex, RwLock};

use axum::http::HeaderMap;

use super::jwt::JwtVerifier;
use super::keys::{self, KeyError};
use super::limits::LimitReport;
use super::{Directory, Principal};
use crate::error::ApiError;

/// The subprotocol prefix that carries an API key on a browser WebSocket.
pub const WS_KEY_PROTOCOL: &str = "openai-insecure-api-key.";

/// What a handler learns of its caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Who is calling.
    pub principal: Arc<Principal>,
    /// The limit levels seen so far, for the response headers.
    pub report: Arc<Mutex<LimitReport>>,
    /// The caller's correlation id (`X-Request-Trace`), for the request's log line.
    pub correlation: Option<Arc<str>>,
    /// The batch this request is a line of: it runs at the lowest priority and its usage is
    /// counted as batch.
    pub batch: Option<Arc<str>>,
}

impl Caller {
    /// A caller with an empty report.
    pub fn new(principal: Arc<Principal>) -> Self {
        Self {
            principal,
            report: Arc::default(),
            correlation: None,
            batch: None,
        }
    }

    /// The same caller, running a line of batch `id`.
    pub fn in_batch(mut self, id: &str) -> Self {
        self.batch = Some(Arc::from(id));
        self
    }

    /// The same caller, with its correlation id.
    pub fn correlated(mut self, id: Option<&str>) -> Self {
        self.correlation = id.map(Arc::from);
        self
    }

    /// Updates the report.
    pub fn report(&self, f: impl FnOnce(&mut LimitReport)) {
        let mut report = self
            .report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut report);
    }

    /// The report so far.
    pub fn snapshot(&self) -> LimitReport {
        self.report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Turns credentials into principals.
#[derive(Debug)]
pub struct Authenticator {
    required: bool,
    directory: RwLock<Arc<Directory>>,
    jwt: Option<JwtVerifier>,
}

fn unauthenticated(message: impl Into<String>) -> ApiError {
    ApiError::Unauthenticated(message.into())
}

impl Authenticator {
    /// Authentication off: every caller is [`Principal::local`].
    pub fn off() -> Self {
        Self {
            required: false,
            directory: RwLock::default(),
            jwt: None,
        }
    }

    /// Authentication required, against `directory` and, if configured, JWTs.
    pub fn required(directory: Directory, jwt: Option<JwtVerifier>) -> Self {
        Self {
            required: true,
            directory: RwLock::new(Arc::new(directory)),
            jwt,
        }
    }

    /// Whether credentials are checked.
    pub fn is_required(&self) -> bool {
        self.required
    }

    /// The current directory.
    pub fn directory(&self) -> Arc<Directory> {
        Arc::clone(
            &self
                .directory
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Replaces the directory (a reload); requests under way keep the one they started with.
    pub fn replace(&self, directory: Directory) {
        *self
            .directory
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(directory);
    }

    /// The caller of a request with these headers, at `now` (Unix seconds).
    pub fn authenticate(&self, headers: &HeaderMap, now: i64) -> Result<Principal, ApiError> {
        if !self.required {
            return Ok(Principal::local());
        }
        let credential = credential(headers)?;
        let directory = self.directory();
        if credential.starts_with("tp-") {
            return key_principal(&directory, &credential, now);
        }
        if credential.split('.').count() == 3 {
            let Some(jwt) = &self.jwt else {
                return Err(unauthenticated(
                    "Bearer tokens (JWT) are not accepted by this gateway; use an API key.",
                ));
            };
            let claims = jwt
                .verify(&credential)
                .map_err(|why| unauthenticated(format!("Invalid bearer token: {why}.")))?;
            let tenant = directory.tenants.get(&claims.tenant).ok_or_else(|| {
                unauthenticated(format!(
                    "Invalid bearer token: tenant `{}` is not known to this gateway.",
                    claims.tenant
                ))
            })?;
            return Ok(Principal {
                tenant: Arc::clone(tenant),
                key_id: claims.subject,
                scopes: claims.scopes,
            });
        }
        Err(unauthenticated(KeyError::Malformed.to_string()))
    }
}

fn key_principal(directory: &Directory, key: &str, now: i64) -> Result<Principal, ApiError> {
    let id = keys::parse_id(key).map_err(|e| unauthenticated(e.to_string()))?;
    let record = directory
        .keys
        .get(id)
        .ok_or_else(|| unauthenticated(KeyError::Unknown.to_string()))?;
    keys::verify(record, key, now).map_err(|e| unauthenticated(e.to_string()))?;
    let tenant = directory
        .tenants
        .get(&record.tenant)
        .ok_or_else(|| unauthenticated(KeyError::Unknown.to_string()))?;
    Ok(Principal {
        tenant: Arc::clone(tenant),
        key_id: Some(record.id.clone()),
        scopes: record.scopes.clone(),
    })
}

/// The bearer credential, from `Authorization` or a browser WebSocket's subprotocol.
fn credential(headers: &HeaderMap) -> Result<String, ApiError> {
    let mut auth = headers.get_all(axum::http::header::AUTHORIZATION).iter();
    if let Some(value) = auth.next() {
        if auth.next().is_some() {
            return Err(unauthenticated(
                "Send one Authorization header, not several.",
            ));
        }
        let text = value
            .to_str()
            .map_err(|_| unauthenticated("The Authorization header is not readable text."))?;
        let (scheme, rest) = text.split_once(' ').unwrap_or((text, ""));
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthenticated(
                "Use `Authorization: Bearer <API key>`; other schemes are not accepted.",
            ));
        }
        let token = rest.trim();
        if token.is_empty() {
            return Err(missing());
        }
        return Ok(token.to_string());
    }
    for value in headers.get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(text) = value.to_str() else { continue };
        if let Some(key) = text
            .split(',')
            .map(str::trim)
            .find_map(|p| p.strip_prefix(WS_KEY_PROTOCOL))
        {
            return Ok(key.to_string());
        }
    }
    // Anthropic's SDKs send the key as `x-api-key`.
    if let Some(value) = headers.get("x-api-key") {
        let key = value
            .to_str()
            .map_err(|_| unauthenticated("The x-api-key header is not readable text."))?
            .trim();
        if !key.is_empty() {
            return Ok(key.to_string());
        }
    }
    Err(missing())
}

fn missing() -> ApiError {
    unauthenticated(
        "You didn't provide an API key. Send it as `Authorization: Bearer <API key>` (or `x-api-key`).",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::{KeyRecord, Plan, Scopes, Tenant};
    use axum::http::HeaderValue;

    fn directory() -> (Directory, String) {
        let (key, id) = keys::generate().unwrap();
        let tenant = Arc::new(Tenant {
            name: "acme".into(),
            plan: Plan::default(),
        });
        let mut d = Directory::default();
        d.tenants.insert("acme".into(), tenant);
        d.keys.insert(
            id.clone(),
            KeyRecord {
                id,
                hash: keys::hash(&key),
                tenant: "acme".into(),
                expires_at: Some(1000),
                scopes: Scopes::default(),
                revoked: false,
            },
        );
        (d, key)
    }

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn keys_from_the_header_or_the_browser_subprotocol() {
        let (d, key) = directory();
        let auth = Authenticator::required(d, None);
        let p = auth
            .authenticate(&headers("authorization", &format!("Bearer {key}")), 0)
            .unwrap();
        assert_eq!(p.tenant.name, "acme");
        let proto = format!("realtime, {WS_KEY_PROTOCOL}{key}");
        let p = auth
            .authenticate(&headers("sec-websocket-protocol", &proto), 0)
            .unwrap();
        assert_eq!(p.tenant.name, "acme");
        let late = auth.authenticate(&headers("authorization", &format!("Bearer {key}")), 1000);
        assert!(matches!(late, Err(ApiError::Unauthenticated(m)) if m.contains("expired")));
    }

    #[test]
    fn every_bad_credential_is_401_with_a_reason() {
        let (d, key) = directory();
        let auth = Authenticator::required(d, None);
        let (other, _) = keys::generate().unwrap();
        let forged = format!("Bearer {}{}", &key[..16], &other[16..]);
        for (value, says) in [
            (None, "didn't provide"),
            (Some("Basic abc"), "Bearer"),
            (Some("Bearer "), "didn't provide"),
            (Some("Bearer tp-short"), "Malformed"),
            (Some("Bearer a.b.c"), "not accepted"),
            (Some(forged.as_str()), "Incorrect"),
        ] {
            let h = value.map_or_else(HeaderMap::new, |v| headers("authorization", v));
            let err = auth.authenticate(&h, 0).unwrap_err();
            assert!(
                matches!(&err, ApiError::Unauthenticated(m) if m.contains(says)),
                "{value:?}: {err:?}"
            );
        }
        assert_eq!(
            Authenticator::off()
                .authenticate(&HeaderMap::new(), 0)
                .unwrap()
                .tenant
                .name,
            "local"
        );
    }
}
