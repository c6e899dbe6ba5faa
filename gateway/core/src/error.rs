//! Errors answered to clients, and the one place each becomes an HTTP status and an OpenAI
//! error body (`{"error": {"message", "type", "param", "code"}}`).
//!
//! 5xx bodies say little; the log says all. 429 and 503 carry `retry-after` and
//! `retry-after-ms`, which the official SDKs honour.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use turnpike_engine_api::{EngineError, Status};

use turnpike_wire::openai::error::{ErrorBody, ErrorDetail};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// No route matches the path.
    #[error("Unknown request URL: {method} {path}. Please check the URL for typos.")]
    UnknownUrl {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// The path exists but not for this method.
    #[error("Method {method} is not allowed for {path}.")]
    MethodNotAllowed {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// The body is not JSON.
    #[error("We could not parse the JSON body of your request: {0}")]
    InvalidJson(String),
    /// A required parameter is missing.
    #[error("Missing required parameter: '{0}'.")]
    MissingParam(String),
    /// A parameter has a wrong type or value.
    #[error("{message}")]
    InvalidParam {
        /// The parameter, as a path such as `messages[1].content`.
        param: String,
        /// What is wrong.
        message: String,
    },
    /// A parameter or value this server does not support.
    #[error("{message}")]
    Unsupported {
        /// The parameter.
        param: String,
        /// What is not supported.
        message: String,
    },
    /// The prompt and the requested output do not fit the model's context.
    #[error("{message}")]
    ContextLengthExceeded {
        /// `messages` or `prompt`.
        param: String,
        /// The numbers.
        message: String,
    },
    /// A JSON schema (response format or tool parameters) is invalid.
    #[error("{message}")]
    InvalidSchema {
        /// Where the schema is.
        param: String,
        /// What is wrong.
        message: String,
    },
    /// The output of a model that cannot constrain it breaks the requested shape (a model
    /// with `structured_output = "validate"`; 422).
    #[error("{message}")]
    OutputInvalid {
        /// The parameter that asked for the shape (`response_format`, `tool_choice`).
        param: String,
        /// How the output breaks it.
        message: String,
    },
    /// A stored object (a response) that does not exist for this caller.
    #[error("{message}")]
    NotFound {
        /// The parameter that named it (`previous_response_id`), if any.
        param: Option<String>,
        /// `previous_response_not_found` or `response_not_found`.
        code: &'static str,
        /// What is missing.
        message: String,
    },
    /// The model is not served.
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// The body is larger than the configured limit.
    #[error("The request body is larger than the limit of {limit} bytes.")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive in time (`server.body_read_timeout_ms`; 408).
    #[error("The request body was not received within {0:?}; send it whole and promptly.")]
    BodyTimeout(Duration),
    /// A body that is not JSON on an endpoint that takes JSON (415).
    #[error("This endpoint takes a JSON body: send 'Content-Type: application/json' (got {0}).")]
    UnsupportedMediaType(String),
    /// The engine refused a valid request it cannot serve (its message is for the client).
    #[error("{0}")]
    EngineRejected(String),
    /// The engine is at capacity.
    #[error("The model is at capacity; retry after a short wait. ({message})")]
    Overloaded {
        /// The engine's reason.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// The engine cannot serve now.
    #[error("The model is unavailable right now; retry after a short wait.")]
    Unavailable {
        /// The engine's reason (logged).
        detail: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// The server is stopping and cut this request short.
    #[error("The server is shutting down; retry the request.")]
    ShuttingDown {
        /// When to retry (another replica will usually answer at once).
        retry_after: Duration,
    },
    /// The request took longer than the configured timeout.
    #[error("The request timed out after {0:?}.")]
    Timeout(Duration),
    /// Anything else; the detail is logged, not sent.
    /// No valid credential (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// The credential may not do this (403).
    #[error("{message}")]
    Forbidden {
        /// The parameter at fault (`model`), if any.
        param: Option<String>,
        /// `model_not_allowed` or `endpoint_not_allowed`.
        code: &'static str,
        /// What is not allowed.
        message: String,
    },
    /// A tenant limit refused the request (429).
    #[error("{}", .0.message())]
    RateLimited(Box<RateLimited>),
    /// A spend budget refused the request (429, not retried before the budget resets).
    #[error("{}", .0.message())]
    BudgetExceeded(Box<BudgetExceeded>),
    /// The state store is unreachable and the feature fails closed (503).
    #[error(
        "The gateway's shared state (limits, idempotency records) is unavailable right now; retry after a short wait."
    )]
    StateUnavailable {
        /// What failed (logged, not sent).
        detail: String,
        /// What `retry-after` says.
        retry_after: Duration,
    },
    /// A malformed header (400).
    #[error("{message}")]
    InvalidHeader {
        /// The header.
        header: &'static str,
        /// What is wrong.
        message: String,
    },
    /// An idempotency key conflict (409).
    #[error("{message}")]
    Idempotency {
        /// `idempotency_key_reused`, `idempotency_request_in_progress` or
        /// `idempotency_response_unavailable`.
        code: &'static str,
        /// What happened.
        message: String,
    },
    /// The request clashes with the current state (409).
    #[error("{message}")]
    Conflict {
        /// What clashes (`managed_elsewhere`, `state_changed`).
        code: &'static str,
        /// What happened.
        message: String,
    },
    /// A gateway plugin's guard refused the request (its 4xx status, code and message).
    #[error("{message}")]
    PluginRejected {
        /// 400 to 499.
        status: u16,
        /// The plugin's code.
        code: String,
        /// What the client is told.
        message: String,
    },
    /// A gateway plugin failed and its failure mode is closed (503; the detail is logged).
    #[error("A request filter of this gateway is unavailable; retry after a short wait.")]
    PluginFailed {
        /// Which plugin and what happened.
        detail: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// An `If-Match` precondition did not hold (412).
    #[error("{0}")]
    PreconditionFailed(String),
    /// A failure inside the gateway (500; the body says little, the log says all).
    #[error("The server had an error while processing your request.")]
    Internal {
        /// What happened (logged).
        detail: String,
    },
}

impl ApiError {
    /// A bad value of `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidParam {
            param: param.into(),
            message: message.into(),
        }
    }

    /// `param`'s `value` outside `min..=max`.
    pub fn out_of_range(param: &str, value: i64, min: i64, max: i64) -> Self {
        Self::invalid(
            param,
            format!("'{param}' must be between {min} and {max}, got {value}"),
        )
    }

    /// An unsupported `param`.
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Unsupported {
            param: param.into(),
            message: message.into(),
        }
    }

    /// An engine failure, mapped by its status.
    pub fn from_engine(e: EngineError, retry_after: Duration) -> Self {
        match e.status {
            Status::InvalidRequest | Status::Unsupported | Status::NotFound => {
                Self::EngineRejected(e.message)
            }
            Status::Overloaded => Self::Overloaded {
                message: e.message,
                retry_after,
            },
            Status::Unavailable => Self::Unavailable {
                detail: e.message,
                retry_after,
            },
            Status::Ok
            | Status::Cancelled
            | Status::Internal
            | Status::InvalidConfig
            | Status::Unknown(_) => Self::Internal {
                detail: format!("engine {}: {}", e.status, e.message),
            },
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnknownUrl { .. } | Self::ModelNotFound(_) | Self::NotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::InvalidJson(_)
            | Self::MissingParam(_)
            | Self::InvalidParam { .. }
            | Self::Unsupported { .. }
            | Self::ContextLengthExceeded { .. }
            | Self::EngineRejected(_)
            // A schema the request gives is part of the request: 400, as OpenAI and vLLM answer.
            | Self::InvalidSchema { .. } => StatusCode::BAD_REQUEST,
            Self::OutputInvalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } | Self::ShuttingDown { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::RateLimited(_) | Self::BudgetExceeded(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::StateUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::InvalidHeader { .. } => StatusCode::BAD_REQUEST,
            Self::Idempotency { .. } | Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::PluginRejected { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST)
            }
            Self::PluginFailed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The OpenAI error body.
    pub fn detail(&self) -> ErrorDetail {
        let (kind, param, code): (&'static str, Option<String>, Option<&'static str>) = match self {
            Self::UnknownUrl { .. } => ("invalid_request_error", None, Some("unknown_url")),
            Self::MethodNotAllowed { .. } => {
                ("invalid_request_error", None, Some("method_not_allowed"))
            }
            Self::InvalidJson(_) => ("invalid_request_error", None, Some("invalid_json")),
            Self::MissingParam(p) => (
                "invalid_request_error",
                Some(p.clone()),
                Some("missing_required_parameter"),
            ),
            Self::InvalidParam { param, .. } => (
                "invalid_request_error",
                Some(param.clone()),
                Some("invalid_value"),
            ),
            Self::Unsupported { param, .. } => (
                "invalid_request_error",
                Some(param.clone()),
                Some("unsupported_parameter"),
            ),
            Self::ContextLengthExceeded { param, .. } => (
                "invalid_request_error",
                Some(param.clone()),
                Some("context_length_exceeded"),
            ),
            Self::InvalidSchema { param, .. } => (
                "invalid_request_error",
                Some(param.clone()),
                Some("invalid_schema"),
            ),
            Self::OutputInvalid { param, .. } => (
                "invalid_request_error",
                Some(param.clone()),
                Some("output_validation_failed"),
            ),
            Self::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model".into()),
                Some("model_not_found"),
            ),
            Self::NotFound { param, code, .. } => {
                ("invalid_request_error", param.clone(), Some(*code))
            }
            Self::PayloadTooLarge { .. } => {
                ("invalid_request_error", None, Some("request_too_large"))
            }
            Self::BodyTimeout(_) => ("invalid_request_error", None, Some("request_timeout")),
            Self::UnsupportedMediaType(_) => (
                "invalid_request_error",
                None,
                Some("unsupported_media_type"),
            ),
            Self::EngineRejected(_) => ("invalid_request_error", None, Some("invalid_request")),
            Self::Overloaded { .. } => ("rate_limit_error", None, Some("queue_full")),
            Self::Unavailable { .. } => ("server_error", None, Some("engine_unavailable")),
            Self::ShuttingDown { .. } => ("server_error", None, Some("server_shutting_down")),
            Self::Timeout(_) => ("server_error", None, Some("timeout")),
            Self::Internal { .. } => ("server_error", None, None),
            Self::Unauthenticated(_) => ("invalid_request_error", None, Some("invalid_api_key")),
            Self::Forbidden { param, code, .. } => ("permission_error", param.clone(), Some(*code)),
            Self::RateLimited(r) => (r.kind.error_type(), None, Some(r.kind.code())),
            Self::BudgetExceeded(_) => ("insufficient_quota", None, Some("budget_exceeded")),
            Self::StateUnavailable { .. } => ("server_error", None, Some("state_unavailable")),
            Self::InvalidHeader { header, .. } => (
                "invalid_request_error",
                Some((*header).to_string()),
                Some("invalid_header"),
            ),
            Self::Idempotency { code, .. } | Self::Conflict { code, .. } => {
                ("invalid_request_error", None, Some(*code))
            }
            Self::PreconditionFailed(_) => (
                "invalid_request_error",
                Some("If-Match".into()),
                Some("precondition_failed"),
            ),
            Self::PluginRejected { .. } => ("invalid_request_error", None, None),
            Self::PluginFailed { .. } => ("server_error", None, Some("plugin_unavailable")),
        };
        let code = match self {
            Self::PluginRejected { code, .. } => Some(std::borrow::Cow::Owned(code.clone())),
            _ => code.map(std::borrow::Cow::Borrowed),
        };
        ErrorDetail {
            message: self.to_string(),
            kind,
            param,
            code,
        }
    }

    /// When the client should retry, for 429 and 503.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Overloaded { retry_after, .. }
            | Self::Unavailable { retry_after, .. }
            | Self::ShuttingDown { retry_after }
            | Self::StateUnavailable { retry_after, .. }
            | Self::PluginFailed { retry_after, .. } => Some(*retry_after),
            Self::RateLimited(r) if !r.never => Some(r.retry_after),
            Self::BudgetExceeded(b) => b.retry_after,
            _ => None,
        }
    }

    /// The `x-should-retry` the OpenAI SDKs obey, where their own rule (retry 408, 409, 429 and
    /// every 5xx) would be wrong: a request that failed inside the engine or ran out of time
    /// would most likely fail the same way again, so it is not retried behind the caller's back.
    pub fn should_retry(&self) -> Option<bool> {
        match self {
            Self::Overloaded { .. }
            | Self::Unavailable { .. }
            | Self::ShuttingDown { .. }
            | Self::StateUnavailable { .. }
            | Self::PluginFailed { .. } => Some(true),
            // Only a plan change helps a request larger than a limit.
            Self::RateLimited(r) => Some(!r.never),
            // Hours may pass before a budget resets: a client's quick retries cannot help.
            Self::BudgetExceeded(_) => Some(false),
            Self::Timeout(_) | Self::Internal { .. } => Some(false),
            _ => None,
        }
    }

    /// Its code as a metric label: a plugin's own codes are one label, so the label set stays
    /// bounded.
    pub fn metric_code(&self) -> &'static str {
        match self {
            Self::PluginRejected { .. } => "plugin_rejected",
            _ => match self.detail().code {
                Some(std::borrow::Cow::Borrowed(code)) => code,
                _ => "server_error",
            },
        }
    }

    /// Logs what the client is not told.
    pub fn log(&self) {
        match self {
            Self::Internal { detail } => tracing::error!(%detail, "internal error"),
            Self::Unavailable { detail, .. } => tracing::warn!(%detail, "engine unavailable"),
            Self::StateUnavailable { detail, .. } => {
                tracing::warn!(%detail, "state store unavailable");
            }
            Self::PluginFailed { detail, .. } => tracing::warn!(%detail, "gateway plugin failed"),
            _ => {}
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// A request-rate window.
    Requests,
    /// A token window.
    Tokens,
    /// Concurrent generations.
    Concurrency,
}

impl LimitKind {
    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
        }
    }

    /// OpenAI's error `type` for it.
    fn error_type(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "rate_limit_error",
        }
    }

    fn code(self) -> &'static str {
        match self {
            Self::Requests | Self::Tokens => "rate_limit_exceeded",
            Self::Concurrency => "concurrency_limit_exceeded",
        }
    }
}

