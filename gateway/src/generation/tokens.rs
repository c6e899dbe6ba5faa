//! Token-level generation, for the node endpoint (`POST /generate`, which the field's routers
//! and Turnpike's upstream engine plugin speak): token ids in, the engine's token events out.
//! The same model lookup, scope check, limits and admission as every protocol, and none of the
//! text pipeline (no template, tokenizer, stop strings or parsers): the caller owns the text.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_core::Stream;
use tokio_util::sync::WaitForCancellationFutureOwned;
use turnpike_engine_api::host::EngineRequest;
use turnpike_engine_api::{EngineEvent, FinalEvent, GenerationParams, Status};

use super::Generator;
use crate::engine_host::EngineRun;
use crate::error::ApiError;
use crate::pipeline::speculation::{Names, speculation};
use crate::spend::Usage;
use crate::tenancy::{Admission, AdmitRequest, Caller};

/// A token-level request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRequest {
    /// The public model name.
    pub model: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation parameters (tenant fields are set here).
    pub params: GenerationParams,
    /// Where the prompt's ids came from in the caller's request (for errors).
    pub param: &'static str,
}

/// A started token-level generation: the engine's events, with the tenant's hold on its
/// limits. Dropping it cancels the engine work and settles the tokens used.
pub struct TokenRun {
    run: EngineRun,
    admission: Admission,
    /// Prompt tokens.
    prompt: u64,
    /// Tokens generated so far.
    tokens: u64,
    /// The engine's id of the served model.
    pub model_id: String,
    /// Completes when the server cuts running generations on shutdown.
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    ended: bool,
    /// The `engine` trace span (disabled when traces are off).
    span: tracing::Span,
}

impl std::fmt::Debug for TokenRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRun")
            .field("model_id", &self.model_id)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl Stream for TokenRun {
    type Item = EngineEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EngineEvent>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        let polled = this.run.events.as_mut().poll_next(cx);
        match &polled {
            Poll::Ready(Some(EngineEvent::Token(_))) => {
                this.tokens += 1;
                this.admission.record(this.prompt + this.tokens);
            }
            Poll::Ready(Some(EngineEvent::Final(fin))) => {
                this.ended = true;
                this.span.record("completion_tokens", this.tokens as i64);
                this.admission.bill(Usage {
                    prompt: this.prompt,
                    cached: u64::from(fin.usage.cached_prompt_tokens),
                    completion: u64::from(fin.usage.completion_tokens).max(this.tokens),
                    reasoning: 0,
                });
            }
            Poll::Ready(None) => {
                this.ended = true;
                this.span.record("completion_tokens", this.tokens as i64);
            }
            Poll::Ready(Some(_)) => {}
            Poll::Pending => {
                if this.cut.as_mut().poll(cx).is_ready() {
                    // Shutting down: the caller hears a clean end; dropping the run cancels it.
                    this.ended = true;
                    return Poll::Ready(Some(EngineEvent::Final(FinalEvent::failed(
                        Status::Unavailable,
                        "the server is shutting down",
                        Default::default(),
                    ))));
                }
            }
        }
        polled
    }
}

