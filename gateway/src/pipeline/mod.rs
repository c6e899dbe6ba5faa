//! Protocol translation, in the gateway, once for every engine: a request becomes a prompt of
//! token ids (chat template, tokenizer) and checked generation parameters; the engine's token
//! events become text (incremental detokenization, stop strings, log probabilities) and, for
//! non-streamed responses, one folded answer.
//!
//! The engine always streams ([`run::GenStream`]); everything else is rendering.

pub(crate) mod budget;
mod engine_spans;
pub(crate) mod events;
pub(crate) mod extensions;
pub(crate) mod fold;
pub(crate) mod guided;
pub(crate) mod params;
pub(crate) mod plan;
pub(crate) mod prompt;
pub(crate) mod request;
pub(crate) mod run;
pub(crate) mod speculation;
pub(crate) mod tool_grammar;
pub(crate) mod validate;
