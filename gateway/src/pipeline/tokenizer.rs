//! A model's tokenizer (Hugging Face `tokenizer.json`), with what the gateway needs beyond
//! encode and decode: the raw bytes of single tokens, for log probabilities.

use std::path::Path;

use tokenizers::{DecoderWrapper, Tokenizer};

/// A loaded tokenizer.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// For byte-level BPE: the byte each alphabet character stands for.
    byte_of_char: Option<std::collections::HashMap<char, u8>>,
}

impl TextTokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let inner = Tokenizer::from_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self::new(inner))
    }

    /// Parses the text of a `tokenizer.json`.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let inner: Tokenizer = text.parse().map_err(|e: tokenizers::Error| e.to_string())?;
        Ok(Self::new(inner))
    }

    fn new(inner: Tokenizer) -> Self {
        let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let byte_of_char = byte_level.then(|| {
            bytes_to_unicode()
                .into_iter()
                .map(|(b, c)| (c, b))
                .collect()
        });
        Self {
            inner,
            byte_of_char,
        }
    }

    /// Token ids of `text`; with `add_special`, the tokenizer's own special tokens (such as a
    /// beginning-of-text token) are added as its post-processor says.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        self.inner
            .encode_fast(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// Text of `ids`; special tokens are left out when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| e.to_string())
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> u32 {
        self.inner.get_vocab_size(true) as u32
    }

    /// The id of a token given by its text.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The bytes one token stands for (a byte-level token may hold part of a character).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        if let Some(map) = &self.byte_of_char {
            if let Some(bytes) = piece
                .chars()
                .map(|c| map.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
            {
                return bytes;
            }
            return piece.into_bytes(); // an added token such as `<|eot_id|>`
        }
        if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>'))
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            return vec![byte]; // sentencepiece byte fallback
        }
        piece.replace('\u{2581}', " ").into_bytes()
    }
}

/// GPT-2's byte-level alphabet: each byte and the printable character that stands for it.
fn bytes_to_unicode() -> Vec<(u8, char)> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b, char::from(b))
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                (b, c)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> TextTokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/models/sim-small/tokenizer.json");
        TextTokenizer::from_file(&path).expect("the sim tokenizer loads")
    }

    #[test]
    fn round_trips_text_and_adds_the_bos_token() {
        let t = sim();
        let text = "Hello! The river moved slowly. Ünïcödé 🙂";
        let ids = t.encode(text, false).expect("encode");
        assert_eq!(t.decode(&ids, false).expect("decode"), text);
        let with_bos = t.encode(text, true).expect("encode");
        assert_eq!(
            with_bos[0],
            t.token_to_id("<|begin_of_text|>").expect("bos")
        );
        assert_eq!(&with_bos[1..], &ids[..]);
    }

    #[test]
    fn token_bytes_concatenate_to_the_text() {
        let t = sim();
        let text = "naïve café 🙂 under the bridge";
        let ids = t.encode(text, false).expect("encode");
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| t.token_bytes(id)).collect();
        assert_eq!(bytes, text.as_bytes());
        assert_eq!(t.token_bytes(4), b"<|eot_id|>");
    }
}
