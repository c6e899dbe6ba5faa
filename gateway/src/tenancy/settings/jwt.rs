//! `[auth.jwt]` as written, and its keys read and checked at load: a PEM public key, a JWKS
//! file, or an HMAC secret from the environment.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::tenancy::jwt::{JwtSettings, JwtVerifier};

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    algorithm: String,
    secret_env: Option<String>,
    public_key_file: Option<String>,
    jwks_file: Option<String>,
    issuer: Option<String>,
    audience: Option<String>,
    tenant_claim: Option<String>,
    scope_claim: Option<String>,
    leeway_secs: Option<u64>,
}

fn read(base: &Path, file: &str, at: &str) -> Result<(PathBuf, Vec<u8>), String> {
    let path = base.join(file);
    let bytes = std::fs::read(&path).map_err(|e| format!("{at}: {}: {e}", path.display()))?;
    Ok((path, bytes))
}

/// The verifier `raw` describes, its keys read (relative to `base`) and checked now, and a
/// fingerprint of its settings and key material: two loads of the same settings and keys have
/// the same one, so a reload can tell whether verification changed.
pub(super) fn verifier(raw: RawJwt, base: &Path) -> Result<(JwtVerifier, [u8; 32]), String> {
    use jsonwebtoken::{Algorithm, DecodingKey};
    let algorithm = match raw.algorithm.as_str() {
        "HS256" => Algorithm::HS256,
        "RS256" => Algorithm::RS256,
        "ES256" => Algorithm::ES256,
        other => {
            return Err(format!(
                "auth.jwt.algorithm: `{other}` is not HS256, RS256 or ES256"
            ));
        }
    };
    let sources = [&raw.secret_env, &raw.public_key_file, &raw.jwks_file]
        .iter()
        .filter(|s| s.is_some())
        .count();
    if sources != 1 {
        return Err("auth.jwt: give exactly one of secret_env, public_key_file, jwks_file".into());
    }
    let mut keys = Vec::new();
    let mut fingerprint = Sha256::new();
    fingerprint.update(serde_json::to_vec(&raw).unwrap_or_default());
    if let Some(var) = &raw.secret_env {
        if algorithm != Algorithm::HS256 {
            return Err("auth.jwt.secret_env is for HS256; RS256 and ES256 need public_key_file or jwks_file".into());
        }
        let secret = std::env::var(var)
            .map_err(|_| format!("auth.jwt.secret_env: environment variable {var} is not set"))?;
        if secret.len() < 32 {
            return Err(format!(
                "auth.jwt.secret_env: {var} must hold at least 32 bytes"
            ));
        }
        fingerprint.update(secret.as_bytes());
        keys.push((None, DecodingKey::from_secret(secret.as_bytes())));
    }
    if let Some(file) = &raw.public_key_file {
        let (path, pem) = read(base, file, "auth.jwt.public_key_file")?;
        fingerprint.update(&pem);
        let key = match algorithm {
            Algorithm::RS256 => DecodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => DecodingKey::from_ec_pem(&pem),
            _ => {
                return Err(
                    "auth.jwt.public_key_file is for RS256 and ES256; HS256 uses secret_env".into(),
                );
            }
        }
        .map_err(|e| format!("auth.jwt.public_key_file: {}: {e}", path.display()))?;
        keys.push((None, key));
    }
    if let Some(file) = &raw.jwks_file {
        let (path, text) = read(base, file, "auth.jwt.jwks_file")?;
        fingerprint.update(&text);
        let set: jsonwebtoken::jwk::JwkSet = serde_json::from_slice(&text)
            .map_err(|e| format!("auth.jwt.jwks_file: {}: {e}", path.display()))?;
        for jwk in &set.keys {
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| format!("auth.jwt.jwks_file: {}: {e}", path.display()))?;
            keys.push((jwk.common.key_id.clone(), key));
        }
        if keys.is_empty() {
            return Err(format!(
                "auth.jwt.jwks_file: {} holds no keys",
                path.display()
            ));
        }
    }
    let verifier = JwtVerifier::new(JwtSettings {
        algorithm,
        keys,
        issuer: raw.issuer,
        audience: raw.audience,
        tenant_claim: raw.tenant_claim.unwrap_or_else(|| "tenant".into()),
        scope_claim: raw.scope_claim.unwrap_or_else(|| "scope".into()),
        leeway_secs: raw.leeway_secs.unwrap_or(30),
    });
    Ok((verifier, fingerprint.finalize().into()))
}
