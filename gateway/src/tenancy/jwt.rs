//! JWT bearer tokens, verified with `jsonwebtoken`.
//!
//! The algorithm is pinned by configuration; a token whose header names another algorithm is
//! refused before its signature is looked at (the "alg: none" and HS256-with-a-public-key
//! attacks). `exp` is required; `nbf` is checked when present; a configured `iss` or `aud` is
//! required: a token that omits it (or holds `null`, or another type) is refused, so a token
//! signed with the same key for another purpose is no credential here. Claims map
//! to a tenant (a configured claim, `tenant` by default) and scopes (the space-separated `scope`
//! claim: `model:NAME` and `endpoint:NAME` items narrow the tenant's rights).

use std::collections::BTreeSet;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::{Endpoint, NameSet, Scopes};

/// A verifier for one algorithm and its keys.
#[derive(Clone)]
pub struct JwtVerifier {
    algorithm: Algorithm,
    /// Keys with their `kid`, tried in order (a token's `kid` picks one when both name it).
    keys: Vec<(Option<String>, DecodingKey)>,
    validation: Validation,
    tenant_claim: String,
    scope_claim: String,
    /// The configured `iss` and `aud`, checked again on the decoded claims (see [`required`]).
    issuer: Option<String>,
    audience: Option<String>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithm", &self.algorithm)
            .field("keys", &self.keys.len())
            .field("tenant_claim", &self.tenant_claim)
            .finish_non_exhaustive()
    }
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    /// The tenant it names.
    pub tenant: String,
    /// Its subject, for logs.
    pub subject: Option<String>,
    /// Its scopes.
    pub scopes: Scopes,
}

/// Validated JWT settings.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// The one accepted algorithm.
    pub algorithm: Algorithm,
    /// Verification keys with their `kid`.
    pub keys: Vec<(Option<String>, DecodingKey)>,
    /// Required `iss`.
    pub issuer: Option<String>,
    /// Required `aud`.
    pub audience: Option<String>,
    /// Claim naming the tenant.
    pub tenant_claim: String,
    /// Claim holding scopes.
    pub scope_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

impl JwtVerifier {
    /// A verifier from validated settings.
    pub fn new(settings: JwtSettings) -> Self {
        let mut validation = Validation::new(settings.algorithm);
        validation.leeway = settings.leeway_secs;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(iss) = &settings.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        match &settings.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        Self {
            issuer: settings.issuer,
            audience: settings.audience,
            algorithm: settings.algorithm,
            keys: settings.keys,
            validation,
            tenant_claim: settings.tenant_claim,
            scope_claim: settings.scope_claim,
        }
    }