/// A refusal by a tenant limit.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimited {
    /// Which limit.
    pub kind: LimitKind,
    /// Its capacity.
    pub limit: u64,
    /// Its window (zero for concurrency).
    pub period: Duration,
    /// What the request needed.
    pub requested: u64,
    /// When it would fit.
    pub retry_after: Duration,
    /// It never fits (larger than the limit): only a plan change helps.
    pub never: bool,
}

impl RateLimited {
    fn message(&self) -> String {
        let per = match self.period.as_secs() {
            1 => "per second",
            60 => "per minute",
            86_400 => "per day",
            _ => "per window",
        };
        let wait = crate::clock::format_reset(self.retry_after);
        match (self.kind, self.never) {
            (LimitKind::Concurrency, _) => format!(
                "Too many concurrent requests: the limit is {}. Retry when one of them finishes.",
                self.limit
            ),
            (kind, true) => format!(
                "Request too large for {} {per}: limit {}, requested {}. Reduce the request (prompt or max_tokens) or ask for a larger plan.",
                kind.as_str(),
                self.limit,
                self.requested
            ),
            (kind, false) => format!(
                "Rate limit reached for {} {per}: limit {}, requested {}. Please try again in {wait}.",
                kind.as_str(),
                self.limit,
                self.requested
            ),
        }
    }
}

