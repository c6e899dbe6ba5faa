//! Authentication, limits and idempotency in-process: the real router, admission middleware and
//! in-memory store over a scripted engine. (The Redis backend and the SDK are exercised by the
//! black-box tests in `tests/python`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use support::*;
use turnpike::tenancy::keys;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jwt")
        .join(name)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An app whose tenancy is `toml`, plus `keys` written to a keys file (one per tenant named).
fn tenant_app(toml: &str, tenants: &[&str]) -> (Router, Vec<String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut file = String::new();
    let mut made = Vec::new();
    for tenant in tenants {
        let (key, id) = keys::generate().unwrap();
        file.push_str(&format!(
            "[[keys]]\nid = \"{id}\"\nhash = \"{}\"\ntenant = \"{tenant}\"\n",
            keys::hash_text(&keys::hash(&key))
        ));
        made.push(key);
    }
    let keys_file = dir.path().join("keys.toml");
    std::fs::write(&keys_file, file).unwrap();
    let text = format!(
        "[auth]\nkeys_file = {:?}\n{toml}",
        keys_file.display().to_string()
    );
    let (_, backend) = fake(Box::new(|_| Ok(say("Fine, thanks."))));
    let app = app_with_tenancy(backend, server(10_000, 10_000), |_| {}, tenancy(&text));
    (app, made, dir)
}

async fn call(app: &Router, key: Option<&str>, idem: Option<&str>, body: Value) -> Reply {
    let mut request =
        Request::post("/v1/chat/completions").header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    if let Some(idem) = idem {
        request = request.header("idempotency-key", idem);
    }
    send(app, request.body(Body::from(body.to_string())).unwrap()).await
}

fn chat() -> Value {
    json!({"model": "fake", "messages": [{"role": "user", "content": "How are you?"}], "max_tokens": 20})
}

#[tokio::test]
async fn keys_are_checked_and_plans_scope_models() {
    let (app, keys, _dir) = tenant_app(
        "[tenants.acme]\nmodels = [\"*\"]\n[tenants.globex]\nmodels = [\"other\"]\n",
        &["acme", "globex"],
    );
    let ok = call(&app, Some(&keys[0]), None, chat()).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    for bad in [None, Some("tp-nope"), Some(&*keys[0].replace("tp-", "sk-"))] {
        let reply = call(&app, bad, None, chat()).await;
        assert_eq!(error_of(&reply, 401)["code"], "invalid_api_key");
    }
    let denied = call(&app, Some(&keys[1]), None, chat()).await;
    let error = error_of(&denied, 403);
    assert_eq!(
        (error["code"].as_str(), error["param"].as_str()),
        (Some("model_not_allowed"), Some("model"))
    );
    let request = Request::get("/v1/models")
        .header("authorization", format!("Bearer {}", keys[1]))
        .body(Body::empty())
        .unwrap();
    let listed = send(&app, request).await;
    assert_eq!(
        listed.json()["data"],
        json!([]),
        "globex sees no model it may not use"
    );
    // Health and metrics stay open for probes.
    assert_eq!(get(&app, "/health").await.status, 200);
}

#[tokio::test]
async fn rate_limits_answer_429_with_openai_headers() {
    let (app, keys, _dir) = tenant_app(
        "[tenants.acme]\nrequests_per_second = 2\nrequests_per_minute = 100\ntokens_per_minute = 1000\n",
        &["acme"],
    );
    let first = call(&app, Some(&keys[0]), None, chat()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let h = &first.headers;
    assert_eq!(h["x-ratelimit-limit-requests"], "2");
    assert_eq!(h["x-ratelimit-remaining-requests"], "1");
    assert_eq!(h["x-ratelimit-limit-tokens"], "1000");
    let remaining: u64 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        remaining < 1000 - 20,
        "the prompt and max_tokens were reserved: {remaining}"
    );
    call(&app, Some(&keys[0]), None, chat()).await;
    let refused = call(&app, Some(&keys[0]), None, chat()).await;
    let error = error_of(&refused, 429);
    assert_eq!(
        (error["type"].as_str(), error["code"].as_str()),
        (Some("requests"), Some("rate_limit_exceeded"))
    );
    for name in [
        "retry-after",
        "retry-after-ms",
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-requests",
    ] {
        assert!(refused.headers.contains_key(name), "{name} missing");
    }
    assert_eq!(refused.headers["x-ratelimit-remaining-requests"], "0");
    assert_eq!(refused.headers["x-should-retry"], "true");
}

