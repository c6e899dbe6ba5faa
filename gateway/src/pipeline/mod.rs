//! Protocol translation, in the gateway, once for every engine: a request becomes a prompt of
//! token ids (chat template, tokenizer) and checked generation parameters; the engine's token
//! events become text (incremental detokenization, stop strings, log probabilities) and, for
//! non-streamed responses, one folded answer.
//!
//! The engine always streams ([`run::GenStream`]); everything else is rendering.

pub mod budget;
pub mod fold;
pub mod params;
pub mod prompt;
pub mod run;
