//! `redact`: a Turnpike gateway plugin that replaces secrets and personal data in response text
//! before the client sees it: API keys and tokens, e-mail addresses, phone numbers, and card
//! numbers (only those that pass the Luhn check), plus any patterns the operator adds.
//!
//! It is a response transform. Streamed text is matched across pieces: the transform holds back
//! the last `hold_chars` characters (96 by default, longer than any built-in pattern can match)
//! and only sends text no later piece can change, so a secret split over two chunks is still
//! caught and a streamed answer is redacted exactly as the same answer not streamed. Every
//! pattern is bounded in length; an operator's own patterns must be too (no longer than
//! `hold_chars`), or their matches may depend on where chunks end.
//!
//! ```toml
//! [[plugins]]
//! library = "libturnpike_plugin_redact.so"
//! [plugins.config]
//! api_keys = true            # each kind on by default
//! emails = true
//! phones = true
//! cards = true
//! replacement = "[redacted {kind}]"
//! custom = [{ name = "employee_id", pattern = "\\bEMP-[0-9]{6}\\b" }]
//! ```

mod rules;

use std::sync::Arc;

use serde_json::Value;
use turnpike_plugin_api::export_gateway_plugin;
use turnpike_plugin_api::json::TransformContext;
use turnpike_plugin_api::plugin::{GatewayPlugin, Hooks, Host, Transform};

pub use rules::Rules;

/// The plugin.
#[derive(Debug)]
pub struct Redact {
    rules: Arc<Rules>,
}

impl GatewayPlugin for Redact {
    const HOOKS: Hooks = Hooks {
        guard: false,
        transform: true,
        tools: false,
    };

    fn create(config: &Value, _host: Host) -> Result<Self, String> {
        Ok(Self {
            rules: Arc::new(Rules::from_config(config)?),
        })
    }

    fn transform(&self, _context: &TransformContext) -> Result<Box<dyn Transform>, String> {
        Ok(Box::new(Redacting::new(Arc::clone(&self.rules))))
    }
}

export_gateway_plugin!(Redact, "redact");

/// Longest tail of sent text kept as context (for `\b` at the start of the next scan).
const CONTEXT_BYTES: usize = 16;

/// The transform of one output text.
#[derive(Debug)]
pub struct Redacting {
    rules: Arc<Rules>,
    /// Text received and not yet sent.
    pending: String,
    /// Its length in characters.
    pending_chars: usize,
    /// The end of the text sent, for the patterns' word boundaries.
    context: String,
}

impl Redacting {
    /// A transform under `rules`.
    pub fn new(rules: Arc<Rules>) -> Self {
        Self {
            rules,
            pending: String::new(),
            pending_chars: 0,
            context: String::new(),
        }
    }
}

/// The byte index `chars` characters before the end of `text` (0 when it is shorter).
fn chars_before_end(text: &str, chars: usize) -> usize {
    text.char_indices()
        .rev()
        .nth(chars.saturating_sub(1))
        .map_or(0, |(i, _)| if chars == 0 { text.len() } else { i })
}

impl Transform for Redacting {
    fn feed(&mut self, text: &str, last: bool) -> String {
        self.pending.push_str(text);
        self.pending_chars += text.chars().count();
        if !last && self.pending_chars <= self.rules.hold_chars() {
            // Nothing can be final yet: every character may still be part of a match.
            return String::new();
        }
        let offset = self.context.len();
        let haystack = format!("{}{}", self.context, self.pending);
        // Everything before `safe` is final: no later text can make a match that reaches it.
        let mut safe = if last {
            haystack.len()
        } else {
            offset.max(chars_before_end(&haystack, self.rules.hold_chars()))
        };
        let mut out = String::new();
        let mut at = offset;
        while at < safe {
            let Some((start, end, replacement)) = self.rules.find_at(&haystack, at) else {
                break;
            };
            if start >= safe {
                break;
            }
            if end > safe {
                // A match that runs past what is final waits for the next piece whole.
                safe = start;
                break;
            }
            out.push_str(&haystack[at..start]);
            match replacement {
                Some(text) => out.push_str(&text),
                None => out.push_str(&haystack[start..end]),
            }
            at = end;
        }
        if at < safe {
            out.push_str(&haystack[at..safe]);
        }
        let sent = &haystack[..safe];
        let keep_from = sent
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| sent.len() - i <= CONTEXT_BYTES)
            .unwrap_or(sent.len());
        self.context = sent[keep_from..].to_string();
        self.pending = haystack[safe..].to_string();
        self.pending_chars = self.pending.chars().count();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(pieces: &[&str]) -> String {
        let rules = Arc::new(Rules::from_config(&serde_json::json!({})).unwrap());
        let mut t = Redacting::new(rules);
        let mut out = String::new();
        for (i, p) in pieces.iter().enumerate() {
            out += &t.feed(p, i + 1 == pieces.len());
        }
        out
    }

    #[test]
    fn each_kind_is_redacted() {
        let text = "key sk-live-0123456789abcdefghijklmnop, mail jane.doe@example.com, call +1 (415) 555-0132, card 4111 1111 1111 1111, not a card 4111 1111 1111 1112.";
        let out = redact(&[text]);
        assert!(!out.contains("sk-live"), "{out}");
        assert!(!out.contains("jane.doe"), "{out}");
        assert!(!out.contains("555-0132"), "{out}");
        assert!(!out.contains("4111 1111 1111 1111"), "{out}");
        assert!(
            out.contains("4111 1111 1111 1112"),
            "a number failing Luhn stays: {out}"
        );
        assert!(out.contains("[redacted email]"), "{out}");
    }

    #[test]
    fn a_secret_split_over_pieces_is_redacted_as_if_whole() {
        let text = "Write to jane.doe@example.com and use tp-0123456789ab-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG now. ".repeat(3);
        let whole = redact(&[&text]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let by_char = redact(&chars.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(whole, by_char);
        for cut in [1, 7, 30, 95, 96, 97, 150] {
            let (a, b) = text.split_at(text.char_indices().nth(cut).map_or(text.len(), |(i, _)| i));
            assert_eq!(redact(&[a, b]), whole, "cut at {cut}");
        }
        assert!(!whole.contains("jane.doe") && !whole.contains("tp-0123"));
    }

    #[test]
    fn plain_text_passes_and_is_held_only_at_the_end() {
        let rules = Arc::new(Rules::from_config(&serde_json::json!({})).unwrap());
        let mut t = Redacting::new(rules);
        let long = "word ".repeat(100);
        let first = t.feed(&long, false);
        assert!(!first.is_empty() && first.len() < long.len());
        assert_eq!(first + &t.feed("", true), long);
    }
}
