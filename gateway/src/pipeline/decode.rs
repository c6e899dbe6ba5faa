//! Incremental detokenization: text for each new token, never a split UTF-8 character.
//!
//! Decoding token by token breaks byte-level tokens that hold part of a character, and tokenizers
//! whose decoders depend on neighbours (sentencepiece's leading space). So this decodes a short
//! window: the text of `ids[prefix..]` minus the text of `ids[prefix..read]` is what the new
//! tokens add, held back while it ends in an incomplete character (the replacement character).

use std::sync::Arc;

use super::tokenizer::TextTokenizer;

/// Per-choice decoder state.
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Arc<TextTokenizer>,
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    /// A decoder that leaves special tokens out of the text when `skip_special`.
    pub fn new(tokenizer: Arc<TextTokenizer>, skip_special: bool) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            skip_special,
        }
    }

    fn text(&self, ids: &[u32]) -> String {
        self.tokenizer
            .decode(ids, self.skip_special)
            .unwrap_or_default()
    }

    /// The text `id` completes (possibly empty while a character is incomplete).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let before = self.text(&self.ids[self.prefix..self.read]);
        let after = self.text(&self.ids[self.prefix..]);
        if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
            return String::new();
        }
        let new = match after.strip_prefix(&before) {
            Some(rest) => rest.to_string(),
            // The decoder rewrote earlier text (rare): emit the part past the old length that
            // begins on a character boundary.
            None => after.get(before.len()..).unwrap_or("").to_string(),
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        // Keep the window short: only ids from `prefix` on are ever decoded again.
        if self.prefix > 64 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
        new
    }

    /// Whatever is still held back, at the end of the stream.
    pub fn flush(&mut self) -> String {
        let before = self.text(&self.ids[self.prefix..self.read]);
        let after = self.text(&self.ids[self.prefix..]);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        after.get(before.len()..).unwrap_or("").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> Arc<TextTokenizer> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/models/sim-small/tokenizer.json");
        Arc::new(TextTokenizer::from_file(&path).expect("loads"))
    }

    #[test]
    fn streams_text_without_splitting_characters() {
        let t = sim();
        let text = "The café sold 🙂 and 日本 tea, slowly. ".repeat(20);
        let ids = t.encode(&text, false).expect("encode");
        let mut d = IncrementalDecoder::new(Arc::clone(&t), true);
        let mut out = String::new();
        for id in ids {
            let piece = d.push(id);
            assert!(
                !piece.contains('\u{FFFD}'),
                "a split character in {piece:?}"
            );
            out.push_str(&piece);
        }
        out.push_str(&d.flush());
        assert_eq!(out, text);
    }

    #[test]
    fn special_tokens_are_skipped_or_kept() {
        let t = sim();
        let eot = t.token_to_id("<|eot_id|>").expect("eot");
        let mut skip = IncrementalDecoder::new(Arc::clone(&t), true);
        let mut keep = IncrementalDecoder::new(Arc::clone(&t), false);
        let ids = t.encode("Hi", false).expect("encode");
        let (mut a, mut b) = (String::new(), String::new());
        for &id in ids.iter().chain([eot].iter()) {
            a.push_str(&skip.push(id));
            b.push_str(&keep.push(id));
        }
        assert_eq!(a, "Hi");
        assert_eq!(b, "Hi<|eot_id|>");
    }
}