#[tokio::test]
async fn a_request_larger_than_the_token_limit_is_never_retried() {
    let (app, keys, _dir) = tenant_app("[tenants.acme]\ntokens_per_minute = 120\n", &["acme"]);
    let mut body = chat();
    body["max_tokens"] = json!(120);
    let reply = call(&app, Some(&keys[0]), None, body).await;
    let error = error_of(&reply, 429);
    assert_eq!(error["type"], "tokens");
    assert_eq!(reply.headers["x-should-retry"], "false");
    assert!(!reply.headers.contains_key("retry-after"));
    // Each reserves prompt + 70 tokens of the 120; only the unused part coming back lets a
    // second one in.
    for _ in 0..2 {
        let mut small = chat();
        small["max_tokens"] = json!(70);
        let ok = call(&app, Some(&keys[0]), None, small).await;
        assert_eq!(ok.status, 200, "{}", ok.body);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn idempotent_requests_replay_conflict_and_stay_within_their_tenant() {
    let (app, keys, _dir) = tenant_app("[tenants.acme]\n[tenants.globex]\n", &["acme", "globex"]);
    let first = call(&app, Some(&keys[0]), Some("order-1"), chat()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(!first.headers.contains_key("idempotent-replayed"));
    let again = call(&app, Some(&keys[0]), Some("order-1"), chat()).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["x-request-id"], first.headers["x-request-id"]);
    // Key order and whitespace do not make a different request.
    let reordered: Value = serde_json::from_str(&chat().to_string()).unwrap();
    assert_eq!(
        call(&app, Some(&keys[0]), Some("order-1"), reordered)
            .await
            .body,
        first.body
    );
    let mut other = chat();
    other["max_tokens"] = json!(21);
    let conflict = call(&app, Some(&keys[0]), Some("order-1"), other).await;
    assert_eq!(error_of(&conflict, 409)["code"], "idempotency_key_reused");
    let theirs = call(&app, Some(&keys[1]), Some("order-1"), chat()).await;
    assert_eq!(theirs.status, 200);
    assert!(!theirs.headers.contains_key("idempotent-replayed"));
    assert_ne!(theirs.json()["id"], first.json()["id"]);
    let long = "k".repeat(300);
    let bad = call(&app, Some(&keys[0]), Some(&long), chat()).await;
    assert_eq!(error_of(&bad, 400)["code"], "invalid_header");
}

#[tokio::test]
async fn streams_replay_event_for_event() {
    let (app, keys, _dir) = tenant_app("[tenants.acme]\n", &["acme"]);
    let mut body = chat();
    body["stream"] = json!(true);
    let first = call(&app, Some(&keys[0]), Some("s-1"), body.clone()).await;
    let (events, done) = first.events();
    assert!(done && !events.is_empty());
    let again = call(&app, Some(&keys[0]), Some("s-1"), body).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.headers["content-type"], "text/event-stream");
    assert_eq!(again.body, first.body);
}

fn token(alg: Algorithm, key: &EncodingKey, claims: Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), &claims, key).unwrap()
}

/// `signed`'s header and signature around `other`'s claims.
fn tampered(signed: &str, other: &str) -> String {
    let a: Vec<&str> = signed.split('.').collect();
    let b: Vec<&str> = other.split('.').collect();
    format!("{}.{}.{}", a[0], b[1], a[2])
}

fn jwt_app(alg: &str, public: &str) -> Router {
    let text = format!(
        "[auth.jwt]\nalgorithm = \"{alg}\"\npublic_key_file = {:?}\nissuer = \"https://issuer.test\"\naudience = \"turnpike\"\n[tenants.acme]\n",
        fixture(public).display().to_string()
    );
    let (_, backend) = fake(Box::new(|_| Ok(say("Fine."))));
    app_with_tenancy(backend, server(10_000, 10_000), |_| {}, tenancy(&text))
}

