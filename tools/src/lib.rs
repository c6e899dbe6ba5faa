//! Generators for assets the project makes itself, so tests and demos never download anything.
//!
//! [`write_sim_model`] makes the model folder the simulator engine's models use
//! (`examples/models/sim-small`): a byte-level BPE tokenizer trained on `tools/corpus.txt`, with
//! Llama-3-style special tokens and chat template. It is deterministic: a test regenerates it and
//! compares with the checked-in files.
//!
//! [`model`] makes complete Llama-family model folders with deterministic random weights
//! (`turnpike make-model`, the built-in default model, tests and benchmarks).

pub mod model;
pub mod smollm2;

use std::path::{Path, PathBuf};

use serde_json::json;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper};
use tokenizers::{PreTokenizerWrapper, TokenizerBuilder};

/// The workspace root (this crate lives in `tools/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Special tokens, in id order (they take ids 0..5).
pub const SPECIAL_TOKENS: [&str; 5] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// Target vocabulary size; a small corpus may stop short of it.
const VOCAB_SIZE: usize = 1024;

/// The chat template: Llama 3 in shape, with tools listed in a system turn, assistant tool calls
/// as JSON, and tool results in an `ipython` turn.
pub const CHAT_TEMPLATE: &str = r#"{{- bos_token }}
{%- if tools %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nYou can call these tools. To call one, answer with {"name": ..., "arguments": {...}}.\n' }}
{%- for tool in tools %}
{{- tool | tojson }}{{ '\n' }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- for call in message.tool_calls %}
{{- {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

fn pretty(value: &serde_json::Value) -> Result<String, String> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| e.to_string())
}

/// Trains the tokenizer and writes `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json` into `out`.
pub fn write_sim_model(out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(VOCAB_SIZE)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let byte_level = ByteLevel::default().add_prefix_space(false);
    let bos = SPECIAL_TOKENS[0];
    let template = TemplateProcessing::builder()
        .try_single(format!("{bos}:0 $A:0"))
        .map_err(|e| e.to_string())?
        .special_tokens(vec![(bos, 0)])
        .build()
        .map_err(|e| e.to_string())?;
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(byte_level.into()))
    .with_post_processor(Some(template.into()))
    .with_decoder(Some(byte_level.into()))
    .build()
    .map_err(|e| e.to_string())?;
    let corpus = workspace_root().join("tools/corpus.txt");
    tokenizer
        .train_from_files(&mut trainer, vec![corpus.to_string_lossy().into_owned()])
        .map_err(|e| format!("training on {}: {e}", corpus.display()))?;
    let json = tokenizer.to_string(true).map_err(|e| e.to_string())?;
    std::fs::write(out.join("tokenizer.json"), json + "\n").map_err(|e| e.to_string())?;

    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[4],
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": false,
        "chat_template": CHAT_TEMPLATE,
    });
    std::fs::write(out.join("tokenizer_config.json"), pretty(&config)?)
        .map_err(|e| e.to_string())?;
    let generation = json!({"bos_token_id": 0, "eos_token_id": [4, 1]});
    std::fs::write(out.join("generation_config.json"), pretty(&generation)?)
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_sim_model_is_current() {
        let dir = std::env::temp_dir().join(format!("turnpike-sim-model-{}", std::process::id()));
        write_sim_model(&dir).expect("generate");
        let shipped = workspace_root().join("examples/models/sim-small");
        for file in [
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            let fresh = std::fs::read_to_string(dir.join(file)).expect("fresh");
            let checked_in = std::fs::read_to_string(shipped.join(file)).unwrap_or_default();
            assert!(
                fresh == checked_in,
                "examples/models/sim-small/{file} is stale: run `cargo run -p turnpike-tools --bin make-sim-model`"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
