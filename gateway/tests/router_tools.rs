//! Tool calls in `/v1/chat/completions`: parsed out of the model's text in its configured format,
//! the same calls streamed and not, and `tool_choice` / `parallel_tool_calls` honoured.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use support::*;
use tower::ServiceExt;
use turnpike::config::ToolCallFormat;
use turnpike_engine_api::{FinalEvent, Finish, Usage};

const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#;
const TIME: &str = r#"{"type": "function", "function": {"name": "get_time"}}"#;

/// Steps that emit `text` and end the turn with the end-of-turn token.
fn say_and_stop(text: &str) -> Vec<Step> {
    let mut steps = say(text);
    steps.pop();
    steps.push(Step::Final(FinalEvent::ok(
        Finish::stop(4),
        Usage {
            completion_tokens: ids(text).len() as u32,
            ..Usage::default()
        },
    )));
    steps
}

fn app_saying(text: &'static str, format: Option<ToolCallFormat>) -> Router {
    let (_, backend) = fake(Box::new(move |_| Ok(say_and_stop(text))));
    app_with_model(backend, server(10_000, 10_000), |m| {
        m.tool_call_parser = format;
    })
}

fn request(extra: Value) -> String {
    let mut body = json!({
        "model": "fake",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [serde_json::from_str::<Value>(WEATHER).unwrap(), serde_json::from_str::<Value>(TIME).unwrap()],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

/// The calls of a streamed choice 0, put together as a client does: (name, arguments) by index,
/// its content, and its one finish reason.
fn assemble(reply: &Reply) -> (Vec<(String, String)>, String, String) {
    let (events, done) = reply.events();
    assert!(done);
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut content = String::new();
    let mut finishes = Vec::new();
    for e in &events {
        let Some(choice) = e["choices"].get(0) else {
            continue;
        };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        for piece in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = piece["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(
                    piece["id"].as_str().unwrap().starts_with("call_"),
                    "{piece}"
                );
                assert_eq!(piece["type"], "function");
                calls.push((
                    piece["function"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            }
            calls[index].1 += piece["function"]["arguments"].as_str().unwrap_or("");
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finishes.push(reason.to_string());
        }
    }
    assert_eq!(finishes.len(), 1, "one finish reason: {finishes:?}");
    (calls, content, finishes.remove(0))
}

fn folded_calls(body: &Value) -> Vec<(String, String)> {
    body["choices"][0]["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            assert!(c["id"].as_str().unwrap().starts_with("call_"));
            assert_eq!(c["type"], "function");
            (
                c["function"]["name"].as_str().unwrap().into(),
                c["function"]["arguments"].as_str().unwrap().into(),
            )
        })
        .collect()
}

#[tokio::test]
async fn llama3_json_calls_come_back_the_same_streamed_and_not() {
    let app = app_saying(
        r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
        Some(ToolCallFormat::Llama3Json),
    );
    let reply = post(&app, "/v1/chat/completions", &request(json!({}))).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    let expected = vec![("get_weather".to_string(), r#"{"city":"Paris"}"#.to_string())];
    assert_eq!(folded_calls(&body), expected);
    assert!(body["choices"][0]["message"]["content"].is_null(), "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");

    let reply = post(
        &app,
        "/v1/chat/completions",
        &request(json!({"stream": true})),
    )
    .await;
    let (calls, content, finish) = assemble(&reply);
    assert_eq!(
        (calls, content.as_str(), finish.as_str()),
        (expected, "", "tool_calls")
    );
}

#[tokio::test]
async fn hermes_blocks_keep_their_content_and_parallel_false_keeps_one_call() {
    let app = app_saying(
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\"}</tool_call>",
        Some(ToolCallFormat::Hermes),
    );
    let both = vec![
        ("get_weather".to_string(), r#"{"city":"Paris"}"#.to_string()),
        ("get_time".to_string(), "{}".to_string()),
    ];
    let body = post(&app, "/v1/chat/completions", &request(json!({})))
        .await
        .json();
    assert_eq!(folded_calls(&body), both);
    assert_eq!(body["choices"][0]["message"]["content"], "Checking.\n");
    let reply = post(
        &app,
        "/v1/chat/completions",
        &request(json!({"stream": true})),
    )
    .await;
    assert_eq!(
        assemble(&reply),
        (both.clone(), "Checking.\n".into(), "tool_calls".into())
    );

    let one = request(json!({"parallel_tool_calls": false}));
    let body = post(&app, "/v1/chat/completions", &one).await.json();
    assert_eq!(folded_calls(&body), both[..1].to_vec());
}

#[tokio::test]
async fn text_that_is_not_an_offered_call_stays_text() {
    let call = r#"{"name": "delete_everything", "parameters": {}}"#;
    let app = app_saying(call, Some(ToolCallFormat::Llama3Json));
    let body = post(&app, "/v1/chat/completions", &request(json!({})))
        .await
        .json();
    assert_eq!(body["choices"][0]["message"]["content"], call);
    assert!(
        body["choices"][0]["message"].get("tool_calls").is_none(),
        "{body}"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    // With tool_choice none nothing is parsed, even a real call.
    let real = r#"{"name": "get_time", "parameters": {}}"#;
    let app = app_saying(real, Some(ToolCallFormat::Llama3Json));
    let body = post(
        &app,
        "/v1/chat/completions",
        &request(json!({"tool_choice": "none"})),
    )
    .await
    .json();
    assert_eq!(body["choices"][0]["message"]["content"], real);
}

#[tokio::test]
async fn tools_that_cannot_be_honoured_are_refused_by_name() {
    // A model whose configuration names no tool-call format reads calls in the one its
    // template teaches (else Hermes blocks): offering it tools is no error.
    let app = app_saying("hello", None);
    let reply = post(&app, "/v1/chat/completions", &request(json!({}))).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // Offering tools the model may not call is harmless.
    let reply = post(
        &app,
        "/v1/chat/completions",
        &request(json!({"tool_choice": "none"})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    let app = app_saying("hello", Some(ToolCallFormat::Hermes));
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_time"}}),
    ] {
        let reply = post(
            &app,
            "/v1/chat/completions",
            &request(json!({"tool_choice": choice})),
        )
        .await;
        assert_eq!(error_of(&reply, 400)["param"], "tool_choice");
    }
}

#[tokio::test]
async fn a_call_being_parsed_does_not_hold_back_the_stream_head() {
    // The answer's first tokens arrive at once, then the engine is slow; the heartbeat is long.
    let (_, backend) = fake(Box::new(|_| {
        let mut steps = say_and_stop(r#"{"name": "get_time", "parameters": {}}"#);
        steps.insert(3, Step::Sleep(Duration::from_secs(30)));
        Ok(steps)
    }));
    let app = app_with_model(backend, server(10_000, 60_000), |m| {
        m.tool_call_parser = Some(ToolCallFormat::Llama3Json);
    });
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(request(json!({"stream": true}))))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(3), app.oneshot(request))
        .await
        .expect("headers are sent once the engine is under way")
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
}

#[tokio::test]
async fn tool_choice_none_keeps_the_tools_out_of_the_prompt() {
    let (seen, backend) = fake(Box::new(|_| Ok(say_and_stop("Sunny."))));
    let app = app_with_model(backend, server(10_000, 10_000), |m| {
        m.tool_call_parser = Some(ToolCallFormat::Llama3Json);
    });
    for (choice, shown) in [(json!("auto"), true), (json!("none"), false)] {
        let reply = post(
            &app,
            "/v1/chat/completions",
            &request(json!({"tool_choice": choice})),
        )
        .await;
        assert_eq!(reply.json()["choices"][0]["message"]["content"], "Sunny.");
        let prompt = support::tokenizer()
            .decode(&seen.requests.lock().unwrap().last().unwrap().prompt, false)
            .unwrap();
        assert_eq!(prompt.contains("get_weather"), shown, "{choice}: {prompt}");
    }
}
