//! The tokenizer and chat template a GGUF file carries in its metadata, as the two files of a
//! Hugging Face model folder the gateway reads: `tokenizer.json` (the `tokenizers` format) and
//! `tokenizer_config.json` (the chat template and its special tokens). The gateway owns
//! tokenization and templates, so a GGUF file without a `tokenizer.json` beside it gets these,
//! written to a folder the engine names in its model info.
//!
//! Byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`: GPT-2, SmolLM, Llama 3, Qwen2)
//! are converted: the vocabulary, the merges, control and user-defined tokens as added tokens,
//! and the pre-tokenizer `tokenizer.ggml.pre` names (split as llama.cpp splits for that name;
//! GPT-2's split for a name it does not know). SentencePiece vocabularies (`llama`) are
//! converted by [`super::sentencepiece`]. Any other kind is refused by name.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::sentencepiece::{self, Spelling};
use super::{Gguf, MetaValue};
use crate::model::ModelError;

/// The split before byte-level BPE that Llama 3 uses: numbers in runs of up to three digits.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split Qwen2 uses: as Llama 3's, with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.token_type` of a control token, and of a user-defined one.
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

fn strings<'a>(file: &'a Gguf, key: &str) -> Result<Vec<&'a str>, ModelError> {
    match file.metadata.get(key) {
        Some(MetaValue::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| ModelError::Config(format!("GGUF `{key}` holds a non-string")))
            })
            .collect(),
        _ => Err(ModelError::Config(format!(
            "GGUF metadata `{key}` is missing"
        ))),
    }
}

/// The byte-level pre-tokenizer for llama.cpp's pre-tokenizer name `pre`.
fn pre_tokenizer(pre: &str) -> Value {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    match pre {
        "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama-bpe" | "llama3" | "smaug-bpe" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
        }
        "qwen2" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
        }
        _ => byte_level(true),
    }
}

/// `tokenizer.json` and `tokenizer_config.json` for the file's tokenizer.
pub fn tokenizer_files(file: &Gguf) -> Result<(Value, Value), ModelError> {
    let meta = |key: &str| file.metadata.get(key);
    let model = meta("tokenizer.ggml.model")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    if !matches!(model, "gpt2" | "llama" | "bert") {
        return Err(ModelError::Unsupported(format!(
            "GGUF tokenizer `{model}` (the engine converts byte-level BPE, `gpt2`, SentencePiece, `llama`, and WordPiece, `bert`; put the model's tokenizer.json beside the file)"
        )));
    }
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let types: Vec<u64> = match meta("tokenizer.ggml.token_type") {
        Some(MetaValue::Array(items)) => items.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        _ => Vec::new(),
    };
    let added: Vec<Value> = tokens
        .iter()
        .enumerate()
        .filter_map(|(id, t)| {
            let kind = types.get(id).copied().unwrap_or(1);
            (kind == CONTROL || kind == USER_DEFINED).then(|| {
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": kind == CONTROL})
            })
        })
        .collect();
    let flag = |key: &str| match meta(key) {
        Some(MetaValue::Bool(b)) => Some(*b),
        _ => None,
    };
    let token_id = |key: &str| {
        meta(key)
            .and_then(MetaValue::as_u64)
            .filter(|&id| (id as usize) < tokens.len())
    };
    // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
    let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(model == "llama");
    let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
    let mut tokenizer = match model {
        "gpt2" => byte_level(file, &tokens)?,
        "bert" => {
            let lowercase = flag("tokenizer.ggml.normalizer.lowercase").unwrap_or(true);
            let mut parts = super::wordpiece::parts(&tokens, &types, lowercase);
            // [CLS] text [SEP], as a BERT tokenizer frames every input.
            let id = |key: &str, default: &str| {
                token_id(key)
                    .or_else(|| tokens.iter().position(|t| *t == default).map(|i| i as u64))
            };
            parts["post_processor"] = template_processing(
                &tokens,
                id("tokenizer.ggml.cls_token_id", "[CLS]")
                    .or_else(|| token_id("tokenizer.ggml.bos_token_id")),
                id("tokenizer.ggml.seperator_token_id", "[SEP]")
                    .or_else(|| token_id("tokenizer.ggml.eos_token_id")),
            );
            parts
        }
        "llama" => {
            let scores: Vec<f32> = match meta("tokenizer.ggml.scores") {
                Some(MetaValue::Array(items)) => items
                    .iter()
                    .map(|v| v.as_f64().unwrap_or(0.0) as f32)
                    .collect(),
                _ => Vec::new(),
            };
            let arch = meta("general.architecture")
                .and_then(MetaValue::as_str)
                .unwrap_or("");
            let mut parts = sentencepiece::parts(&tokens, &scores, Spelling::of(arch));
            parts["post_processor"] = template_processing(
                &tokens,
                add_bos
                    .then(|| token_id("tokenizer.ggml.bos_token_id"))
                    .flatten(),
                add_eos
                    .then(|| token_id("tokenizer.ggml.eos_token_id"))
                    .flatten(),
            );
            parts
        }
        _ => unreachable!("checked above"),
    };
    tokenizer["version"] = json!("1.0");
    tokenizer["truncation"] = Value::Null;
    tokenizer["padding"] = Value::Null;
    tokenizer["added_tokens"] = json!(added);
    let token = |key: &str| {
        token_id(key)
            .map(|id| json!(tokens[id as usize]))
            .unwrap_or(Value::Null)
    };
    let mut config = json!({
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
    });
    if let Some(template) = meta("tokenizer.chat_template").and_then(MetaValue::as_str) {
        config["chat_template"] = json!(template);
    }
    Ok((tokenizer, config))
}

