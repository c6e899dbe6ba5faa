//! Output shapes asked for through the engine-extension parameters, under the names vLLM
//! gives them, so clients written for it work unchanged: `guided_regex`, `guided_grammar`
//! (Lark), `guided_choice` and `guided_json` at the top level (or under `nvext`), or the same
//! four as `structured_outputs.{regex, grammar, choice, json}`. At most one may be given.

use serde_json::Value;
use turnpike_engine_api::Grammar;

use super::extensions::SamplingExtensions;
use crate::error::ApiError;

/// A shape asked for by extension.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Guided {
    /// A JSON Schema (checked as `response_format`'s would be).
    Json(Value),
    /// A grammar the engine must enforce.
    Grammar(Grammar),
}

/// The shape `e` asks for, and the parameter that asked; an error when several are given.
pub(crate) fn requested(
    e: &SamplingExtensions,
) -> Result<Option<(Guided, &'static str)>, ApiError> {
    let s = e.structured_outputs.clone().unwrap_or_default();
    let mut found = Vec::new();
    let regex = |pattern: String| Guided::Grammar(Grammar::Regex { pattern });
    let lark = |grammar: String| Guided::Grammar(Grammar::Lark { grammar });
    let mut offer = |value: Option<Guided>, name: &'static str| {
        if let Some(v) = value {
            found.push((v, name));
        }
    };
    offer(e.guided_regex.clone().map(regex), "guided_regex");
    offer(s.regex.map(regex), "structured_outputs.regex");
    offer(e.guided_grammar.clone().map(lark), "guided_grammar");
    offer(s.grammar.map(lark), "structured_outputs.grammar");
    offer(e.guided_json.clone().map(Guided::Json), "guided_json");
    offer(s.json.map(Guided::Json), "structured_outputs.json");
    if let Some(list) = &e.guided_choice {
        found.push((choice(list, "guided_choice")?, "guided_choice"));
    }
    if let Some(list) = &s.choice {
        found.push((
            choice(list, "structured_outputs.choice")?,
            "structured_outputs.choice",
        ));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid(
            found[1].1,
            format!(
                "'{}' and '{}' cannot both shape the output",
                found[0].1, found[1].1
            ),
        )),
    }
}

/// Exact alternatives as a Lark grammar (each a JSON-escaped string literal).
fn choice(list: &[String], param: &'static str) -> Result<Guided, ApiError> {
    if list.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("'{param}' must not be empty"),
        ));
    }
    let alternatives: Vec<String> = list
        .iter()
        .map(|c| Value::from(c.as_str()).to_string())
        .collect();
    Ok(Guided::Grammar(Grammar::Lark {
        grammar: format!("start: {}\n", alternatives.join(" | ")),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::super::extensions::StructuredOutputs;
    use super::*;

    fn parse(e: SamplingExtensions) -> Result<Option<(Guided, &'static str)>, ApiError> {
        requested(&e)
    }

    #[test]
    fn each_name_maps_to_its_shape_and_two_are_refused() {
        assert_eq!(parse(SamplingExtensions::default()).unwrap(), None);
        let (g, name) = parse(SamplingExtensions {
            guided_regex: Some("[0-9]+".into()),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            (g, name),
            (
                Guided::Grammar(Grammar::Regex {
                    pattern: "[0-9]+".into()
                }),
                "guided_regex"
            )
        );
        let (g, _) = parse(SamplingExtensions {
            structured_outputs: Some(StructuredOutputs {
                choice: Some(vec!["yes".into(), "no \"really\"".into()]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            g,
            Guided::Grammar(Grammar::Lark {
                grammar: "start: \"yes\" | \"no \\\"really\\\"\"\n".into()
            })
        );
        let (g, _) = parse(SamplingExtensions {
            guided_json: Some(json!({"type": "object"})),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(g, Guided::Json(json!({"type": "object"})));
        let both = parse(SamplingExtensions {
            guided_regex: Some("a".into()),
            guided_grammar: Some("start: \"a\"".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(both.to_string().contains("cannot both"), "{both}");
        assert!(
            parse(SamplingExtensions {
                guided_choice: Some(Vec::new()),
                ..Default::default()
            })
            .is_err()
        );
    }
}