    /// Verifies a token; the error is a sentence for the client.
    pub fn verify(&self, token: &str) -> Result<TokenClaims, String> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| "the bearer token is not a well-formed JWT".to_string())?;
        if header.alg != self.algorithm {
            return Err(format!(
                "the token is signed with {:?}, but this gateway accepts only {:?}",
                header.alg, self.algorithm
            ));
        }
        let candidates = self
            .keys
            .iter()
            .filter(|(kid, _)| match (&header.kid, kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            });
        let mut last = "no verification key matches the token's kid".to_string();
        for (_, key) in candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, key, &self.validation) {
                Ok(data) => return self.claims(data.claims),
                Err(e) => {
                    last = explain(e.kind());
                    if !matches!(e.kind(), ErrorKind::InvalidSignature) {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    fn claims(&self, claims: Map<String, Value>) -> Result<TokenClaims, String> {
        required(&claims, "iss", self.issuer.as_deref())?;
        required(&claims, "aud", self.audience.as_deref())?;
        let tenant = claims
            .get(&self.tenant_claim)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the token has no `{}` claim", self.tenant_claim))?
            .to_string();
        let items: Vec<String> = match claims.get(&self.scope_claim) {
            Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        };
        Ok(TokenClaims {
            tenant,
            subject: claims
                .get("sub")
                .and_then(Value::as_str)
                .map(str::to_string),
            scopes: scopes_from(&items),
        })
    }
}

/// Checks a configured claim on the decoded token: present, and `want` (a string, or for
/// `aud` also a list holding it). The library checks this too; checking it here as well keeps
/// the rule in this file whatever the library's defaults become.
fn required(claims: &Map<String, Value>, name: &str, want: Option<&str>) -> Result<(), String> {
    let Some(want) = want else { return Ok(()) };
    let matches = match claims.get(name) {
        Some(Value::String(have)) => have == want,
        Some(Value::Array(list)) if name == "aud" => list.iter().any(|v| v.as_str() == Some(want)),
        None | Some(Value::Null) => return Err(format!("the token has no `{name}` claim")),
        Some(_) => return Err(format!("the token's `{name}` claim is malformed")),
    };
    if matches {
        Ok(())
    } else if name == "aud" {
        Err("the token is for another audience (aud)".into())
    } else {
        Err("the token is from another issuer (iss)".into())
    }
}

/// Scopes from `model:NAME` and `endpoint:NAME` items; a kind with no items is not narrowed.
/// `admin` (or `endpoint:admin`) grants the admin API.
pub fn scopes_from(items: &[String]) -> Scopes {
    let models: Vec<String> = items
        .iter()
        .filter_map(|s| s.strip_prefix("model:"))
        .map(str::to_string)
        .collect();
    let endpoints: BTreeSet<Endpoint> = items
        .iter()
        .filter_map(|s| s.strip_prefix("endpoint:"))
        .filter_map(Endpoint::parse)
        .collect();
    let admin = items.iter().any(|s| s == "admin" || s == "endpoint:admin");
    let named_endpoints = items
        .iter()
        .any(|s| s.starts_with("endpoint:") && s != "endpoint:admin");
    Scopes {
        models: if models.is_empty() {
            NameSet::All
        } else {
            NameSet::from_list(&models)
        },
        endpoints: named_endpoints.then_some(endpoints),
        admin,
        budget: None,
    }
}

fn explain(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "the token is for another audience (aud)".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer (iss)".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => {
            "the token's algorithm is not accepted".into()
        }
        ErrorKind::MissingRequiredClaim(c) => format!("the token has no `{c}` claim"),
        ErrorKind::InvalidClaimFormat(c) => format!("the token's `{c}` claim is malformed"),
        _ => "the bearer token is not a well-formed JWT".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    const SECRET: &[u8] = b"a test secret of at least 32 bytes!!";

    fn verifier(issuer: Option<&str>, audience: Option<&str>) -> JwtVerifier {
        JwtVerifier::new(JwtSettings {
            algorithm: Algorithm::HS256,
            keys: vec![(None, DecodingKey::from_secret(SECRET))],
            issuer: issuer.map(str::to_string),
            audience: audience.map(str::to_string),
            tenant_claim: "tenant".into(),
            scope_claim: "scope".into(),
            leeway_secs: 0,
        })
    }

    fn token(claims: Value) -> String {
        let mut claims = claims;
        claims["exp"] = json!(crate::clock::unix_now() + 600);
        claims["tenant"] = json!("acme");
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap_or_default()
    }

    #[test]
    fn configured_issuer_and_audience_are_required() {
        let v = verifier(Some("https://idp"), Some("turnpike"));
        let ok = v.verify(&token(json!({"iss": "https://idp", "aud": "turnpike"})));
        assert_eq!(ok.map(|c| c.tenant), Ok("acme".to_string()));
        let listed = v.verify(&token(
            json!({"iss": "https://idp", "aud": ["x", "turnpike"]}),
        ));
        assert!(listed.is_ok(), "{listed:?}");
        for (claims, why) in [
            (json!({}), "no `"),
            (json!({"iss": "https://idp"}), "no `aud`"),
            (json!({"aud": "turnpike"}), "no `iss`"),
            (json!({"iss": "https://idp", "aud": null}), "aud"),
            (json!({"iss": null, "aud": "turnpike"}), "iss"),
            (json!({"iss": "https://idp", "aud": []}), "audience"),
            (json!({"iss": "https://idp", "aud": 7}), "aud"),
            (json!({"iss": "https://other", "aud": "turnpike"}), "issuer"),
            (json!({"iss": "https://idp", "aud": "other"}), "audience"),
        ] {
            let refused = v.verify(&token(claims.clone()));
            match refused {
                Err(message) => assert!(message.contains(why), "{claims}: {message}"),
                Ok(_) => panic!("{claims} was accepted"),
            }
        }
    }

    #[test]
    fn unconfigured_claims_are_not_required() {
        let v = verifier(None, None);
        assert!(v.verify(&token(json!({}))).is_ok());
        assert!(v.verify(&token(json!({"aud": "anything"}))).is_ok());
        let only_aud = verifier(None, Some("turnpike"));
        assert!(only_aud.verify(&token(json!({"aud": "turnpike"}))).is_ok());
        assert!(only_aud.verify(&token(json!({"iss": "x"}))).is_err());
    }

    #[test]
    fn scope_items_narrow_only_what_they_name() {
        let s = scopes_from(&["model:a".into(), "openid".into()]);
        assert!(s.models.allows_any(["a"].into_iter()));
        assert!(!s.models.allows_any(["b"].into_iter()));
        assert_eq!(s.endpoints, None);
        let s = scopes_from(&["endpoint:chat".into(), "endpoint:bogus".into()]);
        assert_eq!(s.models, NameSet::All);
        assert_eq!(s.endpoints, Some([Endpoint::Chat].into_iter().collect()));
        assert!(!s.admin);
        let s = scopes_from(&["admin".into(), "model:a".into()]);
        assert!(s.admin && s.endpoints.is_none());
    }
}
