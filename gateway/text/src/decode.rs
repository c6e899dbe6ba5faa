//! Incremental detokenization: text for each new token, never a split UTF-8 character.
//!
//! Two ways, one result:
//! - byte-level tokenizers decode by byte concatenation, so a token's bytes (precomputed by the
//!   tokenizer) are appended to a buffer and its longest complete UTF-8 prefix is sent; no
//!   tokenizer call per token;
//! - other tokenizers (sentencepiece's leading spaces depend on neighbours) decode a short window:
//!   the text of `ids[prefix..]` minus the text of `ids[prefix..read]` is what the new tokens
//!   add, held back while it ends in an incomplete character.

use std::sync::Arc;

use super::tokenizer::TextTokenizer;

#[derive(Debug)]
enum Mode {
    Bytes {
        pending: Vec<u8>,
    },
    Window {
        ids: Vec<u32>,
        prefix: usize,
        read: usize,
    },
}

/// Per-choice decoder state.
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Arc<TextTokenizer>,
    mode: Mode,
    skip_special: bool,
}

impl IncrementalDecoder {
    /// A decoder that leaves special tokens out of the text when `skip_special`.
    pub fn new(tokenizer: Arc<TextTokenizer>, skip_special: bool) -> Self {
        let mode = if tokenizer.is_byte_level() {
            Mode::Bytes {
                pending: Vec::new(),
            }
        } else {
            Mode::Window {
                ids: Vec::new(),
                prefix: 0,
                read: 0,
            }
        };
        Self {
            tokenizer,
            mode,
            skip_special,
        }
    }

    /// The text `id` completes (possibly empty while a character is incomplete).
    pub fn push(&mut self, id: u32) -> String {
        let Self {
            tokenizer,
            mode,
            skip_special,
        } = self;
        let text = |ids: &[u32]| tokenizer.decode(ids, *skip_special).unwrap_or_default();
        match mode {
            Mode::Bytes { pending } => {
                pending
                    .extend_from_slice(tokenizer.fast_bytes(id, *skip_special).unwrap_or_default());
                complete_utf8(pending)
            }
            Mode::Window { ids, prefix, read } => {
                ids.push(id);
                let before = text(&ids[*prefix..*read]);
                let after = text(&ids[*prefix..]);
                if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
                    return String::new();
                }
                let new = match after.strip_prefix(&before) {
                    Some(rest) => rest.to_string(),
                    // The decoder rewrote earlier text (rare): emit what lies past the old length.
                    None => after.get(before.len()..).unwrap_or("").to_string(),
                };
                *prefix = *read;
                *read = ids.len();
                // Keep the window short: only ids from `prefix` on are ever decoded again.
                if *prefix > 64 {
                    ids.drain(..*prefix);
                    *read -= *prefix;
                    *prefix = 0;
                }
                new
            }
        }
    }

    /// Whatever is still held back, at the end of the stream.
    pub fn flush(&mut self) -> String {
        let Self {
            tokenizer,
            mode,
            skip_special,
        } = self;
        match mode {
            Mode::Bytes { pending } => {
                let text = String::from_utf8_lossy(pending).into_owned();
                pending.clear();
                text
            }
            Mode::Window { ids, prefix, read } => {
                let before = tokenizer
                    .decode(&ids[*prefix..*read], *skip_special)
                    .unwrap_or_default();
                let after = tokenizer
                    .decode(&ids[*prefix..], *skip_special)
                    .unwrap_or_default();
                ids.clear();
                (*prefix, *read) = (0, 0);
                after.get(before.len()..).unwrap_or("").to_string()
            }
        }
    }
}

/// Takes the longest prefix of `pending` that is complete UTF-8 (invalid sequences become the
/// replacement character, as a lossy decode would write them); leaves an incomplete tail.
fn complete_utf8(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(pending) {
            Ok(text) => {
                out.push_str(text);
                pending.clear();
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // The first `valid` bytes were just checked to be UTF-8.
                out.push_str(std::str::from_utf8(&pending[..valid]).unwrap_or_default());
                match e.error_len() {
                    None => {
                        pending.drain(..valid);
                        return out; // an incomplete character: wait for the next token
                    }
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        pending.drain(..valid + bad);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> Arc<TextTokenizer> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/models/sim-small/tokenizer.json");
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

    #[test]
    fn invalid_bytes_become_replacement_characters_and_tails_wait() {
        let mut pending = vec![b'a', 0xFF, b'b', 0xE6, 0x97];
        assert_eq!(complete_utf8(&mut pending), "a\u{FFFD}b");
        assert_eq!(pending, vec![0xE6, 0x97]);
        pending.push(0xA5);
        assert_eq!(complete_utf8(&mut pending), "日");
        assert!(pending.is_empty());
    }
}
