//! A server tool's answer as the model is shown it: at most a budget of the model's tokens
//! (`tool_result_tokens` of the tool's plugin), the rest cut and the answer saying so, so a
//! tool that answers megabytes costs the conversation a bounded share of its context instead
//! of failing the request. Only a window of the text a little longer than the budget can fill
//! is tokenized, however long the answer.

use crate::text::tokenizer::TextTokenizer;

/// The most bytes one token is taken to hold, for the window that is tokenized.
const BYTES_PER_TOKEN: usize = 16;

/// `text` cut to at most `budget` tokens of `tokenizer`, with a note of what was left out.
pub(crate) fn bounded(text: String, budget: usize, tokenizer: &TextTokenizer) -> String {
    // No token holds less than a byte.
    if text.len() <= budget {
        return text;
    }
    let window = prefix(&text, budget.saturating_mul(BYTES_PER_TOKEN));
    let Ok(ids) = tokenizer.encode(window, false) else {
        return cut(prefix(&text, budget), text.len(), budget);
    };
    if ids.len() <= budget && window.len() == text.len() {
        return text;
    }
    let kept = tokenizer
        .decode(&ids[..budget.min(ids.len())], false)
        .unwrap_or_else(|_| prefix(&text, budget).to_string());
    cut(&kept, text.len(), budget)
}

fn cut(kept: &str, total: usize, budget: usize) -> String {
    format!(
        "{kept}\n[The tool's answer was cut: it held {total} bytes; only its first {budget} tokens are shown.]"
    )
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a character boundary.
fn prefix(text: &str, bytes: usize) -> &str {
    if bytes >= text.len() {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> TextTokenizer {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/models/sim-small/tokenizer.json");
        TextTokenizer::from_file(&folder).unwrap()
    }

    #[test]
    fn a_short_answer_is_kept_whole_and_a_long_one_is_cut_to_the_budget() {
        let t = tokenizer();
        assert_eq!(bounded("a short answer".into(), 64, &t), "a short answer");
        let long = "the quick brown fox jumps over the lazy dog. ".repeat(200_000);
        let shown = bounded(long.clone(), 100, &t);
        let body = shown.split("\n[The tool's answer was cut").next().unwrap();
        assert!(t.encode(body, false).unwrap().len() <= 100);
        assert!(shown.contains(&format!(
            "it held {} bytes; only its first 100 tokens",
            long.len()
        )));
        let fits = "word ".repeat(50);
        assert_eq!(bounded(fits.clone(), 200, &t), fits);
    }
}
