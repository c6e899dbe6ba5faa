//! WordPiece vocabularies (`tokenizer.ggml.model = "bert"`: BERT, bge, MiniLM, Nomic) as the
//! `tokenizer.json` a BERT folder carries. llama.cpp's converter respells them (a word's first
//! piece gains `▁`, a continuation loses its `##`; control tokens stay as they are); this undoes
//! that. The text is normalised as BERT does (Chinese characters split; lowercased and accents
//! stripped unless the file's `tokenizer.ggml.normalizer.lowercase` is false).

use serde_json::{Map, Value, json};

/// `tokenizer.ggml.token_type` of a control token.
const CONTROL: u64 = 3;

/// The `model`, `normalizer`, `pre_tokenizer` and `decoder` of the `tokenizer.json` for these
/// tokens, as a JSON object holding those four keys.
pub fn parts(tokens: &[&str], types: &[u64], lowercase: bool) -> Value {
    let vocab: Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            let control = types.get(id) == Some(&CONTROL);
            let spelled = match t.strip_prefix('\u{2581}') {
                _ if control => (*t).to_string(),
                Some(word) => word.to_string(),
                None => format!("##{t}"),
            };
            (spelled, json!(id))
        })
        .collect();
    let unk = ["[UNK]", "<unk>"]
        .into_iter()
        .find(|u| vocab.contains_key(*u))
        .unwrap_or("[UNK]");
    json!({
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece", "unk_token": unk, "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phantom_spaces_become_continuations_again() {
        let v = parts(
            &["[CLS]", "\u{2581}play", "ing", "[UNK]"],
            &[3, 1, 1, 3],
            true,
        );
        let vocab = &v["model"]["vocab"];
        assert_eq!(vocab["play"], json!(1));
        assert_eq!(vocab["##ing"], json!(2));
        assert_eq!(vocab["[CLS]"], json!(0));
        assert_eq!(v["model"]["unk_token"], json!("[UNK]"));
    }
}
