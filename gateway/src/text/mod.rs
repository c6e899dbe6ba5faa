//! Text and token ids for one model, below everything that runs a request: the tokenizer, the
//! chat template (with its `strftime`), incremental detokenization, stop strings, and the
//! parsers that find tool calls and reasoning in generated text.
//!
//! These are plain data and pure functions of a model's files: the engine host keeps them with
//! each served model, the pipeline drives them per request.

pub mod decode;
pub mod reasoning;
pub mod stop;
mod strftime;
pub mod template;
pub mod tokenizer;
pub mod tool_prompt;
pub mod tools;
