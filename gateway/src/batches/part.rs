//! A chunk's results as one object: a line per answer, `o` (answered) or `e` (failed), the
//! line's index in its chunk, a tab, and the result-file line.

use bytes::Bytes;

use crate::files::lines::spans;

/// One answered line of a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answered {
    /// Its index in the chunk.
    pub index: usize,
    /// Answered (for the output file), or failed (for the error file).
    pub ok: bool,
    /// Its result-file line.
    pub text: Vec<u8>,
}

/// The object holding `answers`.
pub(super) fn encode(answers: &[Answered]) -> Vec<u8> {
    let mut body = Vec::new();
    for a in answers {
        body.push(if a.ok { b'o' } else { b'e' });
        body.extend_from_slice(a.index.to_string().as_bytes());
        body.push(b'\t');
        body.extend_from_slice(&a.text);
        body.push(b'\n');
    }
    body
}

/// The answers an object holds (lines it cannot read are left out).
pub(super) fn decode(part: &Bytes) -> Vec<Answered> {
    spans(part)
        .filter_map(|(s, e)| {
            let text = &part[s..e];
            let tab = text.iter().position(|b| *b == b'\t')?;
            let index = std::str::from_utf8(&text[1..tab]).ok()?.parse().ok()?;
            Some(Answered {
                index,
                ok: text[0] == b'o',
                text: text[tab + 1..].to_vec(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let answers = vec![
            Answered {
                index: 3,
                ok: true,
                text: br#"{"custom_id":"a"}"#.to_vec(),
            },
            Answered {
                index: 0,
                ok: false,
                text: br#"{"custom_id":"b"}"#.to_vec(),
            },
        ];
        assert_eq!(decode(&Bytes::from(encode(&answers))), answers);
    }
}
