//! Text and token ids for one model, below everything that runs a request: the tokenizer, the
//! chat template (with its `strftime`), incremental detokenization, stop strings, and the
//! parsers that find tool calls and reasoning in generated text.
//!
//! These are plain data and pure functions of a model's files: the gateway's engine host keeps
//! them with each served model, its pipeline drives them per request. A crate of its own, below
//! the gateway (which re-exports it as `turnpike::text`): it imports nothing of the request
//! path, and rebuilding the gateway does not rebuild it.

pub mod decode;
pub mod prompt_cache;
pub mod reasoning;
pub mod stop;
mod strftime;
pub mod template;
pub mod tokenizer;
pub mod tool_prompt;
pub mod tools;
