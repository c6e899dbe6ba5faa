//! The vocabulary random output draws from.
//!
//! Without a tokenizer it is every id below `vocab_size`. With a Hugging Face `tokenizer.json`
//! it is the tokens that read as words (letters, optionally after the tokenizer's space marker),
//! so the gateway's detokenizer turns random output into plausible text. The file is read with
//! plain JSON, not a tokenizer library: only the id -> piece table is needed.

use std::sync::Arc;

use serde_json::Value;

use crate::rng::Rng;

#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    size: u32,
    /// Ids to draw from; empty means "any id below `size`".
    words: Arc<Vec<u32>>,
    eos: Option<u32>,
}

const EOS_NAMES: &[&str] = &[
    "</s>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|im_end|>",
    "<eos>",
];

impl Vocab {
    pub(crate) fn plain(size: u32) -> Self {
        Self {
            size,
            words: Arc::new(Vec::new()),
            eos: None,
        }
    }

    pub(crate) fn from_tokenizer_file(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
        Self::from_tokenizer_json(&doc).map_err(|e| format!("{path}: {e}"))
    }

    pub(crate) fn from_tokenizer_json(doc: &Value) -> Result<Self, String> {
        let mut pieces: Vec<(u32, String)> = Vec::new();
        match &doc["model"]["vocab"] {
            // BPE and WordPiece: {"piece": id}
            Value::Object(map) => {
                for (piece, id) in map {
                    let id = id.as_u64().ok_or("a vocabulary id is not an integer")?;
                    pieces.push((
                        u32::try_from(id).map_err(|_| "a vocabulary id is too large")?,
                        piece.clone(),
                    ));
                }
            }
            // Unigram: [["piece", score], ...], the id being the position.
            Value::Array(list) => {
                for (id, entry) in list.iter().enumerate() {
                    let piece = entry[0].as_str().ok_or("a unigram entry has no piece")?;
                    pieces.push((id as u32, piece.to_string()));
                }
            }
            _ => return Err("no model.vocab table".into()),
        }
        let mut special = Vec::new();
        let mut eos = None;
        if let Some(added) = doc["added_tokens"].as_array() {
            for token in added {
                let (Some(id), Some(content)) = (token["id"].as_u64(), token["content"].as_str())
                else {
                    continue;
                };
                let id = id as u32;
                special.push(id);
                if eos.is_none() && EOS_NAMES.contains(&content) {
                    eos = Some(id);
                }
                pieces.push((id, content.to_string()));
            }
        }
        let size = pieces
            .iter()
            .map(|(id, _)| id + 1)
            .max()
            .ok_or("the vocabulary is empty")?;
        let mut words: Vec<u32> = pieces
            .iter()
            .filter(|(id, piece)| !special.contains(id) && is_word(piece))
            .map(|(id, _)| *id)
            .collect();
        words.sort_unstable();
        words.dedup();
        Ok(Self {
            size,
            words: Arc::new(words),
            eos,
        })
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    pub(crate) fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// A pseudo-random token id.
    pub(crate) fn draw(&self, rng: &mut Rng) -> u32 {
        if self.words.is_empty() {
            rng.below(u64::from(self.size)) as u32
        } else {
            self.words[rng.below(self.words.len() as u64) as usize]
        }
    }
}

/// Letters, optionally after a byte-level (`Ġ`) or sentencepiece (`▁`) space marker.
fn is_word(piece: &str) -> bool {
    let rest = piece
        .strip_prefix('Ġ')
        .or_else(|| piece.strip_prefix('▁'))
        .unwrap_or(piece);
    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bpe_vocab_and_specials() {
        let doc = serde_json::json!({
            "model": {"vocab": {"Ġhello": 0, "Ġworld": 1, "!!": 2, "x": 3}},
            "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": true}]
        });
        let v = Vocab::from_tokenizer_json(&doc).expect("valid");
        assert_eq!(v.size(), 5);
        assert_eq!(v.eos(), Some(4));
        let mut rng = Rng::new(3);
        for _ in 0..100 {
            assert!([0, 1, 3].contains(&v.draw(&mut rng)));
        }
    }

    #[test]
    fn reads_unigram_vocab() {
        let doc = serde_json::json!({"model": {"vocab": [["<unk>", 0.0], ["▁the", -1.0], ["▁cat", -2.0]]}});
        let v = Vocab::from_tokenizer_json(&doc).expect("valid");
        assert_eq!(v.size(), 3);
    }
}
