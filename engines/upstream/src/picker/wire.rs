//! The `ext_proc` messages the picker reads and writes, as plain functions over Envoy's
//! published types: the headers and metadata of the endpoint picker protocol, the replayed
//! body, and immediate answers in the OpenAI error shape.

use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, HeaderValueOption, Metadata, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

/// The header and metadata key that names the chosen endpoints.
pub(crate) const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of the destination and of the served endpoint.
pub(crate) const LB_NAMESPACE: &str = "envoy.lb";
/// The served-endpoint feedback key.
pub(crate) const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The subset hint's namespace and key.
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub(crate) const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The response header that names the server that took a request.
pub(crate) const ENDPOINT_HEADER: &str = "x-turnpike-endpoint";
/// The fairness id header (who a request is for).
pub(crate) const FAIRNESS: &str = "x-gateway-inference-fairness-id";

/// A header's value in `headers` (Envoy sends `raw_value`, older ones `value`).
pub(crate) fn header(headers: Option<&HeaderMap>, name: &str) -> Option<String> {
    let h = headers?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))?;
    Some(if h.raw_value.is_empty() {
        h.value.clone()
    } else {
        String::from_utf8_lossy(&h.raw_value).into_owned()
    })
}

fn string_at<'a>(metadata: Option<&'a Metadata>, namespace: &str, key: &str) -> Option<&'a Kind> {
    metadata?
        .filter_metadata
        .get(namespace)?
        .fields
        .get(key)?
        .kind
        .as_ref()
}

/// The subset hint: `Some(endpoints)` when the proxy limits the choice.
pub(crate) fn subset(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    match string_at(metadata, SUBSET_NAMESPACE, SUBSET)? {
        Kind::ListValue(list) => Some(
            list.values
                .iter()
                .filter_map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
        ),
        Kind::StringValue(s) => Some(s.split(',').map(|e| e.trim().to_string()).collect()),
        _ => Some(Vec::new()),
    }
}

/// The endpoint that served the response, from the served-endpoint metadata (or the
/// `upstream.address` attribute where the proxy sends attributes instead).
pub(crate) fn served(
    metadata: Option<&Metadata>,
    attributes: &std::collections::HashMap<String, Struct>,
) -> Option<String> {
    if let Some(Kind::StringValue(s)) = string_at(metadata, LB_NAMESPACE, SERVED) {
        return Some(s.clone());
    }
    attributes
        .values()
        .find_map(|a| match a.fields.get("upstream.address")?.kind.as_ref()? {
            Kind::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

fn set(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// The destination as header mutation and `envoy.lb` dynamic metadata (the same value in
/// both, as the protocol asks); `body_len` restates the body's length.
fn destination(endpoints: &str, body_len: Option<usize>) -> (HeaderMutation, Struct) {
    let mut set_headers = vec![set(DESTINATION, endpoints)];
    if let Some(len) = body_len {
        set_headers.push(set("content-length", &len.to_string()));
    }
    let inner = Struct {
        fields: [(DESTINATION.to_string(), string(endpoints))].into(),
    };
    let outer = Struct {
        fields: [(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    };
    (
        HeaderMutation {
            set_headers,
            ..HeaderMutation::default()
        },
        outer,
    )
}

/// The request headers' answer naming `endpoints` (full duplex, and bodiless requests).
pub(crate) fn route_headers(endpoints: &str, body_len: Option<usize>) -> ProcessingResponse {
    let (mutation, metadata) = destination(endpoints, body_len);
    ProcessingResponse {
        dynamic_metadata: Some(metadata),
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(mutation),
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        })),
        ..ProcessingResponse::default()
    }
}

/// The buffered body's answer naming `endpoints` (when the proxy sends the body whole).
pub(crate) fn route_body(endpoints: &str) -> ProcessingResponse {
    let (mutation, metadata) = destination(endpoints, None);
    ProcessingResponse {
        dynamic_metadata: Some(metadata),
        response: Some(Response::RequestBody(BodyResponse {
            response: Some(CommonResponse {
                header_mutation: Some(mutation),
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        })),
        ..ProcessingResponse::default()
    }
}

/// A body chunk handed back unchanged (full duplex), request or response side.
pub(crate) fn streamed(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let body = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    };
    answer(if request {
        Response::RequestBody(body)
    } else {
        Response::ResponseBody(body)
    })
}

/// A "go on unchanged" answer.
pub(crate) fn answer(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// Unchanged answers to each phase.
pub(crate) fn request_headers_unchanged() -> ProcessingResponse {
    answer(Response::RequestHeaders(HeadersResponse::default()))
}
/// The response headers' answer: unchanged but for `x-turnpike-endpoint`, the server that
/// took the request as the picker last knew it.
pub(crate) fn response_headers(endpoint: Option<&str>) -> ProcessingResponse {
    answer(Response::ResponseHeaders(HeadersResponse {
        response: endpoint.map(|e| CommonResponse {
            header_mutation: Some(HeaderMutation {
                set_headers: vec![set(ENDPOINT_HEADER, e)],
                ..HeaderMutation::default()
            }),
            ..CommonResponse::default()
        }),
    }))
}
pub(crate) fn body_unchanged(request: bool) -> ProcessingResponse {
    answer(if request {
        Response::RequestBody(BodyResponse::default())
    } else {
        Response::ResponseBody(BodyResponse::default())
    })
}
pub(crate) fn trailers_unchanged(request: bool) -> ProcessingResponse {
    answer(if request {
        Response::RequestTrailers(TrailersResponse::default())
    } else {
        Response::ResponseTrailers(TrailersResponse::default())
    })
}

/// An immediate answer in the OpenAI error shape.
pub(crate) fn refuse(status: u16, kind: &str, message: &str) -> ProcessingResponse {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": kind}
    });
    answer(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(status),
        }),
        headers: Some(HeaderMutation {
            set_headers: vec![set("content-type", "application/json")],
            ..HeaderMutation::default()
        }),
        body: body.to_string().into_bytes(),
        details: format!("turnpike_picker_{kind}"),
        ..ImmediateResponse::default()
    }))
}