/// The model, pre-tokenizer, post-processor and decoder of a byte-level BPE vocabulary.
fn byte_level(file: &Gguf, tokens: &[&str]) -> Result<Value, ModelError> {
    let merges = strings(file, "tokenizer.ggml.merges")?;
    let vocab: Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| ((*t).to_string(), json!(id)))
        .collect();
    let pre = file
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(MetaValue::as_str)
        .unwrap_or("default");
    let merges: Vec<Value> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => json!([a, b]),
            None => json!([m, ""]),
        })
        .collect();
    Ok(json!({
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(pre),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    }))
}

/// A post-processor that puts `bos` before and `eos` after the text (either may be absent).
fn template_processing(tokens: &[&str], bos: Option<u64>, eos: Option<u64>) -> Value {
    let special = |id: Option<u64>, type_id: u32| {
        id.map(|id| json!({"SpecialToken": {"id": tokens[id as usize], "type_id": type_id}}))
    };
    let sequence = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let single: Vec<Value> = [special(bos, 0), Some(sequence("A", 0)), special(eos, 0)]
        .into_iter()
        .flatten()
        .collect();
    let pair: Vec<Value> = [
        special(bos, 0),
        Some(sequence("A", 0)),
        special(eos, 0),
        special(bos, 1),
        Some(sequence("B", 1)),
        special(eos, 1),
    ]
    .into_iter()
    .flatten()
    .collect();
    let specials: Map<String, Value> = [bos, eos]
        .into_iter()
        .flatten()
        .map(|id| {
            let t = tokens[id as usize];
            (t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}))
        })
        .collect();
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

/// The sampling the file's makers recommend (llama.cpp's `general.sampling.*` keys), as a
/// `generation_config.json` the gateway reads for requests that set none; `None` when the file
/// holds none.
pub fn generation_config(file: &Gguf) -> Option<Value> {
    let keys = [
        ("general.sampling.temp", "temperature"),
        ("general.sampling.top_p", "top_p"),
        ("general.sampling.top_k", "top_k"),
        ("general.sampling.min_p", "min_p"),
        ("general.sampling.penalty_repeat", "repetition_penalty"),
    ];
    let mut config = serde_json::Map::new();
    for (key, name) in keys {
        if let Some(value) = file.metadata.get(key).and_then(MetaValue::as_f64) {
            // f32 in the file: written as the decimal it was meant as.
            let value = (value * 1e6).round() / 1e6;
            let value = if name == "top_k" {
                json!(value as i64)
            } else {
                json!(value)
            };
            config.insert(name.into(), value);
        }
    }
    (!config.is_empty()).then_some(Value::Object(config))
}

/// Writes the file's `tokenizer.json` and `tokenizer_config.json` (and its
/// `generation_config.json` when it recommends sampling) into `folder` (made if need be), and
/// returns the tokenizer's path.
pub fn write_tokenizer(file: &Gguf, folder: &Path) -> Result<PathBuf, ModelError> {
    let tokenizer_path = folder.join("tokenizer.json");
    let config_path = folder.join("tokenizer_config.json");
    let (tokenizer, config) = tokenizer_files(file)?;
    std::fs::create_dir_all(folder).map_err(|e| ModelError::io(folder, e))?;
    let write = |path: &Path, value: &Value| {
        let text = serde_json::to_vec(value).map_err(|e| ModelError::Config(e.to_string()))?;
        // Written whole under a name of this writer's own first, so a reader never sees half a
        // file and processes that start together (nodes sharing a cache) never rename each
        // other's partial file away.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nth = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = path.with_extension(format!("json.{}-{nth}.partial", std::process::id()));
        std::fs::write(&partial, text).map_err(|e| ModelError::io(&partial, e))?;
        std::fs::rename(&partial, path).map_err(|e| ModelError::io(path, e))
    };
    write(&tokenizer_path, &tokenizer)?;
    write(&config_path, &config)?;
    if let Some(generation) = generation_config(file) {
        write(&folder.join("generation_config.json"), &generation)?;
    }
    Ok(tokenizer_path)
}