/// A refusal by a spend budget: the request's most possible cost would pass it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetExceeded {
    /// Whose budget and which: "tenant `acme`'s daily budget".
    pub budget: String,
    /// Its limit with the currency ("5.00 USD").
    pub limit: String,
    /// What was spent or held against it ("4.90 USD").
    pub spent: String,
    /// The request's most possible cost ("0.20 USD").
    pub requested: String,
    /// When the budget starts again (RFC 3339), if it ever does.
    pub resets_at: Option<String>,
    /// Time until then.
    pub retry_after: Option<Duration>,
}

impl BudgetExceeded {
    fn message(&self) -> String {
        let when = match &self.resets_at {
            Some(at) => format!("It resets at {at}."),
            None => "It does not reset; ask for a larger budget.".to_string(),
        };
        format!(
            "Budget exceeded: {} is {}, {} is spent or held, and this request may cost up to {}. Lower max_tokens or the prompt, or wait. {when}",
            self.budget, self.limit, self.spent, self.requested
        )
    }
}

/// Counts an error answered to a client, also mid-stream (`turnpike_errors_total` by `code`).
pub fn count(code: &str) {
    metrics::counter!("turnpike_errors_total", "code" => code.to_string()).increment(1);
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log();
        let detail = self.detail();
        count(self.metric_code());
        let mut response = (self.status(), Json(ErrorBody { error: detail })).into_response();
        if let Some(retry) = self.should_retry() {
            let value = HeaderValue::from_static(if retry { "true" } else { "false" });
            response.headers_mut().insert("x-should-retry", value);
        }
        if let Some(wait) = self.retry_after() {
            let headers = response.headers_mut();
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                headers.insert("retry-after", v);
            }
            if let Ok(v) = HeaderValue::from_str(&wait.as_millis().to_string()) {
                headers.insert("retry-after-ms", v);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_the_four_keys_and_5xx_say_little() {
        let internal = ApiError::Internal {
            detail: "secret path /opt/x".into(),
        };
        let body = serde_json::to_value(ErrorBody {
            error: internal.detail(),
        })
        .expect("json");
        for key in ["message", "type", "param", "code"] {
            assert!(body["error"].get(key).is_some(), "{key}");
        }
        assert!(!body.to_string().contains("secret"));
        assert_eq!(internal.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn engine_statuses_map_to_http() {
        let wait = Duration::from_millis(1500);
        let cases = [
            (Status::Overloaded, StatusCode::TOO_MANY_REQUESTS),
            (Status::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (Status::InvalidRequest, StatusCode::BAD_REQUEST),
            (Status::Internal, StatusCode::INTERNAL_SERVER_ERROR),
            (Status::Unknown(77), StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (status, http) in cases {
            assert_eq!(
                ApiError::from_engine(EngineError::new(status, "x"), wait).status(),
                http
            );
        }
        let response = ApiError::Overloaded {
            message: "full".into(),
            retry_after: wait,
        }
        .into_response();
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["retry-after-ms"], "1500");
        assert_eq!(response.headers()["x-should-retry"], "true");
        let response = ApiError::Internal { detail: "x".into() }.into_response();
        assert_eq!(response.headers()["x-should-retry"], "false");
        let response = ApiError::MissingParam("model".into()).into_response();
        assert!(response.headers().get("x-should-retry").is_none());
    }
}