#[tokio::test]
async fn jwts_are_verified_with_the_pinned_algorithm_audience_and_expiry() {
    let rsa =
        EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa-private.pem")).unwrap()).unwrap();
    let ec = EncodingKey::from_ec_pem(&std::fs::read(fixture("ec-private.pem")).unwrap()).unwrap();
    let good = json!({"tenant": "acme", "sub": "svc-1", "iss": "https://issuer.test", "aud": "turnpike", "exp": now() + 600});
    for (app, alg, key) in [
        (jwt_app("RS256", "rsa-public.pem"), Algorithm::RS256, &rsa),
        (jwt_app("ES256", "ec-public.pem"), Algorithm::ES256, &ec),
    ] {
        let ok = call(&app, Some(&token(alg, key, good.clone())), None, chat()).await;
        assert_eq!(ok.status, 200, "{alg:?}: {}", ok.body);
        let with = |k: &str, v: Value| {
            let mut c = good.clone();
            c[k] = v;
            token(alg, key, c)
        };
        for (bad, says) in [
            (with("aud", json!("someone-else")), "audience"),
            (with("iss", json!("https://evil.test")), "issuer"),
            (with("exp", json!(now() - 3600)), "expired"),
            (with("nbf", json!(now() + 3600)), "not valid yet"),
            (with("tenant", json!("initech")), "not known"),
            (
                token(
                    Algorithm::HS256,
                    &EncodingKey::from_secret(b"guess"),
                    good.clone(),
                ),
                "accepts only",
            ),
            (
                tampered(&token(alg, key, good.clone()), &with("sub", json!("svc-2"))),
                "signature",
            ),
            ("not.a.jwt".to_string(), "well-formed"),
        ] {
            let reply = call(&app, Some(&bad), None, chat()).await;
            let error = error_of(&reply, 401);
            assert!(
                error["message"].as_str().unwrap().contains(says),
                "{alg:?} {says}: {error}"
            );
        }
    }
    // The RSA public key used as an HMAC secret (the classic confusion attack) fails too.
    let app = jwt_app("RS256", "rsa-public.pem");
    let public = std::fs::read(fixture("rsa-public.pem")).unwrap();
    let forged = token(
        Algorithm::HS256,
        &EncodingKey::from_secret(&public),
        good.clone(),
    );
    assert_eq!(call(&app, Some(&forged), None, chat()).await.status, 401);
    // Scopes in the token narrow the tenant's rights.
    let mut scoped = good.clone();
    scoped["scope"] = json!("endpoint:models");
    let reply = call(
        &app,
        Some(&token(Algorithm::RS256, &rsa, scoped)),
        None,
        chat(),
    )
    .await;
    assert_eq!(error_of(&reply, 403)["code"], "endpoint_not_allowed");
}

#[tokio::test]
async fn a_full_model_queue_answers_queue_full_and_waiters_learn_their_place() {
    use tower::ServiceExt;
    let (app, keys, _dir) = tenant_app(
        "[tenants.acme]\n[queue]\nmax_running = 1\nmax_waiting = 1\n",
        &["acme"],
    );
    let request = |key: &str| {
        let mut body = chat();
        body["stream"] = json!(true);
        Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    // A stream holds its place until its body is read or dropped.
    let running = app.clone().oneshot(request(&keys[0])).await.unwrap();
    assert_eq!(running.status(), 200);
    let waiting = tokio::spawn({
        let (app, req) = (app.clone(), request(&keys[0]));
        async move { app.oneshot(req).await.unwrap() }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let full = send(&app, request(&keys[0])).await;
    assert_eq!(error_of(&full, 429)["code"], "queue_full");
    drop(running);
    let admitted = waiting.await.unwrap();
    assert_eq!(admitted.status(), 200);
    assert_eq!(admitted.headers()["x-queue-position"], "1");
}

#[tokio::test]
async fn a_jwks_file_supplies_keys_picked_by_kid() {
    let rsa =
        EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa-private.pem")).unwrap()).unwrap();
    let text = format!(
        "[auth.jwt]\nalgorithm = \"RS256\"\njwks_file = {:?}\n[tenants.acme]\n",
        fixture("rsa-jwks.json").display().to_string()
    );
    let (_, backend) = fake(Box::new(|_| Ok(say("Fine."))));
    let app = app_with_tenancy(backend, server(10_000, 10_000), |_| {}, tenancy(&text));
    let claims = json!({"tenant": "acme", "exp": now() + 600});
    let signed = |kid: &str| {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, &claims, &rsa).unwrap()
    };
    assert_eq!(
        call(&app, Some(&signed("k1")), None, chat()).await.status,
        200
    );
    let reply = call(&app, Some(&signed("k2")), None, chat()).await;
    assert!(
        error_of(&reply, 401)["message"]
            .as_str()
            .unwrap()
            .contains("kid")
    );
}
