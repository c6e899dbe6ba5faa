//! What `redact` looks for: one regular expression of alternatives, each a kind.

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

/// The built-in kinds and their patterns, each bounded in length (at most 86 characters).
const BUILT_IN: [(&str, &str, &str); 4] = [
    (
        "api_keys",
        "api_key",
        r"\b(?:(?:sk|pk|rk)[-_](?:(?:live|test|proj)[-_])?[A-Za-z0-9]{16,64}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,40}|xox[abpr]-[A-Za-z0-9-]{10,60}|tp-[0-9a-f]{12}-[A-Za-z0-9_-]{43})\b",
    ),
    (
        "emails",
        "email",
        r"\b[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9.-]{1,40}\.[A-Za-z]{2,12}\b",
    ),
    ("cards", "card", r"\b\d(?:[ -]?\d){12,18}\b"),
    (
        "phones",
        "phone",
        r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{3}\)|\b\d{3})[ .-]?\d{3}[ .-]\d{4}\b",
    ),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRules {
    #[serde(default = "yes")]
    api_keys: bool,
    #[serde(default = "yes")]
    emails: bool,
    #[serde(default = "yes")]
    phones: bool,
    #[serde(default = "yes")]
    cards: bool,
    #[serde(default)]
    replacement: Option<String>,
    #[serde(default)]
    hold_chars: Option<usize>,
    #[serde(default)]
    custom: Vec<RawCustom>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCustom {
    name: String,
    pattern: String,
}

/// The compiled rules.
#[derive(Debug)]
pub struct Rules {
    regex: Option<Regex>,
    /// Each rule's capture group and kind, in order.
    groups: Vec<(usize, String)>,
    replacement: String,
    hold_chars: usize,
}

/// Whether a run of digits (with spaces or dashes) passes the Luhn check.
fn luhn(text: &str) -> bool {
    let digits: Vec<u32> = text.chars().filter_map(|c| c.to_digit(10)).collect();
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| match (i % 2 == 1, d * 2) {
            (true, doubled) if doubled > 9 => doubled - 9,
            (true, doubled) => doubled,
            (false, _) => d,
        })
        .sum();
    digits.len() >= 13 && sum.is_multiple_of(10)
}

impl Rules {
    /// Rules from the plugin's configuration.
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let raw: RawRules =
            serde_json::from_value(config.clone()).map_err(|e| format!("redact: {e}"))?;
        let enabled = [raw.api_keys, raw.emails, raw.cards, raw.phones];
        let mut rules: Vec<(String, String)> = BUILT_IN
            .iter()
            .zip(enabled)
            .filter(|(_, on)| *on)
            .map(|((_, kind, pattern), _)| ((*kind).to_string(), (*pattern).to_string()))
            .collect();
        for custom in &raw.custom {
            rules.push((custom.name.clone(), custom.pattern.clone()));
        }
        // Each rule is one capture group; a custom pattern's own groups come after its group.
        let mut groups = Vec::new();
        let mut next = 1;
        for (kind, pattern) in &rules {
            let inner = Regex::new(pattern)
                .map_err(|e| format!("redact: pattern of `{kind}`: {e}"))?
                .captures_len()
                - 1;
            groups.push((next, kind.clone()));
            next += 1 + inner;
        }
        let alternatives: Vec<String> = rules.iter().map(|(_, p)| format!("({p})")).collect();
        let regex = if alternatives.is_empty() {
            None
        } else {
            Some(Regex::new(&alternatives.join("|")).map_err(|e| format!("redact: {e}"))?)
        };
        let hold_chars = raw.hold_chars.unwrap_or(96);
        if hold_chars < 90 {
            return Err(
                "redact: hold_chars must be at least 90 (the longest built-in match)".into(),
            );
        }
        Ok(Self {
            regex,
            groups,
            replacement: raw
                .replacement
                .unwrap_or_else(|| "[redacted {kind}]".into()),
            hold_chars,
        })
    }

    /// Characters held back from a stream.
    pub fn hold_chars(&self) -> usize {
        self.hold_chars
    }

    /// The first match at or after `at`: its span and its replacement (`None`: keep it, a
    /// number that fails the Luhn check).
    pub fn find_at(&self, haystack: &str, at: usize) -> Option<(usize, usize, Option<String>)> {
        let captures = self.regex.as_ref()?.captures_at(haystack, at)?;
        let whole = captures.get(0)?;
        let kind = self
            .groups
            .iter()
            .find(|(group, _)| captures.get(*group).is_some())
            .map_or("", |(_, kind)| kind.as_str());
        let replacement = (kind != "card" || luhn(whole.as_str()))
            .then(|| self.replacement.replace("{kind}", kind));
        Some((whole.start(), whole.end(), replacement))
    }
}

#[cfg(test)]
mod tests {
    use super::luhn;

    #[test]
    fn luhn_accepts_valid_numbers_only() {
        assert!(luhn("4111 1111 1111 1111"));
        assert!(luhn("5500-0000-0000-0004"));
        assert!(!luhn("4111 1111 1111 1112"));
        assert!(!luhn("1234"));
    }
}
