//! Every failure is an OpenAI error body with the right status, in-process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use support::*;
use turnpike_engine_api::{EngineError, FinalEvent, Status, Usage};

fn chat(extra: Value) -> String {
    let mut b = json!({"model": "fake", "messages": [{"role": "user", "content": "Hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

async fn chat_error(extra: Value, status: u16) -> Value {
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    error_of(
        &post(&app, "/v1/chat/completions", &chat(extra)).await,
        status,
    )
}

#[tokio::test]
async fn malformed_bodies_and_missing_parameters() {
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    let e = error_of(&post(&app, "/v1/chat/completions", "{not json").await, 400);
    assert_eq!(e["code"], "invalid_json");
    let e = error_of(&post(&app, "/v1/chat/completions", "[1, 2]").await, 400);
    assert_eq!(e["code"], "invalid_json");
    let e = error_of(
        &post(&app, "/v1/chat/completions", r#"{"messages": []}"#).await,
        400,
    );
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("missing_required_parameter"), Some("model"))
    );
    let e = error_of(
        &post(&app, "/v1/completions", r#"{"model": "fake"}"#).await,
        400,
    );
    assert_eq!(e["param"], "prompt");
    let e = error_of(
        &post(&app, "/v1/chat/completions", &chat(json!({"messages": []}))).await,
        400,
    );
    assert_eq!(e["param"], "messages");
}

#[tokio::test]
async fn bad_values_name_their_parameter() {
    for (extra, param) in [
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"temperature": 3.5}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"n": 1.5}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 200}), "max_tokens"),
        (json!({"presence_penalty": 9}), "presence_penalty"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (json!({"stop_token_ids": [5000]}), "stop_token_ids"),
        (json!({"stop_token_ids": vec![5; 257]}), "stop_token_ids"),
        (json!({"min_tokens": 65}), "min_tokens"),
    ] {
        let e = chat_error(extra.clone(), 400).await;
        assert_eq!(e["param"], param, "{extra}: {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn unsupported_features_are_refused_not_ignored() {
    for (extra, param) in [
        (json!({"n": 9}), "n"),
        (json!({"logit_bias": {"5": 10}}), "logit_bias"),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
    ] {
        let e = chat_error(extra.clone(), 400).await;
        assert_eq!(
            (e["param"].as_str(), e["code"].as_str()),
            (Some(param), Some("unsupported_parameter")),
            "{extra}: {e}"
        );
    }
    // Forcing a call needs tools to call (a model that cannot be forced is in router_tools).
    let e = chat_error(json!({"tool_choice": "required"}), 400).await;
    assert_eq!(
        (e["param"].as_str(), e["code"].as_str()),
        (Some("tool_choice"), Some("invalid_value")),
        "{e}"
    );
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    let e = error_of(
        &post(
            &app,
            "/v1/completions",
            &json!({"model": "fake", "prompt": "a", "suffix": "z"}).to_string(),
        )
        .await,
        400,
    );
    assert_eq!(e["param"], "suffix");
    let e = error_of(
        &post(
            &app,
            "/v1/completions",
            &json!({"model": "fake", "prompt": "a", "echo": true, "logprobs": 1}).to_string(),
        )
        .await,
        400,
    );
    assert_eq!(e["param"], "echo");
    let e = error_of(
        &post(
            &app,
            "/v1/completions",
            &json!({"model": "fake", "prompt": "a", "best_of": 3}).to_string(),
        )
        .await,
        400,
    );
    assert_eq!(e["param"], "best_of");
    // Harmless values are accepted.
    let ok = post(
        &app,
        "/v1/completions",
        &json!({"model": "fake", "prompt": "a", "best_of": 1, "n": 1, "logprobs": false})
            .to_string(),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[tokio::test]
async fn invalid_schemas_are_400() {
    let e = chat_error(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ["not", "an", "object"]}}}), 400).await;
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (
            Some("invalid_schema"),
            Some("response_format.json_schema.schema")
        )
    );
    let e = chat_error(
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "nope"}}]}),
        400,
    )
    .await;
    assert_eq!(e["param"], "tools[0].function.parameters");
    let e = chat_error(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}), 400).await;
    assert_eq!(
        (e["type"].as_str(), e["param"].as_str()),
        (
            Some("invalid_request_error"),
            Some("response_format.json_schema.schema")
        )
    );
}

#[tokio::test]
async fn size_limits_context_and_unknown_models() {
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    let huge = chat(json!({"messages": [{"role": "user", "content": "x".repeat(100_000)}]}));
    assert_eq!(
        error_of(&post(&app, "/v1/chat/completions", &huge).await, 413)["code"],
        "request_too_large"
    );
    let long = chat(json!({"messages": [{"role": "user", "content": "the river ".repeat(1500)}]}));
    let e = error_of(&post(&app, "/v1/chat/completions", &long).await, 400);
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("context_length_exceeded"), Some("messages"))
    );
    let e = error_of(
        &post(
            &app,
            "/v1/chat/completions",
            &chat(json!({"model": "gpt-9"})),
        )
        .await,
        404,
    );
    assert_eq!(e["code"], "model_not_found");
    let e = error_of(&post(&app, "/v2/chat", "{}").await, 404);
    assert_eq!(e["code"], "unknown_url");
    // WebSocket routes answer a plain GET (no upgrade) the same way.
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let e = error_of(&get(&app, path).await, 405);
        assert_eq!(e["code"], "method_not_allowed");
    }
}

