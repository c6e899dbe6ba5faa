//! A request's speculative decoding parameters checked against its model, once for every
//! protocol that carries them (the OpenAI extension parameters and the node's `/generate`),
//! each protocol naming them its own way in the errors.

use turnpike_engine_api::Capabilities;
use turnpike_engine_api::json::MAX_ASSISTANT_TOKENS;

use crate::error::ApiError;

/// What a protocol calls `num_assistant_tokens` and `assistant_confidence_threshold`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    pub tokens: &'static str,
    pub threshold: &'static str,
}

/// The engine's speculation fields for a request asking for `tokens` drafted per step
/// and/or drafts ending under `threshold`: a fixed length of at most
/// [`MAX_ASSISTANT_TOKENS`] where the model speculates (0, plain decoding, anywhere, and not
/// sent where it does not speculate); a threshold in (0, 1] where drafts come from a model,
/// never beside a fixed length.
pub(crate) fn speculation(
    tokens: Option<u32>,
    threshold: Option<f64>,
    caps: &Capabilities,
    model: &str,
    names: Names,
) -> Result<(Option<u32>, Option<f32>), ApiError> {
    if let Some(k) = tokens {
        if k > MAX_ASSISTANT_TOKENS {
            return Err(ApiError::invalid(
                names.tokens,
                format!("at most {MAX_ASSISTANT_TOKENS} tokens are drafted per step, got {k}"),
            ));
        }
        if k > 0 && !caps.speculative {
            return Err(ApiError::unsupported(
                names.tokens,
                format!("model `{model}` does not decode speculatively"),
            ));
        }
    }
    let Some(threshold) = threshold else {
        return Ok((tokens.filter(|_| caps.speculative), None));
    };
    if !caps.draft_confidence {
        let why = if caps.speculative {
            format!(
                "drafts by prompt lookup, which has no confidence to stop at; use {}",
                names.tokens
            )
        } else {
            "does not decode speculatively".to_string()
        };
        return Err(ApiError::unsupported(
            names.threshold,
            format!("model `{model}` {why}"),
        ));
    }
    if tokens.is_some() {
        return Err(ApiError::invalid(
            names.threshold,
            format!(
                "'{}' and '{}' exclude each other",
                names.threshold, names.tokens
            ),
        ));
    }
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(ApiError::invalid(
            names.threshold,
            format!("'{}' must be in (0, 1], got {threshold}", names.threshold),
        ));
    }
    Ok((None, Some(threshold as f32)))
}
