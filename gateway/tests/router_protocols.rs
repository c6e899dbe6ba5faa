//! What the protocol layer owes its callers, in-process: Responses errors name the Responses
//! API's own parameters (never chat's), and a WebSocket turn that fails after it started sends
//! the events it had, then an error event with the failure's status, and the socket lives on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::*;
use tokio_tungstenite::tungstenite::Message;
use turnpike_engine_api::{FinalEvent, Status, Usage};

/// A fake whose answer to a prompt containing `fail` is "Hello" and then an engine failure.
fn failing_app() -> axum::Router {
    let (_, backend) = fake(Box::new(|request| {
        let prompt = tokenizer().decode(&request.prompt, false).unwrap();
        if !prompt.contains("fail") {
            return Ok(say("all good"));
        }
        let mut steps: Vec<Step> = say("Hello")
            .into_iter()
            .filter(|s| matches!(s, Step::Token { .. }))
            .flat_map(|s| [s, Step::Sleep(Duration::from_millis(5))])
            .collect();
        steps.push(Step::Final(FinalEvent::failed(
            Status::Internal,
            "the device fell over",
            Usage::default(),
        )));
        Ok(steps)
    }));
    app_with(backend, server(10_000, 30_000))
}

async fn responses_error(body: Value, status: u16) -> Value {
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    error_of(
        &post(&app, "/v1/responses", &body.to_string()).await,
        status,
    )
}

#[tokio::test]
async fn responses_errors_name_the_responses_parameters() {
    let e = responses_error(
        json!({"model": "fake", "input": "Hi", "max_output_tokens": 0}),
        400,
    )
    .await;
    assert_eq!(e["param"], "max_output_tokens", "{e}");
    let e = responses_error(
        json!({"model": "fake", "input": "Hi", "max_output_tokens": 1_000_000}),
        400,
    )
    .await;
    assert_eq!(e["param"], "max_output_tokens", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("'max_output_tokens'"),
        "{e}"
    );
    let long = "word ".repeat(3000);
    let e = responses_error(json!({"model": "fake", "input": long}), 400).await;
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("context_length_exceeded"), Some("input")),
        "{e}"
    );
    assert!(!e["message"].as_str().unwrap().contains("messages"), "{e}");
    let e = responses_error(
        json!({"model": "fake", "input": "Hi", "reasoning": {"effort": "enormous"}}),
        400,
    )
    .await;
    assert_eq!(e["param"], "reasoning.effort", "{e}");
    let e = responses_error(
        json!({"model": "fake", "input": "Hi", "include": ["message.output_text.logprobs"],
               "top_logprobs": 21}),
        400,
    )
    .await;
    assert_eq!(e["param"], "top_logprobs", "{e}");
    // Chat keeps its own names for the same mistakes.
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    let chat = json!({"model": "fake", "messages": [{"role": "user", "content": long}]});
    let e = error_of(
        &post(&app, "/v1/chat/completions", &chat.to_string()).await,
        400,
    );
    assert_eq!(e["param"], "messages", "{e}");
}

/// Serves `app` on a free loopback port.
async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text message, as JSON (`[DONE]` as a string).
async fn next_json(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a message in time")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap_or(Value::String(text.to_string()));
        }
    }
}

/// Reads messages up to and including the first that `last` accepts.
async fn until(socket: &mut Socket, last: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let message = next_json(socket).await;
        let done = last(&message);
        seen.push(message);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn a_chat_turn_failing_mid_stream_sends_an_error_event_and_the_socket_lives_on() {
    let addr = serve(failing_app()).await;
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/chat/completions"))
            .await
            .unwrap();
    let turn = |text: &str| {
        json!({"model": "fake", "messages": [{"role": "user", "content": text}]}).to_string()
    };
    socket
        .send(Message::Text(turn("please fail").into()))
        .await
        .unwrap();
    let seen = until(&mut socket, |m| m["type"] == "error" || m == "[DONE]").await;
    let (error, chunks) = seen.split_last().unwrap();
    assert_eq!(error["type"], "error", "{seen:?}");
    assert_eq!(error["status"], 500, "{error}");
    assert_eq!(error["error"]["type"], "server_error", "{error}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello", "{chunks:?}");
    // The socket is still open: the next turn runs.
    socket
        .send(Message::Text(turn("all fine").into()))
        .await
        .unwrap();
    let seen = until(&mut socket, |m| m == "[DONE]" || m["type"] == "error").await;
    assert_eq!(seen.last().unwrap(), "[DONE]", "{seen:?}");
    let text: String = seen
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "all good");
}

#[tokio::test]
async fn a_responses_turn_failing_mid_stream_ends_with_response_failed() {
    let addr = serve(failing_app()).await;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/responses"))
        .await
        .unwrap();
    let create = |text: &str| {
        json!({"type": "response.create", "model": "fake", "input": text, "store": false})
            .to_string()
    };
    socket
        .send(Message::Text(create("please fail").into()))
        .await
        .unwrap();
    let terminal = |m: &Value| {
        matches!(
            m["type"].as_str(),
            Some("response.failed" | "response.completed" | "response.incomplete" | "error")
        )
    };
    let seen = until(&mut socket, terminal).await;
    let failed = seen.last().unwrap();
    assert_eq!(failed["type"], "response.failed", "{seen:?}");
    assert_eq!(failed["response"]["status"], "failed");
    assert_eq!(failed["response"]["error"]["code"], "server_error");
    let text: String = seen
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "Hello");
    socket
        .send(Message::Text(create("all fine").into()))
        .await
        .unwrap();
    let seen = until(&mut socket, terminal).await;
    // `say` ends at the output budget.
    assert_eq!(
        seen.last().unwrap()["type"],
        "response.incomplete",
        "{seen:?}"
    );
}
