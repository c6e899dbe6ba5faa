//! `/v1/chat/completions` in-process: the real router and pipeline over a scripted engine.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use futures_util::StreamExt;
use serde_json::{Value, json};
use support::*;
use tower::ServiceExt;
use turnpike_engine_api::{FinalEvent, Finish, TopLogprob, Usage};

fn chat(body: Value) -> String {
    let mut b = json!({"model": "fake", "messages": [{"role": "user", "content": "Hi there"}]});
    if let (Some(base), Some(extra)) = (b.as_object_mut(), body.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    b.to_string()
}

#[tokio::test]
async fn a_chat_answer_carries_the_engines_text_and_exact_usage() {
    let (seen, app) = app(Box::new(|_| Ok(say("The river moved slowly."))));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(reply.headers["x-request-id"], body["id"].as_str().unwrap());
    assert_eq!(body["model"], "fake");
    assert!(
        body["system_fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("fp_")
    );
    let choice = &body["choices"][0];
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "The river moved slowly.", "refusal": null})
    );
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["logprobs"], Value::Null);
    let request = seen.requests.lock().unwrap()[0].clone();
    let prompt = support::tokenizer().decode(&request.prompt, false).unwrap();
    assert_eq!(
        prompt,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], request.prompt.len());
    assert_eq!(
        usage["completion_tokens"],
        ids("The river moved slowly.").len()
    );
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
}

