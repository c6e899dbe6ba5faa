//! Structured output from engines that cannot constrain it: the model's
//! `structured_output = "validate"` lets such a request run unconstrained and checks each
//! finished choice here instead — its text against the JSON Schema (or as a JSON object), or,
//! for a forced tool call, that it called an offered tool with valid arguments.
//!
//! The check watches the generation's event stream ([`OutputCheck::observe`]) and, at the
//! first choice that breaks the rule, ends the stream with a 422: a non-streamed response is
//! that 422; a streamed one has sent the text already and ends with the error event. A choice
//! cut by `max_tokens` (`finish_reason: length`) is returned as it is, as OpenAI returns a
//! truncated structured answer.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::run::{Finished, GenEvent};
use crate::error::ApiError;

/// What each choice must hold.
#[derive(Clone)]
pub(crate) enum Expected {
    /// Any JSON object.
    JsonObject,
    /// A value valid under a schema.
    Schema(Arc<jsonschema::Validator>),
    /// At least one call of these functions, each with arguments valid under its schema.
    ToolCall(Arc<HashMap<String, jsonschema::Validator>>),
}

impl std::fmt::Debug for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::JsonObject => "JsonObject",
            Self::Schema(_) => "Schema",
            Self::ToolCall(_) => "ToolCall",
        })
    }
}

/// A compiled validator for `schema` (named `param` in errors).
pub(crate) fn validator(schema: &Value, param: &str) -> Result<jsonschema::Validator, ApiError> {
    jsonschema::validator_for(schema).map_err(|e| ApiError::InvalidSchema {
        param: param.into(),
        message: format!("the schema is not valid JSON Schema: {e}"),
    })
}

/// The check of one generation's choices.
#[derive(Debug)]
pub(crate) struct OutputCheck {
    expected: Expected,
    /// The request parameter that asked for the shape (`response_format`, `tool_choice`).
    param: &'static str,
    texts: HashMap<u32, String>,
    calls: HashMap<u32, u32>,
}

impl OutputCheck {
    pub(crate) fn new(expected: Expected, param: &'static str) -> Self {
        Self {
            expected,
            param,
            texts: HashMap::new(),
            calls: HashMap::new(),
        }
    }

    /// Takes in the next event; the error that ends the generation when a choice breaks the
    /// rule.
    pub(crate) fn observe(&mut self, event: &GenEvent) -> Option<ApiError> {
        match event {
            GenEvent::Text { choice, text, .. } => {
                if !matches!(self.expected, Expected::ToolCall(_)) {
                    self.texts.entry(*choice).or_default().push_str(text);
                }
                None
            }
            GenEvent::ToolCall {
                choice,
                name,
                arguments,
                ..
            } => {
                let Expected::ToolCall(schemas) = &self.expected else {
                    return None;
                };
                *self.calls.entry(*choice).or_default() += 1;
                let Some(validator) = schemas.get(name) else {
                    return Some(self.invalid(
                        *choice,
                        format!("it called `{name}`, which was not offered"),
                    ));
                };
                match serde_json::from_str::<Value>(arguments) {
                    Err(e) => Some(self.invalid(
                        *choice,
                        format!("the arguments of `{name}` are not JSON: {e}"),
                    )),
                    Ok(args) => validator.validate(&args).err().map(|e| {
                        self.invalid(
                            *choice,
                            format!(
                                "the arguments of `{name}` break its schema at '{}': {e}",
                                e.instance_path
                            ),
                        )
                    }),
                }
            }
            GenEvent::Finish { choice, reason } => self.finished(*choice, *reason),
            _ => None,
        }
    }

    fn finished(&mut self, choice: u32, reason: Finished) -> Option<ApiError> {
        if reason == Finished::Length {
            return None;
        }
        let text = self.texts.remove(&choice).unwrap_or_default();
        match &self.expected {
            Expected::ToolCall(_) => (self.calls.get(&choice).copied().unwrap_or(0) == 0)
                .then(|| self.invalid(choice, "it called no tool".into())),
            Expected::JsonObject => match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(_)) => None,
                Ok(_) => Some(self.invalid(choice, "the answer is JSON but not an object".into())),
                Err(e) => Some(self.invalid(choice, format!("the answer is not JSON: {e}"))),
            },
            Expected::Schema(validator) => match serde_json::from_str::<Value>(&text) {
                Err(e) => Some(self.invalid(choice, format!("the answer is not JSON: {e}"))),
                Ok(value) => validator.validate(&value).err().map(|e| {
                    self.invalid(
                        choice,
                        format!("the answer breaks the schema at '{}': {e}", e.instance_path),
                    )
                }),
            },
        }
    }

    fn invalid(&self, choice: u32, why: String) -> ApiError {
        ApiError::OutputInvalid {
            param: self.param.into(),
            message: format!(
                "The model's output (choice {choice}) does not match '{}': {why}",
                self.param
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn text(choice: u32, text: &str) -> GenEvent {
        GenEvent::Text {
            choice,
            text: text.into(),
            logprobs: Vec::new(),
        }
    }

    fn finish(choice: u32, reason: Finished) -> GenEvent {
        GenEvent::Finish { choice, reason }
    }

    #[test]
    fn a_schema_is_checked_per_choice_when_it_stops() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let v = Arc::new(validator(&schema, "response_format").unwrap());
        let mut check = OutputCheck::new(Expected::Schema(v), "response_format");
        assert!(check.observe(&text(0, "{\"n\":")).is_none());
        assert!(check.observe(&text(1, "{\"n\": \"x\"}")).is_none());
        assert!(check.observe(&text(0, " 3}")).is_none());
        assert!(check.observe(&finish(0, Finished::Stop)).is_none());
        let e = check.observe(&finish(1, Finished::Stop)).unwrap();
        assert_eq!(e.status(), axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.to_string().contains("'/n'"), "{e}");
        // A truncated answer is returned as it is.
        let mut check = OutputCheck::new(Expected::JsonObject, "response_format");
        assert!(check.observe(&text(0, "{\"a")).is_none());
        assert!(check.observe(&finish(0, Finished::Length)).is_none());
        assert!(check.observe(&text(1, "[1]")).is_none());
        assert!(check.observe(&finish(1, Finished::Stop)).is_some());
    }

    #[test]
    fn a_forced_call_must_call_an_offered_tool_with_valid_arguments() {
        let schemas = HashMap::from([(
            "f".to_string(),
            validator(&json!({"type": "object", "required": ["a"]}), "tools").unwrap(),
        )]);
        let expected = Expected::ToolCall(Arc::new(schemas));
        let call = |name: &str, arguments: &str| GenEvent::ToolCall {
            choice: 0,
            index: 0,
            id: "call_1".into(),
            name: name.into(),
            arguments: arguments.into(),
        };
        let mut check = OutputCheck::new(expected.clone(), "tool_choice");
        assert!(check.observe(&call("f", "{\"a\": 1}")).is_none());
        assert!(check.observe(&finish(0, Finished::ToolCalls)).is_none());
        let mut check = OutputCheck::new(expected.clone(), "tool_choice");
        assert!(check.observe(&call("f", "{}")).is_some());
        let mut check = OutputCheck::new(expected.clone(), "tool_choice");
        assert!(check.observe(&call("g", "{}")).is_some());
        let mut check = OutputCheck::new(expected, "tool_choice");
        assert!(check.observe(&text(0, "no call")).is_none());
        assert!(check.observe(&finish(0, Finished::Stop)).is_some());
    }
}
