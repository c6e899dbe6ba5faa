//! Reasoning text: a reasoning model opens its answer with a start marker (`<think>` by
//! default), reasons, closes with an end marker, then answers. [`ReasoningSplitter`] splits a
//! choice's text stream into the reasoning and the answer, holding back text that may be the
//! start of a marker split across tokens. Output that does not open with the start marker is
//! all answer.

use serde::Deserialize;

/// A model's reasoning markers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningMarkers {
    /// Opens the reasoning.
    #[serde(default = "default_start")]
    pub start: String,
    /// Closes it.
    #[serde(default = "default_end")]
    pub end: String,
}

fn default_start() -> String {
    "<think>".into()
}

fn default_end() -> String {
    "</think>".into()
}

impl Default for ReasoningMarkers {
    fn default() -> Self {
        Self {
            start: default_start(),
            end: default_end(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet.
    Start,
    /// Between the markers.
    Inside,
    /// Just after the end marker: whitespace before the answer is dropped.
    Closed,
    /// After the reasoning, or there was none.
    Answer,
}

/// What one piece of text split into.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub answer: String,
    /// The piece was (part of) the reasoning, markers included: its token counts as reasoning.
    pub reasoned: bool,
}

/// Splits one choice's text into reasoning and answer.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    markers: ReasoningMarkers,
    state: State,
    held: String,
}

/// The longest suffix of `text` that begins `marker` (held back until the next piece decides).
fn partial_suffix(text: &str, marker: &str) -> usize {
    text.char_indices()
        .map(|(i, _)| i)
        .find(|&i| marker.starts_with(&text[i..]))
        .map_or(0, |i| text.len() - i)
}

impl ReasoningSplitter {
    /// A splitter for `markers`.
    pub fn new(markers: ReasoningMarkers) -> Self {
        Self {
            markers,
            state: State::Start,
            held: String::new(),
        }
    }

    /// Splits the next piece; `last` flushes what is held.
    pub fn push(&mut self, text: &str, last: bool) -> Split {
        let mut buffer = std::mem::take(&mut self.held);
        buffer.push_str(text);
        let mut out = Split::default();
        if self.state == State::Start {
            let trimmed = buffer.trim_start();
            if let Some(rest) = trimmed.strip_prefix(self.markers.start.as_str()) {
                buffer = rest.to_string();
                self.state = State::Inside;
                out.reasoned = true;
            } else if self.markers.start.starts_with(trimmed) && !last {
                self.held = buffer;
                return out;
            } else {
                self.state = State::Answer;
            }
        }
        if self.state == State::Inside {
            out.reasoned = true;
            if let Some(at) = buffer.find(self.markers.end.as_str()) {
                out.reasoning = buffer[..at].to_string();
                buffer = buffer[at + self.markers.end.len()..].to_string();
                self.state = State::Closed;
            } else {
                let keep = if last {
                    0
                } else {
                    partial_suffix(&buffer, &self.markers.end)
                };
                let cut = buffer.len() - keep;
                out.reasoning = buffer[..cut].to_string();
                self.held = buffer[cut..].to_string();
                return out;
            }
        }
        if self.state == State::Closed {
            buffer = buffer.trim_start().to_string();
            if !buffer.is_empty() {
                self.state = State::Answer;
            }
        }
        out.answer = buffer;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str]) -> (String, String, usize) {
        let mut s = ReasoningSplitter::new(ReasoningMarkers::default());
        let (mut reasoning, mut answer, mut reasoned) = (String::new(), String::new(), 0);
        for (i, piece) in pieces.iter().enumerate() {
            let split = s.push(piece, i + 1 == pieces.len());
            reasoning.push_str(&split.reasoning);
            answer.push_str(&split.answer);
            reasoned += usize::from(split.reasoned);
        }
        (reasoning, answer, reasoned)
    }

    #[test]
    fn markers_split_across_pieces_are_found() {
        let (r, a, n) = run(&[
            "<th",
            "ink>",
            "Let me ",
            "see.</",
            "think>",
            "\n\nIt is 4",
            ".",
        ]);
        assert_eq!((r.as_str(), a.as_str()), ("Let me see.", "It is 4."));
        assert_eq!(n, 4, "the marker pieces and the reasoning count");
    }

    #[test]
    fn output_without_the_start_marker_is_all_answer() {
        assert_eq!(
            run(&["Hello", " <think>there"]),
            (String::new(), "Hello <think>there".into(), 0)
        );
        assert_eq!(run(&["<", "b>bold"]), (String::new(), "<b>bold".into(), 0));
        assert_eq!(run(&["  <think>x"]), ("x".into(), String::new(), 1));
    }

    #[test]
    fn an_unclosed_reasoning_ends_at_the_last_piece() {
        assert_eq!(
            run(&["<think>still thinking </th"]),
            ("still thinking </th".into(), String::new(), 1)
        );
    }
}
