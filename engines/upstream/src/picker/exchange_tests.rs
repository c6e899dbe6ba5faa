//! One `ext_proc` stream driven message by message, as Envoy sends them.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
    body_mutation,
};

use super::choose::Picker;
use super::exchange::Exchange;
use super::settings::Settings;

fn picker(extra: &str) -> Arc<Picker> {
    let text =
        format!("listen = \"127.0.0.1:0\"\nendpoints = [\"10.0.0.1:1\", \"10.0.0.2:1\"]\n{extra}");
    let settings = Settings::parse(&text).unwrap();
    let urls = settings.members.endpoints.clone();
    Arc::new(Picker::new(settings, &urls))
}

fn headers(end_of_stream: bool, mode: BodySendMode) -> ProcessingRequest {
    ProcessingRequest {
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: mode as i32,
            ..ProtocolConfiguration::default()
        }),
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: ":path".into(),
                    raw_value: b"/v1/chat/completions".to_vec(),
                    ..HeaderValue::default()
                }],
            }),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn destination(answer: &ProcessingResponse) -> Option<String> {
    let common = match answer.response.as_ref()? {
        Response::RequestHeaders(h) => h.response.as_ref()?,
        Response::RequestBody(b) => b.response.as_ref()?,
        _ => return None,
    };
    let h = common
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .find(|o| {
            o.header
                .as_ref()
                .is_some_and(|h| h.key == super::wire::DESTINATION)
        })?;
    Some(String::from_utf8_lossy(&h.header.as_ref()?.raw_value).into_owned())
}

#[test]
fn full_duplex_holds_the_headers_until_the_body_is_whole_then_replays_it() {
    let mut x = Exchange::new(picker(""));
    let json = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    assert!(x.on(headers(false, BodySendMode::FullDuplexStreamed)));
    assert!(x.on(body(&json[..10], false)));
    assert_eq!(x.answers().count(), 0);
    assert!(x.on(body(&json[10..], true)));
    let answers: Vec<ProcessingResponse> = x.answers().collect();
    assert_eq!(answers.len(), 2);
    let chosen = destination(&answers[0]).unwrap();
    assert_eq!(
        chosen.split(',').count(),
        2,
        "the first choice and one fallback"
    );
    let Some(Response::RequestBody(b)) = &answers[1].response else {
        panic!("the body follows the headers")
    };
    let Some(body_mutation::Mutation::StreamedResponse(replayed)) = b
        .response
        .as_ref()
        .and_then(|c| c.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref())
    else {
        panic!("the body is handed back")
    };
    assert!(replayed.end_of_stream && replayed.body == json);
    // The same value rides in the `envoy.lb` metadata.
    assert!(format!("{:?}", answers[0].dynamic_metadata).contains(&chosen));
}

#[test]
fn a_buffered_body_carries_the_destination_and_a_bodiless_request_routes_on_its_headers() {
    let mut x = Exchange::new(picker(""));
    assert!(x.on(headers(false, BodySendMode::Buffered)));
    let first: Vec<ProcessingResponse> = x.answers().collect();
    assert_eq!(first.len(), 1);
    assert_eq!(destination(&first[0]), None, "headers go on unchanged");
    assert!(x.on(body(br#"{"prompt":[1,2,3]}"#, true)));
    let second: Vec<ProcessingResponse> = x.answers().collect();
    assert!(matches!(second[0].response, Some(Response::RequestBody(_))));
    assert!(destination(&second[0]).is_some());

    let mut get = Exchange::new(picker(""));
    assert!(get.on(headers(true, BodySendMode::FullDuplexStreamed)));
    let answers: Vec<ProcessingResponse> = get.answers().collect();
    assert!(destination(&answers[0]).is_some());
}

#[test]
fn an_oversized_body_is_a_413_and_no_ready_server_a_503() {
    let mut x = Exchange::new(picker("max_body_bytes = 8"));
    assert!(x.on(headers(false, BodySendMode::FullDuplexStreamed)));
    assert!(!x.on(body(b"0123456789", false)));
    let answers: Vec<ProcessingResponse> = x.answers().collect();
    let Some(Response::ImmediateResponse(r)) = &answers[0].response else {
        panic!("an immediate answer")
    };
    assert_eq!(r.status.as_ref().map(|s| s.code), Some(413));
    assert!(String::from_utf8_lossy(&r.body).contains("request_too_large"));

    let none = picker("");
    none.pool.set_members(&[]);
    let mut y = Exchange::new(none);
    assert!(!y.on(headers(true, BodySendMode::FullDuplexStreamed)));
    let answers: Vec<ProcessingResponse> = y.answers().collect();
    let Some(Response::ImmediateResponse(r)) = &answers[0].response else {
        panic!("an immediate answer")
    };
    assert_eq!(r.status.as_ref().map(|s| s.code), Some(503));
}
