//! A model's tokenizer (Hugging Face `tokenizer.json`), with what the gateway needs beyond
//! encode and decode: the bytes of single tokens, for log probabilities and for fast incremental
//! decoding.
//!
//! For byte-level BPE tokenizers (GPT-2 style: Llama 3, Qwen, ...), decoding is byte
//! concatenation, so each token's bytes are computed once at load into a flat table, and
//! [`super::decode`] streams text from it without calling the tokenizer per token.

use std::path::Path;

use tokenizers::{DecoderWrapper, Tokenizer};

/// Every token's bytes, flat: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
#[derive(Debug)]
struct ByteTable {
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    special: Vec<bool>,
}

impl ByteTable {
    fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.bytes.get(start as usize..end as usize)
    }
}

/// A loaded tokenizer.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Present for byte-level BPE tokenizers.
    table: Option<ByteTable>,
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
        let table = byte_level.then(|| byte_table(&inner));
        Self { inner, table }
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

    /// Whether decoding is byte concatenation (then [`Self::fast_bytes`] serves every token).
    pub fn is_byte_level(&self) -> bool {
        self.table.is_some()
    }

    /// For byte-level tokenizers: the bytes `id` adds to decoded text (none for a special token
    /// when `skip_special`).
    pub fn fast_bytes(&self, id: u32, skip_special: bool) -> Option<&[u8]> {
        let table = self.table.as_ref()?;
        if skip_special && table.special.get(id as usize).copied().unwrap_or(false) {
            return Some(&[]);
        }
        table.get(id)
    }

    /// The bytes one token stands for (a byte-level token may hold part of a character).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if let Some(bytes) = self.fast_bytes(id, false) {
            return bytes.to_vec();
        }
        let Some(piece) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
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

fn byte_table(inner: &Tokenizer) -> ByteTable {
    let byte_of_char: std::collections::HashMap<char, u8> = bytes_to_unicode()
        .into_iter()
        .map(|(b, c)| (c, b))
        .collect();
    let added = inner.get_added_tokens_decoder();
    let size = inner.get_vocab_size(true);
    let mut table = ByteTable {
        bytes: Vec::new(),
        offsets: Vec::with_capacity(size + 1),
        special: vec![false; size],
    };
    table.offsets.push(0);
    for id in 0..size as u32 {
        if let Some(token) = added.get(&id) {
            // Added tokens decode to their content as written.
            table.bytes.extend_from_slice(token.content.as_bytes());
            table.special[id as usize] = token.special;
        } else if let Some(piece) = inner.id_to_token(id) {
            match piece
                .chars()
                .map(|c| byte_of_char.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
            {
                Some(bytes) => table.bytes.extend_from_slice(&bytes),
                None => table.bytes.extend_from_slice(piece.as_bytes()),
            }
        }
        table.offsets.push(table.bytes.len() as u32);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> TextTokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/models/sim-small/tokenizer.json");
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
    fn token_bytes_concatenate_to_what_the_tokenizer_decodes() {
        let t = sim();
        assert!(t.is_byte_level());
        let text = "naïve café 🙂 under the bridge<|eot_id|> and more";
        let ids = t.encode(text, false).expect("encode");
        for skip in [false, true] {
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&id| t.fast_bytes(id, skip).expect("byte-level").to_vec())
                .collect();
            assert_eq!(
                String::from_utf8(bytes).expect("utf8"),
                t.decode(&ids, skip).expect("decode"),
                "skip {skip}"
            );
        }
        assert_eq!(t.token_bytes(4), b"<|eot_id|>");
    }
}
