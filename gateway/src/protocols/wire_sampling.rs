//! The OpenAI-shaped protocols' stop and extension parameters (chat, legacy completions, the
//! Responses API), in the generation request's terms: the wire's `stop` (a string or a list)
//! as a list, and its extension fields (top level, with `nvext` filling what is unset) as the
//! gateway's own [`SamplingExtensions`].

use crate::generation::{SamplingExtensions, StructuredOutputs};
use crate::openai::common::{Extensions, GuidedOutputs, StopParam};

/// The stop strings of `stop`, as given (checked later, with the model).
pub(crate) fn stops(stop: Option<&StopParam>) -> Vec<String> {
    match stop {
        None => Vec::new(),
        Some(StopParam::One(s)) => vec![s.clone()],
        Some(StopParam::Many(list)) => list.clone(),
    }
}

/// The extension parameters of a request: `top` (its top-level fields) over `nvext`.
pub(crate) fn extensions(top: &Extensions, nvext: Option<&Extensions>) -> SamplingExtensions {
    let Extensions {
        top_k,
        min_p,
        repetition_penalty,
        ignore_eos,
        stop_token_ids,
        min_tokens,
        greedy,
        guided_regex,
        guided_grammar,
        guided_choice,
        guided_json,
        structured_outputs,
        num_assistant_tokens,
        assistant_confidence_threshold,
        best_of,
        length_penalty,
        num_beam_groups,
        diversity_penalty,
    } = top.clone().or(nvext.cloned());
    SamplingExtensions {
        top_k,
        min_p,
        repetition_penalty,
        ignore_eos,
        stop_token_ids,
        min_tokens,
        greedy,
        guided_regex,
        guided_grammar,
        guided_choice,
        guided_json,
        structured_outputs: structured_outputs.map(structured),
        num_assistant_tokens,
        assistant_confidence_threshold,
        best_of,
        length_penalty,
        num_beam_groups,
        diversity_penalty,
    }
}

fn structured(wire: GuidedOutputs) -> StructuredOutputs {
    let GuidedOutputs {
        regex,
        grammar,
        choice,
        json,
    } = wire;
    StructuredOutputs {
        regex,
        grammar,
        choice,
        json,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn top_level_extensions_win_over_nvext_and_every_field_travels() {
        let top: Extensions = serde_json::from_value(json!({
            "top_k": 5, "guided_regex": "a+", "structured_outputs": {"choice": ["x"]},
            "num_assistant_tokens": 3, "diversity_penalty": 0.5
        }))
        .unwrap();
        let nvext: Extensions =
            serde_json::from_value(json!({"top_k": 9, "min_p": 0.1, "ignore_eos": true})).unwrap();
        let e = extensions(&top, Some(&nvext));
        assert_eq!(e.top_k, Some(5.into()));
        assert_eq!((e.min_p, e.ignore_eos), (Some(0.1), Some(true)));
        assert_eq!(e.guided_regex.as_deref(), Some("a+"));
        assert_eq!(
            e.structured_outputs.and_then(|s| s.choice),
            Some(vec!["x".to_string()])
        );
        assert_eq!(e.num_assistant_tokens, Some(3.into()));
        assert_eq!(e.diversity_penalty, Some(0.5));
    }

    #[test]
    fn a_stop_string_or_list_becomes_a_list() {
        assert!(stops(None).is_empty());
        assert_eq!(stops(Some(&StopParam::One("x".into()))), vec!["x"]);
        assert_eq!(
            stops(Some(&StopParam::Many(vec!["a".into(), "b".into()]))),
            vec!["a", "b"]
        );
    }
}
