//! One policy (the default, or a tenant's): its settings as written and compiled.

use regex::{Regex, RegexSet};
use serde::Deserialize;
use turnpike_plugin_api::json::GuardRequest;

/// A policy as written; a tenant's fields override the default's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    max_prompt_chars: Option<usize>,
    max_messages: Option<usize>,
    deny: Option<Vec<String>>,
    deny_regex: Option<Vec<String>>,
    rewrite: Option<Vec<RawRewrite>>,
    injection: Option<bool>,
    injection_threshold: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRewrite {
    pattern: String,
    replacement: String,
}

impl RawPolicy {
    /// `own` over `self`.
    pub(crate) fn under(&self, own: RawPolicy) -> RawPolicy {
        RawPolicy {
            max_prompt_chars: own.max_prompt_chars.or(self.max_prompt_chars),
            max_messages: own.max_messages.or(self.max_messages),
            deny: own.deny.or_else(|| self.deny.clone()),
            deny_regex: own.deny_regex.or_else(|| self.deny_regex.clone()),
            rewrite: own.rewrite.or_else(|| self.rewrite.clone()),
            injection: own.injection.or(self.injection),
            injection_threshold: own.injection_threshold.or(self.injection_threshold),
        }
    }
}

/// A compiled policy.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) max_prompt_chars: Option<usize>,
    pub(crate) max_messages: Option<usize>,
    /// Deny words and deny patterns, and each one's name for refusals.
    deny: Option<RegexSet>,
    deny_names: Vec<String>,
    rewrites: Vec<(Regex, String)>,
    /// Phrases needed to refuse as an injection (0: the heuristic is off).
    pub(crate) injection_threshold: usize,
}

impl Policy {
    pub(crate) fn compile(raw: &RawPolicy) -> Result<Self, String> {
        let mut patterns = Vec::new();
        let mut names = Vec::new();
        for (i, word) in raw.deny.iter().flatten().enumerate() {
            if word.trim().is_empty() {
                return Err(format!("deny[{i}] is empty"));
            }
            patterns.push(format!(r"(?i)\b{}\b", regex::escape(word.trim())));
            names.push(format!("deny[{i}]"));
        }
        for (i, pattern) in raw.deny_regex.iter().flatten().enumerate() {
            Regex::new(pattern).map_err(|e| format!("deny_regex[{i}]: {e}"))?;
            patterns.push(pattern.clone());
            names.push(format!("deny_regex[{i}]"));
        }
        let deny = if patterns.is_empty() {
            None
        } else {
            Some(RegexSet::new(&patterns).map_err(|e| e.to_string())?)
        };
        let rewrites = raw
            .rewrite
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| {
                Regex::new(&r.pattern)
                    .map(|re| (re, r.replacement.clone()))
                    .map_err(|e| format!("rewrite[{i}]: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let injection_threshold = if raw.injection.unwrap_or(true) {
            raw.injection_threshold.unwrap_or(1).max(1)
        } else {
            0
        };
        Ok(Self {
            max_prompt_chars: raw.max_prompt_chars,
            max_messages: raw.max_messages,
            deny,
            deny_names: names,
            rewrites,
            injection_threshold,
        })
    }

    /// The first deny rule `text` breaks.
    pub(crate) fn denied(&self, text: &str) -> Option<&str> {
        let set = self.deny.as_ref()?;
        let first = set.matches(text).into_iter().next()?;
        self.deny_names.get(first).map(String::as_str)
    }

    /// `request` with the rewrites applied to every text, if any changed.
    pub(crate) fn rewrite(&self, request: &GuardRequest) -> Option<GuardRequest> {
        if self.rewrites.is_empty() {
            return None;
        }
        let apply = |text: &str| {
            self.rewrites
                .iter()
                .fold(text.to_string(), |t, (re, with)| {
                    re.replace_all(&t, with.as_str()).into_owned()
                })
        };
        let mut out = request.clone();
        for message in out.messages.iter_mut().flatten() {
            if let Some(content) = &message.content {
                message.content = Some(apply(content));
            }
        }
        for prompt in out.prompt.iter_mut().flatten() {
            *prompt = apply(prompt);
        }
        (out != *request).then_some(out)
    }
}

/// Phrases that try to override a model's instructions.
static INJECTION: std::sync::LazyLock<RegexSet> = std::sync::LazyLock::new(|| {
    let phrases = [
        r"(?i)\b(ignore|disregard|forget)\b.{0,20}\b(all|any|the|your|previous|prior|above|earlier)\b.{0,20}\b(instructions|rules|prompts?|directions)\b",
        r"(?i)\b(reveal|print|show|repeat|leak)\b.{0,20}\b(system|hidden|initial)\s+(prompt|instructions|message)\b",
        r"(?i)\byou are now\b.{0,30}\b(DAN|jailbroken|unrestricted|developer mode)\b",
        r"(?i)\b(enable|enter|activate)\b.{0,10}\b(developer|god|jailbreak)\s+mode\b",
        r"(?i)\bpretend\b.{0,30}\b(no|without)\b.{0,10}\b(rules|restrictions|guidelines)\b",
    ];
    RegexSet::new(phrases).unwrap_or_else(|_| RegexSet::empty())
});

/// How many injection phrases `text` holds.
pub(crate) fn injection_hits(text: &str) -> usize {
    INJECTION.matches(text).iter().count()
}
