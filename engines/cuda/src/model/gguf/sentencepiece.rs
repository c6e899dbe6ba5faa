//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, TinyLlama,
//! Gemma, Phi-3) as the `tokenizer.json` a Hugging Face model folder would carry: a BPE model
//! with byte fallback whose merges are recovered from the vocabulary, and the `▁` word marker
//! placed as each family's own tokenizer places it.
//!
//! A GGUF file keeps SentencePiece's pieces and scores but no merges. The merges are rebuilt as
//! `transformers` rebuilds them when it reads the same file, so both encode a text to the same
//! ids: every split of every piece into two pieces of the vocabulary, ordered best first by the
//! merged piece's score (Gemma: by its position in the file, since its scores do not follow its
//! merge order), ties broken by the longer left and then the longer right part, and within one
//! piece by the ids of the parts.
//!
//! The three spellings of the word marker:
//! - Llama (the default): a `Metaspace` pre-tokenizer, `▁` before the first word only;
//! - Gemma: spaces become `▁` and nothing is prepended (Gemma files also store pieces of
//!   spaces as spaces, which are respelled with `▁` first);
//! - Phi-3: `▁` prepended to the whole text, then every space becomes `▁`.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

/// How a family places SentencePiece's word marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// Llama, Mistral, TinyLlama and any architecture not named below.
    Llama,
    /// `gemma`, `gemma2`, `gemma3`.
    Gemma,
    /// `phi3`.
    Phi3,
}

impl Spelling {
    /// The spelling of architecture `arch`.
    pub fn of(arch: &str) -> Self {
        match arch {
            "gemma" | "gemma2" | "gemma3" => Self::Gemma,
            "phi3" => Self::Phi3,
            _ => Self::Llama,
        }
    }
}

/// The word marker.
const MARK: &str = "\u{2581}";

/// The `model`, `normalizer`, `pre_tokenizer` and `decoder` of the `tokenizer.json` for these
/// pieces and scores, as a JSON object holding those four keys.
pub fn parts(tokens: &[&str], scores: &[f32], spelling: Spelling) -> Value {
    let tokens: Vec<String> = tokens
        .iter()
        .map(|t| {
            if spelling == Spelling::Gemma && t.contains(' ') && t.trim().is_empty() {
                MARK.repeat(t.chars().count())
            } else {
                (*t).to_string()
            }
        })
        .collect();
    let rank: Vec<f32> = match spelling {
        Spelling::Gemma => (0..tokens.len()).map(|i| -(i as f32)).collect(),
        _ => (0..tokens.len())
            .map(|i| scores.get(i).copied().unwrap_or(0.0))
            .collect(),
    };
    let merges = merges(&tokens, &rank);
    let vocab: Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), json!(id)))
        .collect();
    let unk = match spelling {
        Spelling::Gemma => json!("<unk>"),
        _ => Value::Null,
    };
    let model = json!({"type": "BPE", "dropout": null, "unk_token": unk,
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
        "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges});
    let replace = |from: &str, to: &str| json!({"type": "Replace", "pattern": {"String": from}, "content": to});
    let mut decoders = vec![
        replace(MARK, " "),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let (normalizer, pre_tokenizer) = match spelling {
        Spelling::Llama => {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            (
                Value::Null,
                json!({"type": "Metaspace", "replacement": MARK, "prepend_scheme": "first",
                       "split": false}),
            )
        }
        Spelling::Gemma => (
            replace(" ", MARK),
            json!({"type": "Split", "pattern": {"String": " "},
                   "behavior": "MergedWithPrevious", "invert": false}),
        ),
        Spelling::Phi3 => {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            (
                json!({"type": "Sequence", "normalizers": [
                    {"type": "Prepend", "prepend": MARK}, replace(" ", MARK)]}),
                Value::Null,
            )
        }
    };
    json!({"model": model, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
           "decoder": {"type": "Sequence", "decoders": decoders}})
}

/// The merges the vocabulary implies (see the module's doc), best first.
fn merges(tokens: &[String], rank: &[f32]) -> Vec<Value> {
    // A piece spelled twice keeps its first place in the iteration but its last id and rank,
    // as a dictionary built from the list would.
    let mut id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut score: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if id.insert(t, i).is_none() {
            order.push(t);
        }
        score.insert(t, rank[i]);
    }
    let mut all: Vec<(&str, &str, f32)> = Vec::new();
    for piece in order {
        let mut local: Vec<(&str, &str, f32)> = piece
            .char_indices()
            .skip(1)
            .map(|(at, _)| piece.split_at(at))
            .filter(|(l, r)| id.contains_key(l) && id.contains_key(r))
            .map(|(l, r)| (l, r, score[piece]))
            .collect();
        local.sort_by_key(|(l, r, _)| (id[l], id[r]));
        all.extend(local);
    }
    let len = |s: &str| s.chars().count();
    all.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then(len(b.0).cmp(&len(a.0)))
            .then(len(b.1).cmp(&len(a.1)))
    });
    all.into_iter().map(|(l, r, _)| json!([l, r])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_the_merged_pieces_scores() {
        let tokens = ["<unk>", "a", "b", "c", "ab", "abc", "bc"];
        let scores = [0.0, 0.0, 0.0, 0.0, -1.0, -3.0, -2.0];
        let merges = merges(&tokens.map(String::from), &scores);
        let pairs: Vec<(String, String)> = merges
            .iter()
            .map(|m| {
                (
                    m[0].as_str().unwrap_or("").into(),
                    m[1].as_str().unwrap_or("").into(),
                )
            })
            .collect();
        let want = [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")];
        assert_eq!(pairs, want.map(|(l, r)| (l.to_string(), r.to_string())));
    }

    #[test]
    fn gemma_respells_pieces_of_spaces() {
        let v = parts(&["<pad>", "  ", "a"], &[0.0; 3], Spelling::Gemma);
        assert!(v["model"]["vocab"].get("\u{2581}\u{2581}").is_some());
        assert_eq!(v["normalizer"]["content"], json!(MARK));
    }
}
