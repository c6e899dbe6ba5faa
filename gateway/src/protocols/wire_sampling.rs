//! The OpenAI-shaped protocols' stop and extension parameters (chat, legacy completions, the
//! Responses API), in the generation request's terms: the wire's `stop` (a string or a list)
//! as a list, and its extension fields (top level, with `nvext` filling what is unset) as the
//! gateway's own [`SamplingExtensions`], their integers checked and typed here, once.

use serde_json::{Number, Value};
use turnpike_engine_api::json::MAX_ASSISTANT_TOKENS;

use super::numbers::{count, integer};
use crate::error::ApiError;
use crate::generation::{MAX_N, MAX_STOP_TOKEN_IDS, SamplingExtensions, StructuredOutputs};
use crate::openai::common::{Extensions, GuidedOutputs, StopParam};

/// Largest `top_k` (-1 or 0 turn it off).
const MAX_TOP_K: i64 = 1 << 20;

/// The stop strings of `stop`, as given (checked later, with the model).
pub(crate) fn stops(stop: Option<&StopParam>) -> Vec<String> {
    match stop {
        None => Vec::new(),
        Some(StopParam::One(s)) => vec![s.clone()],
        Some(StopParam::Many(list)) => list.clone(),
    }
}

/// The extension parameters of a request: `top` (its top-level fields) over `nvext`.
pub(crate) fn extensions(
    top: &Extensions,
    nvext: Option<&Extensions>,
) -> Result<SamplingExtensions, ApiError> {
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
    Ok(SamplingExtensions {
        top_k: top_k_param(top_k.as_ref())?,
        min_p,
        repetition_penalty,
        ignore_eos,
        stop_token_ids: stop_token_ids.as_deref().map(token_ids).transpose()?,
        min_tokens: count("min_tokens", min_tokens.as_ref(), 0, u32::MAX)?,
        greedy,
        guided_regex,
        guided_grammar,
        guided_choice,
        guided_json,
        structured_outputs: structured_outputs.map(structured),
        num_assistant_tokens: count(
            "num_assistant_tokens",
            num_assistant_tokens.as_ref(),
            0,
            MAX_ASSISTANT_TOKENS,
        )?,
        assistant_confidence_threshold,
        best_of: count("best_of", best_of.as_ref(), 1, MAX_N)?,
        length_penalty,
        num_beam_groups: count("num_beam_groups", num_beam_groups.as_ref(), 1, MAX_N)?,
        diversity_penalty,
    })
}

/// `top_k`, where -1 (vLLM's "off") is 0.
pub(crate) fn top_k_param(k: Option<&Number>) -> Result<Option<u32>, ApiError> {
    k.map(|k| integer("top_k", k, -1, MAX_TOP_K).map(|k| k.max(0) as u32))
        .transpose()
}

/// `stop_token_ids`: at most [`MAX_STOP_TOKEN_IDS`] non-negative integers (the model's
/// vocabulary bounds them later).
fn token_ids(ids: &[Value]) -> Result<Vec<u32>, ApiError> {
    if ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!(
                "'stop_token_ids' holds at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                ids.len()
            ),
        ));
    }
    ids.iter()
        .map(|id| {
            id.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "stop_token_ids",
                        format!("stop token ids must be non-negative integers, got {id}"),
                    )
                })
        })
        .collect()
}

/// Beam search (`best_of` above `n`) answers only once every beam has finished, so a stream
/// of it is refused up front, as OpenAI and vLLM do.
pub(crate) fn refuse_streamed_beams(
    best_of: Option<u32>,
    n: Option<u32>,
    stream: bool,
) -> Result<(), ApiError> {
    if stream && best_of.is_some_and(|b| b > n.unwrap_or(1)) {
        return Err(ApiError::invalid(
            "best_of",
            "'best_of' above 'n' (beam search) cannot be streamed",
        ));
    }
    Ok(())
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
        let e = extensions(&top, Some(&nvext)).unwrap();
        assert_eq!(e.top_k, Some(5));
        assert_eq!((e.min_p, e.ignore_eos), (Some(0.1), Some(true)));
        assert_eq!(e.guided_regex.as_deref(), Some("a+"));
        assert_eq!(
            e.structured_outputs.and_then(|s| s.choice),
            Some(vec!["x".to_string()])
        );
        assert_eq!(e.num_assistant_tokens, Some(3));
        assert_eq!(e.diversity_penalty, Some(0.5));
    }

    #[test]
    fn integers_are_typed_once_and_refused_by_name() {
        let wire = |v| serde_json::from_value::<Extensions>(v).unwrap();
        let e = extensions(&wire(json!({"top_k": -1, "stop_token_ids": [2, 7]})), None);
        let e = e.unwrap();
        assert_eq!((e.top_k, e.stop_token_ids), (Some(0), Some(vec![2, 7])));
        for ids in [json!([-2]), json!([7.0]), json!(["7"])] {
            let bad = extensions(&wire(json!({"stop_token_ids": ids})), None).unwrap_err();
            assert!(
                matches!(&bad, ApiError::InvalidParam { param, .. } if param == "stop_token_ids")
            );
        }
        let bad = extensions(&wire(json!({"num_beam_groups": 0})), None).unwrap_err();
        assert!(matches!(&bad, ApiError::InvalidParam { param, .. } if param == "num_beam_groups"));
        assert!(refuse_streamed_beams(Some(3), Some(2), true).is_err());
        assert!(refuse_streamed_beams(Some(2), Some(2), true).is_ok());
        assert!(refuse_streamed_beams(Some(3), None, false).is_ok());
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
