//! Tokenizing with a budget: a prompt that cannot fit the model is refused after a bounded
//! amount of work, not after tokenizing megabytes of it.
//!
//! A body under the size limit can still hold millions of tokens; tokenizing it whole costs
//! seconds of a core and hundreds of megabytes (the tokenizer keeps strings and offsets per
//! token) only to answer 400. So text longer than [`WHOLE`] bytes, and longer than
//! [`BYTES_PER_TOKEN`] bytes per token of the budget (more than a prompt that fits usually
//! holds), is first counted in pieces of about [`PIECE`] bytes, cut before whitespace, and the
//! count stops as soon as it passes the budget (plus a margin for the few tokens a cut can add
//! or save): at most about `budget` tokens' worth of text is ever tokenized for a prompt that is
//! refused. Text that fits is then tokenized whole, so the ids are exactly what the tokenizer
//! gives; a prompt that fits is tokenized twice only when its tokens are unusually long.

use crate::text::tokenizer::TextTokenizer;

/// Text up to this many bytes is tokenized whole at once.
pub(crate) const WHOLE: usize = 64 * 1024;

/// Pieces of longer text are about this long.
pub(crate) const PIECE: usize = 16 * 1024;

/// Text of more bytes than this per token of the budget is counted in pieces first (English
/// prose and code average about four bytes a token).
pub(crate) const BYTES_PER_TOKEN: usize = 4;

/// Why text was not tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BudgetError {
    /// It holds more than `budget` tokens (counted up to `counted` before stopping).
    #[error("the text holds more than {budget} tokens")]
    OverBudget {
        /// The budget.
        budget: usize,
        /// Tokens counted when the count stopped.
        counted: usize,
    },
    /// The tokenizer failed.
    #[error("{0}")]
    Tokenizer(String),
}

/// The ids of `text`, exactly as [`TextTokenizer::encode`] gives them, or
/// [`BudgetError::OverBudget`] when it holds clearly more than `budget` tokens. Short text is
/// always tokenized (the caller compares its length with the limit, and says it exactly).
pub(crate) fn encode_within(
    tokenizer: &TextTokenizer,
    text: &str,
    add_special: bool,
    budget: usize,
) -> Result<Vec<u32>, BudgetError> {
    if text.len() > WHOLE.max(budget.saturating_mul(BYTES_PER_TOKEN)) {
        count_within(tokenizer, text, budget)?;
    }
    tokenizer
        .encode(text, add_special)
        .map_err(BudgetError::Tokenizer)
}

/// The tokens of `text` counted piece by piece, or [`BudgetError::OverBudget`] as soon as the
/// count is clearly past `budget`.
fn count_within(
    tokenizer: &TextTokenizer,
    text: &str,
    budget: usize,
) -> Result<usize, BudgetError> {
    // A cut can split what would have been one token, or add a leading-space marker: a few
    // tokens per cut at most, far inside this margin near the budget.
    let most = budget + budget / 8 + 64;
    let mut counted = 0;
    for piece in pieces(text, PIECE) {
        counted += tokenizer
            .encode(piece, false)
            .map_err(BudgetError::Tokenizer)?
            .len();
        if counted > most {
            return Err(BudgetError::OverBudget { budget, counted });
        }
    }
    Ok(counted)
}

/// `text` in pieces of about `size` bytes, each cut just before an ASCII whitespace where
/// there is one in its second half, else at a character boundary.
fn pieces(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= size {
            return Some(std::mem::take(&mut rest));
        }
        let mut cut = size;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        // An ASCII whitespace is a character boundary too; `size` is far above a character's
        // four bytes, so every piece is non-empty.
        let window = &rest.as_bytes()[size / 2..cut];
        if let Some(space) = window.iter().rposition(u8::is_ascii_whitespace) {
            cut = size / 2 + space;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sim() -> TextTokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/models/sim-small/tokenizer.json");
        TextTokenizer::from_file(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn pieces_cover_the_text_and_cut_before_whitespace() {
        let text = "word ".repeat(10_000) + &"ü".repeat(20_000);
        let parts: Vec<&str> = pieces(&text, 1000).collect();
        assert_eq!(parts.concat(), text);
        assert!(parts.iter().all(|p| p.len() <= 1000));
        assert!(parts[1].starts_with(' '), "{:?}", &parts[1][..10]);
    }

    #[test]
    fn text_that_fits_is_tokenized_exactly_and_long_text_is_refused_early() {
        let t = sim();
        let fits = "The river moved slowly under the old bridge. ".repeat(2_000);
        let exact = t.encode(&fits, true).unwrap_or_default();
        assert!(fits.len() > WHOLE);
        // Counted in pieces, text that fits is not refused, and the count is close.
        let counted = count_within(&t, &fits, exact.len());
        assert!(
            counted.as_ref().is_ok_and(|n| n.abs_diff(exact.len()) < 16),
            "{counted:?}"
        );
        assert_eq!(
            encode_within(&t, &fits, true, exact.len()),
            Ok(exact.clone())
        );
        let huge = fits.repeat(40);
        match encode_within(&t, &huge, true, exact.len()) {
            Err(BudgetError::OverBudget { counted, .. }) => {
                // Stopped within about one piece past the budget, not at the 40x total.
                assert!(counted < exact.len() * 2, "{counted}");
            }
            other => panic!("{:?}", other.map(|ids| ids.len())),
        }
        // Short text is tokenized and left to the caller's exact check.
        let short = t.encode("hello there", false).unwrap_or_default();
        assert!(short.len() > 1);
        assert_eq!(encode_within(&t, "hello there", false, 1), Ok(short));
    }
}
