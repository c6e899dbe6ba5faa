#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnpike_tools::model::{MakeOptions, preset, write_model};

use super::*;

/// The `tiny` model's folder, its grammar compiler, and its end-of-sequence ids.
fn tiny() -> (tempfile::TempDir, Grammars, Vec<u32>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let tiny = preset("tiny").unwrap();
    let options = MakeOptions {
        seed: 1,
        dtype: None,
        shard_bytes: None,
    };
    write_model(&tiny, dir.path(), options).unwrap();
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let eos: Vec<u32> = match &config["eos_token_id"] {
        Value::Array(ids) => ids.iter().map(|id| id.as_u64().unwrap() as u32).collect(),
        id => vec![id.as_u64().unwrap() as u32],
    };
    let grammars = Grammars::new(&dir.path().join("tokenizer.json"), vocab, &eos);
    (dir, grammars, eos, vocab)
}

/// Decodes under `constraint` with pseudo-random logits until it allows only end-of-sequence
/// (or `limit` tokens); the tokens' bytes.
fn decode(
    grammars: &Grammars,
    mut c: Constraint,
    eos: &[u32],
    vocab: usize,
    limit: usize,
) -> Vec<u8> {
    let trie = grammars
        .compiler()
        .unwrap()
        .factory
        .tok_env()
        .tok_trie()
        .clone();
    let mut out = Vec::new();
    let mut state = 12345u64;
    for _ in 0..limit {
        let mut logits: Vec<f32> = (0..vocab)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect();
        c.mask(&mut logits).unwrap();
        let (best, _) = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap();
        let token = best as u32;
        c.advance(token).unwrap();
        if eos.contains(&token) {
            return out;
        }
        out.extend(trie.decode(&[token]));
    }
    panic!(
        "no end after {limit} tokens: {}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn every_sampled_token_stays_in_the_grammar_until_only_the_end_is_left() {
    let (_dir, grammars, eos, vocab) = tiny();
    let regex = Grammar::Regex {
        pattern: "(yes|no) [0-9]{2}".into(),
    };
    let text = decode(
        &grammars,
        grammars.constraint(&regex).unwrap(),
        &eos,
        vocab,
        64,
    );
    let text = String::from_utf8(text).unwrap();
    assert!(
        (text.starts_with("yes ") || text.starts_with("no "))
            && text.len() - text.find(' ').unwrap() == 3,
        "{text:?}"
    );
    let schema = Grammar::JsonSchema {
        schema: json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                       "required": ["n"], "additionalProperties": false}),
    };
    let text = decode(
        &grammars,
        grammars.constraint(&schema).unwrap(),
        &eos,
        vocab,
        64,
    );
    let value: Value = serde_json::from_slice(&text).unwrap();
    assert!(value["n"].as_u64().is_some_and(|n| n <= 9), "{value}");
}

#[test]
fn a_repeated_grammar_is_compiled_once_and_forks_are_independent() {
    let (_dir, grammars, eos, vocab) = tiny();
    let g = Grammar::Regex {
        pattern: "[ab]{3}".into(),
    };
    let first = grammars.constraint(&g).unwrap();
    let fork = first.fork();
    let _again = grammars.constraint(&g).unwrap();
    assert_eq!(grammars.counts(), (1, 1, 1));
    // Both copies reach the end on their own.
    assert_eq!(decode(&grammars, first, &eos, vocab, 16).len(), 3);
    assert_eq!(decode(&grammars, fork, &eos, vocab, 16).len(), 3);
}

#[test]
fn what_does_not_compile_is_a_reason_not_a_panic() {
    let (_dir, grammars, _, _) = tiny();
    for (grammar, words) in [
        (
            Grammar::JsonSchema {
                schema: json!({"type": "string", "format": "no-such-format"}),
            },
            "format",
        ),
        (
            Grammar::Lark {
                grammar: "start: missing".into(),
            },
            "missing",
        ),
        (
            Grammar::Regex {
                pattern: "(unclosed".into(),
            },
            "",
        ),
    ] {
        let why = grammars.constraint(&grammar).unwrap_err();
        assert!(
            why.to_string().contains(words) && matches!(why, GrammarError::Invalid(_)),
            "{why}"
        );
    }
}

#[test]
fn a_grammar_left_with_nothing_allowed_is_an_error() {
    let (_dir, grammars, _, vocab) = tiny();
    let c = grammars
        .constraint(&Grammar::Regex {
            pattern: "a".into(),
        })
        .unwrap();
    let mut logits = vec![0.0; vocab];
    c.fork().mask(&mut logits).unwrap();
    assert!(logits.iter().any(|l| l.is_finite()));
    // The first ids (the tokenizer's special tokens) are not allowed: a row holding only them
    // leaves nothing to sample, and the constraint says so rather than let one be picked.
    assert!(logits[..3].iter().all(|l| l.is_infinite()));
    let why = c.fork().mask(&mut [0.0; 3]).unwrap_err();
    assert!(why.contains("allows no token"), "{why}");
}

#[test]
fn the_allowed_set_reads_as_ids_and_single_tokens_are_found() {
    let (_dir, grammars, _, vocab) = tiny();
    let mut c = grammars
        .constraint(&Grammar::Regex {
            pattern: "[0-9]".into(),
        })
        .unwrap();
    let allowed = c.allowed().unwrap();
    let digits: Vec<u32> = (b'0'..=b'9')
        .map(|d| grammars.token_of(&[d]).unwrap())
        .collect();
    assert!(digits.iter().all(|&d| allowed.contains(d)));
    assert_eq!(allowed.count(), allowed.ids().count());
    assert!(allowed.ids().all(|id| (id as usize) < vocab));
    assert!(!c.is_accepting());
    c.advance(digits[3]).unwrap();
    assert!(c.is_accepting());
}

#[test]
fn forced_text_is_fast_forwarded_in_the_models_own_tokens() {
    let (_dir, grammars, eos, _) = tiny();
    let schema = Grammar::JsonSchema {
        schema: json!({"type": "object", "properties": {"colour_name": {"enum": ["crimson red"]}},
                       "required": ["colour_name"], "additionalProperties": false}),
    };
    let mut c = grammars.constraint(&schema).unwrap();
    let forced = c.fast_forward(64).unwrap();
    let text: Vec<u8> = forced
        .iter()
        .flat_map(|&t| grammars.token_bytes(t).to_vec())
        .collect();
    assert_eq!(
        String::from_utf8(text).unwrap(),
        r#"{"colour_name":"crimson red"}"#
    );
    // The tokenizer's own split, not merely the longest tokens.
    let tokenizer = tokenizers::Tokenizer::from_file(&grammars.tokenizer).unwrap();
    let own = tokenizer
        .encode(r#"{"colour_name":"crimson red"}"#, false)
        .unwrap();
    assert_eq!(forced, own.get_ids());
    let allowed = c.allowed().unwrap();
    assert_eq!(allowed.ids().collect::<Vec<_>>(), eos);
    // A limit stops it short; a choice forces nothing.
    let mut short = grammars.constraint(&schema).unwrap();
    assert_eq!(short.fast_forward(2).unwrap(), forced[..2].to_vec());
    let mut free = grammars
        .constraint(&Grammar::Regex {
            pattern: "(yes|no)".into(),
        })
        .unwrap();
    assert!(free.fast_forward(8).unwrap().is_empty());
}