#[tokio::test]
async fn a_stream_follows_the_protocol_clients_check() {
    let (_, app) = app(Box::new(|_| Ok(say("Hello world, how are you?"))));
    let reply = post(
        &app,
        "/v1/chat/completions",
        &chat(json!({"stream": true, "stream_options": {"include_usage": true}})),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    assert!(
        reply
            .body
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .enumerate()
            .all(|(i, f)| f.starts_with(&format!("id: {i}\ndata: "))),
        "{}",
        reply.body
    );
    let (events, done) = reply.events();
    assert!(done, "ends with [DONE]");
    let first = &events[0];
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let ids: HashSet<_> = events
        .iter()
        .map(|e| (e["id"].clone(), e["created"].clone(), e["model"].clone()))
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "every chunk has the same id, created and model"
    );
    let finishes: Vec<_> = events
        .iter()
        .filter(|e| {
            e["choices"]
                .get(0)
                .is_some_and(|c| !c["finish_reason"].is_null())
        })
        .collect();
    assert_eq!(
        finishes.len(),
        1,
        "exactly one chunk carries a finish_reason"
    );
    let text: String = events
        .iter()
        .filter_map(|e| {
            e["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "Hello world, how are you?");
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert!(last["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e["usage"].is_null()),
        "other chunks carry usage: null"
    );
}

#[tokio::test]
async fn a_stop_string_across_tokens_is_cut_and_stops_the_engine() {
    // "the END marker" splits into several tokens; "ND m" spans a token boundary.
    // A pause after every token, so the engine can notice the cancel between tokens.
    let script: Script = Box::new(|_| {
        let steps =
            say("alpha beta the END marker and then a lot more text that should never be sent");
        Ok(steps
            .into_iter()
            .flat_map(|s| [s, Step::Sleep(Duration::from_millis(2))])
            .collect())
    });
    let (seen, app) = app(script);
    let reply = post(
        &app,
        "/v1/chat/completions",
        &chat(json!({"stop": ["ND m", "zzz"]})),
    )
    .await;
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["content"], "alpha beta the E");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        seen.cancels.load(Ordering::SeqCst),
        1,
        "the engine request was cancelled at the match"
    );
    // Usage still comes from the engine's final event: fewer tokens than the whole script.
    let completion = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        completion > 0
            && completion < ids("alpha beta the END marker and then a lot more text").len() as u64,
        "{completion}"
    );
}

#[tokio::test]
async fn a_stop_string_in_the_last_open_choice_stops_the_engine() {
    // Choice 0 ends on its own; choice 1 then hits a stop string while the engine would go on.
    // A token for a choice that was never asked for is ignored.
    let script: Script = Box::new(|_| {
        let token = |choice, id| Step::Token {
            choice,
            id,
            logprob: None,
            top: vec![],
        };
        let mut steps: Vec<Step> = ids("short").into_iter().map(|id| token(0, id)).collect();
        steps.push(Step::ChoiceEnd {
            choice: 0,
            finish: Finish::stop(4),
        });
        steps.push(token(7, 5));
        for id in ids("long answer STOP and then much more") {
            steps.push(token(1, id));
            steps.push(Step::Sleep(Duration::from_millis(2)));
        }
        steps.push(Step::Final(FinalEvent::ok(
            Finish::length(),
            Usage::default(),
        )));
        Ok(steps)
    });
    let (seen, app) = app(script);
    let body = post(
        &app,
        "/v1/chat/completions",
        &chat(json!({"n": 2, "stop": "STOP"})),
    )
    .await
    .json();
    assert_eq!(body["choices"][0]["message"]["content"], "short");
    assert_eq!(body["choices"][1]["message"]["content"], "long answer ");
    assert_eq!(body["choices"][1]["finish_reason"], "stop");
    assert_eq!(seen.cancels.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn streamed_text_never_splits_a_character() {
    let text = "Ünïcödé café 🙂 日本語 ok";
    let (_, app) = app(Box::new(move |_| Ok(say(text))));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    let (events, _) = reply.events();
    let pieces: Vec<String> = events
        .iter()
        .filter_map(|e| {
            e["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces.concat(), text);
}

#[tokio::test]
async fn several_choices_stream_as_indexed_chunks() {
    let script: Script = Box::new(|req| {
        assert_eq!(req.params.n, 3);
        let mut steps = Vec::new();
        for (i, word) in ["one", "two", "three"].iter().enumerate() {
            for id in ids(word) {
                steps.push(Step::Token {
                    choice: i as u32,
                    id,
                    logprob: None,
                    top: vec![],
                });
            }
            steps.push(Step::ChoiceEnd {
                choice: i as u32,
                finish: Finish::stop(4),
            });
        }
        steps.push(Step::Final(FinalEvent::ok(
            Finish::stop(4),
            Usage {
                completion_tokens: 9,
                ..Usage::default()
            },
        )));
        Ok(steps)
    });
    let (_, app) = app(script);
    let reply = post(
        &app,
        "/v1/chat/completions",
        &chat(json!({"n": 3, "stream": true})),
    )
    .await;
    let (events, done) = reply.events();
    assert!(done);
    for index in 0..3 {
        let mine: Vec<&Value> = events
            .iter()
            .filter(|e| e["choices"][0]["index"] == index)
            .collect();
        assert_eq!(
            mine[0]["choices"][0]["delta"]["role"], "assistant",
            "choice {index} opens with its role"
        );
        assert_eq!(
            mine.iter()
                .filter(|e| !e["choices"][0]["finish_reason"].is_null())
                .count(),
            1
        );
        let text: String = mine
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, ["one", "two", "three"][index as usize]);
    }
    let folded = post(&app, "/v1/chat/completions", &chat(json!({"n": 3})))
        .await
        .json();
    let texts: Vec<&str> = folded["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["one", "two", "three"]);
}

#[tokio::test]
async fn logprobs_in_the_chat_format_streamed_and_not() {
    let script: Script = Box::new(|req| {
        assert!(req.params.logprobs);
        assert_eq!(req.params.top_logprobs, 2);
        let words = ids("Good day");
        let mut steps: Vec<Step> = words
            .iter()
            .map(|&id| Step::Token {
                choice: 0,
                id,
                logprob: Some(-0.25),
                top: vec![
                    TopLogprob {
                        token_id: id,
                        logprob: -0.25,
                    },
                    TopLogprob {
                        token_id: 5,
                        logprob: -3.0,
                    },
                ],
            })
            .collect();
        steps.push(Step::Final(FinalEvent::ok(
            Finish::length(),
            Usage {
                completion_tokens: words.len() as u32,
                ..Usage::default()
            },
        )));
        Ok(steps)
    });
    let (_, app) = app(script);
    let body = post(
        &app,
        "/v1/chat/completions",
        &chat(json!({"logprobs": true, "top_logprobs": 2})),
    )
    .await
    .json();
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), ids("Good day").len());
    let tokens: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, "Good day");
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert!(content[0]["bytes"].is_array());
    let (events, _) = post(
        &app,
        "/v1/chat/completions",
        &chat(json!({"logprobs": true, "top_logprobs": 2, "stream": true})),
    )
    .await
    .events();
    let streamed: usize = events
        .iter()
        .filter_map(|e| {
            e["choices"].get(0)?["logprobs"]["content"]
                .as_array()
                .map(Vec::len)
        })
        .sum();
    assert_eq!(
        streamed,
        content.len(),
        "logprobs are not dropped from streams"
    );
}

#[tokio::test]
async fn parameters_reach_the_engine_checked_and_with_defaults() {
    let (seen, app) = app(Box::new(|_| Ok(say("ok"))));
    let body = chat(json!({
        "temperature": 0.2, "top_p": 0.9, "seed": 42, "max_completion_tokens": 7, "presence_penalty": 0.5,
        "top_k": 20, "nvext": {"min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": true, "top_k": 99},
        "stop_token_ids": [9], "user": "u-1", "metadata": {"k": "v"}, "best_of": 1, "logprobs": false
    }));
    assert_eq!(post(&app, "/v1/chat/completions", &body).await.status, 200);
    let p = seen.requests.lock().unwrap()[0].params.clone();
    assert_eq!(
        (p.temperature, p.top_p, p.seed, p.max_tokens),
        (0.2, 0.9, Some(42), 7)
    );
    assert_eq!(
        (p.top_k, p.min_p, p.repetition_penalty, p.ignore_eos),
        (20, 0.05, 1.1, true)
    );
    assert_eq!(p.presence_penalty, 0.5);
    assert_eq!(
        p.stop_token_ids,
        [9],
        "ignore_eos leaves out the model's own end-of-turn token"
    );
    assert!(p.request_id.as_deref().unwrap().starts_with("chatcmpl-"));

    assert_eq!(
        post(&app, "/v1/chat/completions", &chat(json!({})))
            .await
            .status,
        200
    );
    let p = seen.requests.lock().unwrap()[1].params.clone();
    assert_eq!(
        (p.temperature, p.max_tokens),
        (0.7, 64),
        "section 18 defaults, from the config"
    );
    assert_eq!(p.stop_token_ids, [1, 4], "the model's end-of-turn tokens");
}

#[tokio::test]
async fn template_variables_tools_and_roles_reach_the_prompt() {
    let (seen, backend) = fake(Box::new(|_| Ok(say("ok"))));
    let app = app_with_model(backend, server(10_000, 10_000), |m| {
        m.tool_call_parser = Some(turnpike::config::ToolCallFormat::Llama3Json);
    });
    let body = json!({
        "model": "fake-alias",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto"
    });
    let reply = post(&app, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let prompt = support::tokenizer()
        .decode(&seen.requests.lock().unwrap()[0].prompt, false)
        .unwrap();
    assert!(
        prompt.contains("system<|end_header_id|>\n\nBe\nbrief.<|eot_id|>"),
        "{prompt}"
    );
    assert!(prompt.contains(r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object""#), "{prompt}");
    assert!(
        prompt.contains(r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#),
        "{prompt}"
    );
    assert!(
        prompt.contains("ipython<|end_header_id|>\n\ncold<|eot_id|>"),
        "{prompt}"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_engine_request() {
    let script: Script = Box::new(|_| {
        let mut steps = Vec::new();
        for _ in 0..200 {
            steps.extend(ids(" word").into_iter().map(|id| Step::Token {
                choice: 0,
                id,
                logprob: None,
                top: vec![],
            }));
            steps.push(Step::Sleep(Duration::from_millis(10)));
        }
        steps.push(Step::Final(FinalEvent::ok(
            Finish::length(),
            Usage::default(),
        )));
        Ok(steps)
    });
    let (seen, app) = app(script);
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(chat(json!({"stream": true}))))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let mut body = response.into_body().into_data_stream();
    let _ = body.next().await; // the role chunk
    let _ = body.next().await; // some text
    drop(body);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while seen.dropped.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine request was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_quiet_stream_sends_heartbeat_comments() {
    let script: Script = Box::new(|_| {
        let mut steps = vec![Step::Sleep(Duration::from_millis(250))];
        steps.extend(say("late"));
        Ok(steps)
    });
    let (_, backend) = fake(script);
    let app = app_with(backend, server(40, 10_000));
    let reply = post(&app, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    assert!(reply.body.contains(": keep-alive\n\n"), "{}", reply.body);
    let (events, done) = reply.events();
    assert!(done && events.len() >= 3);
}
