//! The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`.

use serde::Serialize;

/// The whole error body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The error itself; every key is always present (`null` when empty), as clients expect.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    /// For humans.
    pub message: String,
    /// The error class, such as `invalid_request_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request parameter at fault.
    pub param: Option<String>,
    /// A machine-readable code, such as `model_not_found` (a plugin's rejection names its own).
    pub code: Option<std::borrow::Cow<'static, str>>,
}
