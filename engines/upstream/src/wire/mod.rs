//! The token-level protocols the plugin speaks to nodes, behind one small surface: where a
//! request goes ([`Protocol::path`]), the body it carries ([`Protocol::body`], or why the node
//! cannot take it) and how each streamed chunk reads back ([`Protocol::chunk`]) as plain
//! [`Chunk`]s of new tokens. Everything else (routing, retries, cancel, stop tokens) is the same
//! for every protocol and lives in `run`.
//!
//! - [`Protocol::Sglang`]: SGLang's native `/generate`, which Turnpike nodes serve too.
//! - [`Protocol::Turnpike`]: the same, to Turnpike nodes, which also take a resumption
//!   (`resume`) and continue a choice exactly where a failed node left it.
//! - [`Protocol::LlamaCpp`]: `llama-server`'s `/completion` with a token prompt.
//! - [`Protocol::Vllm`]: vLLM's tokens-in, tokens-out `/inference/v1/generate`.

mod llama_cpp;
mod sglang;
mod vllm;

use serde::Deserialize;
use serde_json::Value;
use turnpike_engine_api::plugin::Request;
use turnpike_engine_api::{Finish, FinishReason};

/// Which interface a pool's nodes speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Protocol {
    /// SGLang's `/generate` (SGLang servers, and Turnpike nodes without exact resumption).
    #[default]
    Sglang,
    /// Turnpike nodes: SGLang's `/generate` plus Turnpike's `resume`.
    Turnpike,
    /// llama.cpp's `llama-server`.
    LlamaCpp,
    /// vLLM's `/inference/v1/generate`.
    Vllm,
}

impl Protocol {
    /// The request's path on a node.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Sglang | Self::Turnpike => "/generate",
            Self::LlamaCpp => "/completion",
            Self::Vllm => "/inference/v1/generate",
        }
    }

    /// The most choices one request may ask for (`None`: as configured).
    pub(crate) fn max_n(self) -> Option<u32> {
        match self {
            Self::LlamaCpp => Some(1),
            Self::Sglang | Self::Turnpike | Self::Vllm => None,
        }
    }

    /// Whether requests can carry speculation settings: Turnpike nodes take
    /// `num_assistant_tokens` and `assistant_confidence_threshold` in `sampling_params`
    /// (SGLang's own servers refuse unknown keys, so only nodes declared `speculative` get
    /// them). vLLM's generate API has none, and llama-server (build 11434) compiles its
    /// per-request `speculative.*` fields out: its command line settles drafting for all.
    pub(crate) fn carries_drafts(self) -> bool {
        match self {
            Self::Sglang | Self::Turnpike => true,
            Self::LlamaCpp | Self::Vllm => false,
        }
    }

    /// Whether the nodes continue a resumed choice exactly (its penalties, grammar and seed
    /// carried on): only Turnpike nodes read `resume`. The others get the prompt followed by
    /// the output and the budget left, a valid continuation of the text without that state.
    pub(crate) fn resumes_exactly(self) -> bool {
        self == Self::Turnpike
    }

    /// The body of a streamed request, or why this protocol cannot carry `req` (a refusal
    /// before anything is sent). `model` is the nodes' name for the model, sent when given.
    pub(crate) fn body(
        self,
        model: Option<&str>,
        req: &Request,
        rid: &str,
    ) -> Result<Vec<u8>, String> {
        let value = match self {
            Self::Sglang => return Ok(sglang::body(model, req, rid, false)),
            Self::Turnpike => return Ok(sglang::body(model, req, rid, true)),
            Self::LlamaCpp => llama_cpp::body(model, req)?,
            Self::Vllm => vllm::body(model, req, rid)?,
        };
        Ok(value.to_string().into_bytes())
    }

    /// Reads one streamed chunk (a `data:` line's JSON); `seen(index)` is how many tokens of
    /// choice `index` came before.
    pub(crate) fn chunk(
        self,
        payload: &[u8],
        seen: impl Fn(usize) -> usize,
    ) -> Result<Chunk, String> {
        if let Self::Sglang | Self::Turnpike = self {
            return sglang::chunk(payload, seen);
        }
        let value: Value =
            serde_json::from_slice(payload).map_err(|e| format!("a chunk is not JSON: {e}"))?;
        if let Some(error) = value.get("error") {
            return Err(error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string));
        }
        match self {
            Self::LlamaCpp => llama_cpp::chunk(&value),
            Self::Vllm => vllm::chunk(&value),
            Self::Sglang | Self::Turnpike => sglang::chunk(payload, seen),
        }
    }
}

/// A token as a node sent it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub id: u32,
    /// Its log probability, when asked for.
    pub logprob: Option<f32>,
    /// Alternatives: id and log probability, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One streamed chunk, its new tokens only.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chunk {
    pub index: u32,
    /// New tokens.
    pub tokens: Vec<Token>,
    pub finish: Option<Finish>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
}

/// Ended by a stop or end-of-sequence token the node did not name.
fn stopped() -> Finish {
    Finish {
        reason: Some(FinishReason::Stop),
        stop_token: None,
    }
}

/// A JSON number as a token id.
fn token_id(v: &Value) -> Result<u32, String> {
    v.as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("`{v}` is not a token id"))
}

/// Tokens from an array of ids and a parallel array of per-token entries, each with its
/// `logprob` and, read by `top`, its alternatives (llama-server and vLLM stream them so).
fn tokens(
    ids: &Value,
    entries: Option<&Vec<Value>>,
    top: impl Fn(&Value) -> Vec<(u32, f32)>,
) -> Result<Vec<Token>, String> {
    let ids = ids.as_array().map(Vec::as_slice).unwrap_or_default();
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            let entry = entries.and_then(|e| e.get(i));
            Ok(Token {
                id: token_id(id)?,
                logprob: entry.and_then(|e| e["logprob"].as_f64()).map(|l| l as f32),
                top: entry.map(&top).unwrap_or_default(),
            })
        })
        .collect()
}
