//! The lines of a batch input file (OpenAI's format: one JSON object per line with
//! `custom_id`, `method`, `url` and `body`), checked when the file is uploaded so a bad file is
//! refused at once with its first bad line named, and split into chunks when a batch starts.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{Map, Value};

/// The endpoints a batch line may call.
pub(crate) const ENDPOINTS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// Longest `custom_id`.
const MAX_CUSTOM_ID: usize = 512;

/// One line of a batch input file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputLine {
    /// The caller's id for the line, unique in its file.
    pub custom_id: String,
    /// Always `POST`.
    pub method: String,
    /// The endpoint (one of [`ENDPOINTS`]).
    pub url: String,
    /// The request body, as that endpoint takes it.
    pub body: Map<String, Value>,
}

/// What a checked file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    /// Its lines (blank lines are not lines).
    pub lines: u64,
    /// The endpoint every line calls, when they all call one.
    pub url: Option<String>,
}

/// Parses and checks one line (numbered from 1 in messages).
pub(crate) fn parse_line(text: &[u8], number: u64) -> Result<InputLine, String> {
    let line: InputLine = serde_json::from_slice(text).map_err(|e| {
        let why = e.to_string();
        let why = why.split(" at line ").next().unwrap_or(&why).to_string();
        format!("line {number}: {why}")
    })?;
    if line.custom_id.is_empty() || line.custom_id.len() > MAX_CUSTOM_ID {
        return Err(format!(
            "line {number}: `custom_id` must hold 1 to {MAX_CUSTOM_ID} bytes"
        ));
    }
    if line.method != "POST" {
        return Err(format!(
            "line {number}: `method` must be \"POST\", not {:?}",
            line.method
        ));
    }
    if !ENDPOINTS.contains(&line.url.as_str()) {
        return Err(format!(
            "line {number}: `url` {:?} is not one of {}",
            line.url,
            ENDPOINTS.join(", ")
        ));
    }
    Ok(line)
}

/// The non-blank lines of `bytes` with their byte ranges.
pub(crate) fn spans(bytes: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        while start < bytes.len() {
            let end = bytes[start..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(bytes.len(), |at| start + at);
            let span = (start, end);
            start = end + 1;
            if !bytes[span.0..span.1].trim_ascii().is_empty() {
                return Some(span);
            }
        }
        None
    })
}

/// Checks a whole batch input file: UTF-8, every line well formed, `custom_id`s unique. The
/// error names the first bad line.
pub(crate) fn check(bytes: &[u8]) -> Result<Checked, String> {
    let mut ids = HashSet::new();
    let mut url: Option<String> = None;
    let mut mixed = false;
    let mut lines = 0;
    for (start, end) in spans(bytes) {
        lines += 1;
        let line = parse_line(&bytes[start..end], lines)?;
        match &url {
            None => url = Some(line.url.clone()),
            Some(u) if *u != line.url => mixed = true,
            Some(_) => {}
        }
        if !ids.insert(line.custom_id) {
            return Err(format!(
                "line {lines}: `custom_id` repeats an earlier line's; each must be unique"
            ));
        }
    }
    if lines == 0 {
        return Err("the file holds no lines".into());
    }
    Ok(Checked {
        lines,
        url: if mixed { None } else { url },
    })
}

/// Splits a file's lines into chunks of at most `size` lines: each chunk's byte range.
pub(crate) fn chunks(bytes: &[u8], size: usize) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize, usize)> = None;
    for (start, end) in spans(bytes) {
        current = match current {
            Some((first, _, count)) if count < size => Some((first, end, count + 1)),
            Some((first, last, _)) => {
                out.push((first as u64, last as u64));
                Some((start, end, 1))
            }
            None => Some((start, end, 1)),
        };
    }
    if let Some((first, last, _)) = current {
        out.push((first as u64, last as u64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, url: &str) -> String {
        format!(r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{{"model":"m"}}}}"#)
    }

    #[test]
    fn a_good_file_is_counted_and_the_first_bad_line_is_named() {
        let good = format!(
            "{}\n\n{}\n",
            line("a", "/v1/chat/completions"),
            line("b", "/v1/chat/completions")
        );
        let checked = check(good.as_bytes()).unwrap();
        assert_eq!(checked.lines, 2);
        assert_eq!(checked.url.as_deref(), Some("/v1/chat/completions"));
        let bad = format!("{}\nnot json\n", line("a", "/v1/embeddings"));
        assert!(check(bad.as_bytes()).unwrap_err().starts_with("line 2:"));
        let repeat = format!(
            "{}\n{}",
            line("a", "/v1/embeddings"),
            line("a", "/v1/embeddings")
        );
        assert!(check(repeat.as_bytes()).unwrap_err().contains("unique"));
        let url = line("a", "/v1/images");
        assert!(check(url.as_bytes()).unwrap_err().contains("`url`"));
        assert!(check(b"\n\n").is_err());
    }

    #[test]
    fn chunks_cover_every_line_once() {
        let text: String = (0..7)
            .map(|n| line(&n.to_string(), "/v1/completions") + "\n")
            .collect();
        let parts = chunks(text.as_bytes(), 3);
        assert_eq!(parts.len(), 3);
        let lines: usize = parts
            .iter()
            .map(|(s, e)| spans(&text.as_bytes()[*s as usize..*e as usize]).count())
            .sum();
        assert_eq!(lines, 7);
    }
}
