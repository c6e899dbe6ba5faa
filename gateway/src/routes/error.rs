//! Errors a route returns, and the one place each becomes an HTTP status and an OpenAI body.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::openai::error::{ErrorBody, ErrorDetail};

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
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
    /// The model named in the request is not served.
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            Self::UnknownUrl { .. } | Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn detail(&self) -> ErrorDetail {
        let (kind, param, code) = match self {
            Self::UnknownUrl { .. } => ("invalid_request_error", None, Some("unknown_url")),
            Self::MethodNotAllowed { .. } => {
                ("invalid_request_error", None, Some("method_not_allowed"))
            }
            Self::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model".to_string()),
                Some("model_not_found"),
            ),
        };
        ErrorDetail {
            message: self.to_string(),
            kind,
            param,
            code,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status(),
            Json(ErrorBody {
                error: self.detail(),
            }),
        )
            .into_response()
    }
}