impl Generator {
    /// Checks `req` against its model (ids in the vocabulary, prompt and output within the
    /// context, `n` and log probabilities within its capabilities), admits it for `caller`
    /// and submits it.
    pub async fn generate_tokens(
        &self,
        caller: &Caller,
        mut req: TokenRequest,
        started: Instant,
    ) -> Result<TokenRun, ApiError> {
        let model = self.generating_model_for(caller, &req.model)?;
        let p = &mut req.params;
        let vocab = model.info.vocab_size;
        if req.prompt.is_empty() {
            return Err(ApiError::invalid(req.param, "the prompt holds no tokens"));
        }
        if let Some((i, bad)) = req.prompt.iter().enumerate().find(|(_, t)| **t >= vocab) {
            return Err(ApiError::invalid(
                format!("{}[{i}]", req.param),
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let context = model.context_length as usize;
        if req.prompt.len() + p.max_tokens as usize > context {
            return Err(ApiError::ContextLengthExceeded {
                param: req.param.into(),
                message: format!(
                    "{} prompt tokens and {} to generate exceed the context of {context}",
                    req.prompt.len(),
                    p.max_tokens
                ),
            });
        }
        let caps = &model.info.capabilities;
        if p.n == 0 || p.n > caps.max_n {
            return Err(ApiError::invalid(
                "n",
                format!("n must be from 1 to {} for this model", caps.max_n),
            ));
        }
        if p.top_logprobs > caps.max_top_logprobs || (p.logprobs && !caps.logprobs) {
            return Err(ApiError::invalid(
                "top_logprobs_num",
                format!(
                    "this model returns at most {} top log probabilities",
                    caps.max_top_logprobs
                ),
            ));
        }
        if p.grammar.is_some() && !caps.grammar {
            return Err(ApiError::unsupported(
                "sampling_params",
                format!("model `{}` cannot constrain its output", model.id),
            ));
        }
        check_speculation(p, caps, &model.id)?;
        if let Some(resume) = p.resume {
            if !caps.resume {
                return Err(ApiError::unsupported(
                    "resume",
                    format!("model `{}` cannot resume a request exactly", model.id),
                ));
            }
            resume
                .check(p)
                .map_err(|why| ApiError::invalid("resume", why))?;
            if resume.split(&req.prompt).is_err() {
                return Err(ApiError::invalid(
                    "resume.tokens",
                    format!(
                        "{} resumed tokens leave no prompt of the {} in {}",
                        resume.tokens,
                        req.prompt.len(),
                        req.param
                    ),
                ));
            }
        }
        let tenant = &caller.principal.tenant;
        p.tenant = Some(tenant.name.clone());
        p.tenant_weight = tenant.plan.weight;
        let deadline = started + self.timing.request_timeout;
        let most = u64::from(p.max_tokens) * u64::from(p.n);
        let admission = self
            .tenancy
            .admit(
                caller,
                &model,
                AdmitRequest {
                    prompt: req.prompt.len() as u64,
                    most_new: most,
                    priority: p.priority,
                    deadline,
                    wait: true,
                    price: self.price(&req.model, &model.id),
                    record: super::record_context(
                        caller,
                        &crate::ids::new_id("gen-"),
                        "generate",
                        &req.model,
                        &model.id,
                        started,
                    ),
                },
            )
            .await?;
        let prompt = req.prompt.len() as u64;
        let span = tracing::info_span!(
            target: crate::observability::traces::TARGET,
            "engine",
            model = %model.id,
            prompt_tokens = req.prompt.len() as i64,
            completion_tokens = tracing::field::Empty,
        );
        let request = EngineRequest {
            trace_context: crate::observability::traces::traceparent(&span),
            model: model.info.id.clone(),
            prompt: req.prompt,
            params: req.params,
        };
        let run = model
            .backend
            .submit(&request)
            .map_err(|e| ApiError::from_engine(e, self.timing.retry_after))?;
        Ok(TokenRun {
            run,
            admission,
            prompt,
            tokens: 0,
            model_id: model.id.clone(),
            cut: Box::pin(self.lifecycle().cut_signal()),
            ended: false,
            span,
        })
    }
}

/// A token request's speculation settings, held to what the model declares: zero drafts is
/// plain decoding, which every model does; anything else needs `speculative` (and a threshold
/// `draft_confidence`), in range and not both.
fn check_speculation(
    p: &mut GenerationParams,
    caps: &turnpike_engine_api::Capabilities,
    model: &str,
) -> Result<(), ApiError> {
    (p.num_assistant_tokens, p.assistant_confidence_threshold) = speculation(
        p.num_assistant_tokens,
        p.assistant_confidence_threshold.map(f64::from),
        caps,
        model,
        Names {
            tokens: "sampling_params.num_assistant_tokens",
            threshold: "sampling_params.assistant_confidence_threshold",
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_engine_api::Capabilities;

    #[test]
    fn speculation_settings_are_held_to_the_models_capabilities() {
        let plain = Capabilities::default();
        let lookup = Capabilities {
            speculative: true,
            ..Capabilities::default()
        };
        let drafting = Capabilities {
            draft_confidence: true,
            ..lookup.clone()
        };
        let params = |k: Option<u32>, t: Option<f32>| GenerationParams {
            num_assistant_tokens: k,
            assistant_confidence_threshold: t,
            ..GenerationParams::default()
        };
        // Zero drafts is plain decoding: every model takes it (and is not sent it).
        let mut p = params(Some(0), None);
        assert!(check_speculation(&mut p, &plain, "m").is_ok());
        assert_eq!(p.num_assistant_tokens, None);
        let refused = |mut p: GenerationParams, caps: &Capabilities| {
            check_speculation(&mut p, caps, "m")
                .err()
                .map(|e| e.to_string())
        };
        assert!(refused(params(Some(3), None), &plain).is_some());
        assert!(refused(params(Some(17), None), &lookup).is_some());
        assert!(refused(params(Some(3), None), &lookup).is_none());
        assert!(refused(params(None, Some(0.5)), &lookup).is_some());
        assert!(refused(params(None, Some(0.5)), &drafting).is_none());
        assert!(refused(params(None, Some(0.0)), &drafting).is_some());
        assert!(refused(params(Some(2), Some(0.5)), &drafting).is_some());
    }
}