#[tokio::test]
async fn engine_refusals_map_to_statuses_with_retry_headers() {
    for (status, http, code) in [
        (Status::Overloaded, 429, "queue_full"),
        (Status::Unavailable, 503, "engine_unavailable"),
        (Status::InvalidRequest, 400, "invalid_request"),
    ] {
        let (_, app) = app(Box::new(move |_| {
            Err(EngineError::new(status, "engine says no"))
        }));
        let reply = post(&app, "/v1/chat/completions", &chat(json!({}))).await;
        let e = error_of(&reply, http);
        assert_eq!(e["code"], code);
        if http != 400 {
            assert_eq!(reply.headers["retry-after"], "2");
            assert_eq!(reply.headers["retry-after-ms"], "1500");
            assert_eq!(reply.headers["x-should-retry"], "true");
        }
    }
    let (_, app) = support::app(Box::new(|_| {
        Err(EngineError::internal("stack trace with /secret/path"))
    }));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    let e = error_of(&reply, 500);
    assert_eq!(
        reply.headers["x-should-retry"], "false",
        "the SDKs would retry a 500 that would fail again"
    );
    assert_eq!(
        e["message"],
        "The server had an error while processing your request."
    );
    assert!(!reply.body.contains("secret"));
}

#[tokio::test]
async fn failures_before_output_keep_their_status_and_after_become_an_error_event() {
    let (_, app) = app(Box::new(|_| {
        Ok(vec![Step::Final(FinalEvent::failed(
            Status::Unavailable,
            "device lost",
            Usage::default(),
        ))])
    }));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    assert_eq!(error_of(&reply, 503)["code"], "engine_unavailable");

    let (_, app) = support::app(Box::new(|_| {
        let mut steps = say("partial answer");
        steps.pop();
        steps.push(Step::Final(FinalEvent::failed(
            Status::Internal,
            "kernel fault",
            Usage::default(),
        )));
        Ok(steps)
    }));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    assert_eq!(reply.status, 200);
    let (events, done) = reply.events();
    assert!(!done, "no [DONE] after an error");
    let last = events.last().unwrap();
    assert_eq!(last["error"]["type"], "server_error");
    assert!(!reply.body.contains("kernel fault"));
    let folded = post(&app, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(error_of(&folded, 500)["type"], "server_error");
}

#[tokio::test]
async fn slow_requests_time_out() {
    let script: Script = Box::new(|_| {
        let mut steps = say("a");
        steps.insert(0, Step::Sleep(Duration::from_millis(500)));
        Ok(steps)
    });
    let (_, backend) = fake(script);
    let app = app_with(backend, server(50, 150));
    assert_eq!(
        error_of(
            &post(&app, "/v1/chat/completions", &chat(json!({}))).await,
            504
        )["code"],
        "timeout"
    );
    // Heartbeats began the stream before the deadline: the timeout is its last event.
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    let (events, _) = reply.events();
    assert_eq!(events.last().unwrap()["error"]["code"], "timeout");
    // Nothing sent yet when the deadline passes: a plain 504.
    let (_, backend) = fake(Box::new(|_| {
        let mut steps = say("a");
        steps.insert(0, Step::Sleep(Duration::from_millis(500)));
        Ok(steps)
    }));
    let app = app_with(backend, server(10_000, 150));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    assert_eq!(error_of(&reply, 504)["code"], "timeout");
}

#[tokio::test]
async fn only_json_bodies_are_read() {
    // A browser sends text/plain, forms and multipart cross-origin without a preflight.
    let (seen, app) = app(Box::new(|_| Ok(say("ok"))));
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=b"),
    ] {
        let mut request = Request::post("/v1/chat/completions");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let request = request.body(Body::from(chat(json!({})))).unwrap();
        let reply = send(&app, request).await;
        assert_eq!(
            error_of(&reply, 415)["code"],
            "unsupported_media_type",
            "{content_type:?}"
        );
    }
    assert!(seen.requests.lock().unwrap().is_empty());
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json; charset=utf-8")
        .body(Body::from(chat(json!({}))))
        .unwrap();
    assert_eq!(send(&app, request).await.status, 200);
}

#[tokio::test]
async fn browsers_get_cors_for_allowed_origins_only() {
    let (_, backend) = fake(Box::new(|_| Ok(say("ok"))));
    let mut config = server(10_000, 10_000);
    config.cors = turnpike::config::CorsOrigins::List(vec!["https://app.example".into()]);
    let app = app_with(backend, config);
    let preflight = |origin: &'static str| {
        Request::builder()
            .method("OPTIONS")
            .uri("/v1/chat/completions")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type,x-stainless-os,x-stainless-retry-count",
            )
            .body(Body::empty())
            .unwrap()
    };
    let reply = send(&app, preflight("https://app.example")).await;
    assert!(reply.status.is_success(), "{}", reply.status);
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "https://app.example"
    );
    let allowed = reply.headers["access-control-allow-headers"]
        .to_str()
        .unwrap();
    assert!(
        allowed.contains("authorization") && allowed.contains("x-stainless-retry-count"),
        "{allowed}"
    );
    let other = send(&app, preflight("https://evil.example")).await;
    assert!(other.headers.get("access-control-allow-origin").is_none());

    let request = Request::post("/v1/chat/completions")
        .header("origin", "https://app.example")
        .header("content-type", "application/json")
        .body(Body::from(chat(json!({}))))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "https://app.example"
    );
    let exposed = reply.headers["access-control-expose-headers"]
        .to_str()
        .unwrap();
    assert!(exposed.contains("x-request-id"), "{exposed}");
}
