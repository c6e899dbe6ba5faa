//! The JSON body extractor: the configured size limit (413), and parse errors that name the
//! parameter (`messages[0].role`), never axum's plain-text rejections.

use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_LENGTH;
use serde::de::DeserializeOwned;

use super::AppState;
use crate::error::ApiError;

/// A request body parsed as `T`.
#[derive(Debug)]
pub(super) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.server.max_body_bytes;
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|len| len > limit) {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        let bytes = crate::body::read(req.into_body(), limit).await?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parses JSON, naming the parameter at fault.
pub(super) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        classify(&path, &inner)
    })?;
    de.end().map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    Ok(value)
}

fn classify(path: &str, e: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::InvalidJson(e.to_string()),
        Category::Data => {
            let message = e.to_string();
            // serde reports a missing field at the level that lacks it.
            if let Some(field) = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
            {
                let param = if path == "." {
                    field.to_string()
                } else {
                    format!("{path}.{field}")
                };
                return ApiError::MissingParam(param);
            }
            if path == "." {
                return ApiError::InvalidJson(format!("the body must be a JSON object: {message}"));
            }
            let detail = message.split(" at line ").next().unwrap_or(&message);
            ApiError::invalid(path, format!("Invalid value for '{path}': {detail}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::chat::ChatCompletionRequest;

    fn err(body: &str) -> ApiError {
        parse::<ChatCompletionRequest>(body.as_bytes()).expect_err(body)
    }

    #[test]
    fn names_the_parameter() {
        assert!(matches!(err("{nope"), ApiError::InvalidJson(_)));
        assert!(matches!(err("[]"), ApiError::InvalidJson(_)));
        assert_eq!(
            err(r#"{"messages": []}"#),
            ApiError::MissingParam("model".into())
        );
        match err(r#"{"model": "m", "messages": [], "temperature": "hot"}"#) {
            ApiError::InvalidParam { param, .. } => assert_eq!(param, "temperature"),
            other => panic!("{other:?}"),
        }
        match err(r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#) {
            ApiError::InvalidParam { param, message } => {
                assert_eq!(param, "messages[0].role");
                assert!(message.contains("wizard"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            err(r#"{"model": "m", "messages": []} x"#),
            ApiError::InvalidJson(_)
        ));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let ok = parse::<ChatCompletionRequest>(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "frobnicate": true, "nvext": {"top_k": 5}}"#,
        );
        assert!(ok.is_ok());
    }
}
