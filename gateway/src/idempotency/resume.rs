//! Resumable streams: every server-sent event of a streamed answer carries an `id:` (its place
//! in the stream, from 0), and a client that lost its connection sends the request again with
//! the same `Idempotency-Key` and the last id it read as `Last-Event-ID` (the SSE standard's
//! reconnection header). It gets the events after that one: from the stored record when the
//! stream has ended (on any replica), from the live hub while it runs on this replica.
//!
//! Ids are written by the routes' framing ([`EventIds`]) and read back here ([`After`]), so a
//! record needs nothing beyond its bytes. Comments (keep-alives) carry no id and are not
//! replayed before the resume point.

use std::io::Write;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::error::ApiError;

/// The `Last-Event-ID` of a request: `None` without one, an error when it is not one
/// non-negative integer.
pub(crate) fn last_event_id(headers: &HeaderMap) -> Option<Result<u64, ApiError>> {
    let mut values = headers.get_all("last-event-id").iter();
    let value = values.next()?;
    let bad = |message: &str| {
        Some(Err(ApiError::InvalidHeader {
            header: "Last-Event-ID",
            message: message.into(),
        }))
    };
    if values.next().is_some() {
        return bad("Send one Last-Event-ID header, not several.");
    }
    match value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(id) => Some(Ok(id)),
        None => bad("Last-Event-ID must be the id of an event of the stream: an integer from 0."),
    }
}

/// Whether an answer is a stream that can be resumed: a success, as server-sent events.
pub(crate) fn is_stream(status: StatusCode, headers: &HeaderMap) -> bool {
    status.is_success()
        && headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// Answered to a `Last-Event-ID` whose key's answer is not a stream (a whole JSON body, or a
/// refusal).
pub(crate) fn not_a_stream() -> Response {
    ApiError::InvalidHeader {
        header: "Last-Event-ID",
        message: "Last-Event-ID resumes a stream, and the request with this Idempotency-Key was not answered with one: send it again without Last-Event-ID to read its answer.".into(),
    }
    .into_response()
}

/// Numbers the events of one stream as the routes frame them.
#[derive(Debug, Default)]
pub(crate) struct EventIds {
    next: u64,
}

impl EventIds {
    /// Ids from `first` on (a stream read from the middle of a log).
    pub(crate) fn starting_at(first: u64) -> Self {
        Self { next: first }
    }

    /// `frames` (whole events, one or several) with an `id:` line first in each event;
    /// comments (keep-alives) pass unnumbered.
    pub(crate) fn tag(&mut self, frames: Bytes) -> Bytes {
        let mut out = Vec::with_capacity(frames.len() + 12);
        let mut rest: &[u8] = &frames;
        while !rest.is_empty() {
            let end = rest
                .windows(2)
                .position(|w| w == b"\n\n")
                .map_or(rest.len(), |at| at + 2);
            let (event, tail) = rest.split_at(end);
            if !event.starts_with(b":") {
                // Writing to a Vec cannot fail.
                let _ = writeln!(out, "id: {}", self.next);
                self.next += 1;
            }
            out.extend_from_slice(event);
            rest = tail;
        }
        Bytes::from(out)
    }
}

/// The id of one event (its `id:` line), if it has one.
fn id_of(event: &[u8]) -> Option<u64> {
    event
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"id:"))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Drops the events of a stream up to and including id `last`, then passes the rest as it
/// comes.
#[derive(Debug)]
pub(crate) struct After {
    last: u64,
    pending: Vec<u8>,
    passing: bool,
}

impl After {
    /// A filter that resumes after event `last`.
    pub(crate) fn new(last: u64) -> Self {
        Self {
            last,
            pending: Vec::new(),
            passing: false,
        }
    }

    /// What of `bytes` goes to the client (empty while still before the resume point).
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Bytes {
        if self.passing {
            return Bytes::copy_from_slice(bytes);
        }
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = self.pending[start..]
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|at| start + at + 2)
        {
            let event = &self.pending[start..end];
            if id_of(event).is_some_and(|id| id > self.last) {
                self.passing = true;
                let rest = Bytes::copy_from_slice(&self.pending[start..]);
                self.pending = Vec::new();
                return rest;
            }
            start = end;
        }
        self.pending.drain(..start);
        Bytes::new()
    }

    /// Whether the resume point was passed.
    pub(crate) fn passed(&self) -> bool {
        self.passing
    }
}

/// `body` resumed after event `last`.
pub(crate) fn body_after(body: Body, last: u64) -> Body {
    let mut after = After::new(last);
    let stream = body.into_data_stream().filter_map(move |chunk| {
        let out = chunk.map(|bytes| after.push(&bytes));
        std::future::ready(match out {
            Ok(bytes) if bytes.is_empty() => None,
            other => Some(other),
        })
    });
    Body::from_stream(stream)
}

/// The recorded `chunks` of an ended stream after event `last`; `None` when the stream has
/// no event after it and none with that id (the id is not of this stream).
pub(crate) fn chunks_after(chunks: &[String], last: u64) -> Option<Vec<Bytes>> {
    let mut after = After::new(last);
    let out: Vec<Bytes> = chunks
        .iter()
        .map(|c| after.push(c.as_bytes()))
        .filter(|b| !b.is_empty())
        .collect();
    if after.passed() {
        return Some(out);
    }
    // Nothing after `last`: fine when `last` is the final event (the client read it all).
    let ids = chunks.iter().flat_map(|c| {
        c.split("\n\n")
            .filter_map(|e| id_of(e.as_bytes()))
            .collect::<Vec<_>>()
    });
    ids.max().filter(|&final_id| final_id == last).map(|_| out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use axum::http::HeaderValue;

    use super::*;

    fn tagged(frames: &[&str]) -> Vec<String> {
        let mut ids = EventIds::default();
        frames
            .iter()
            .map(|f| String::from_utf8(ids.tag(Bytes::from(f.to_string())).to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn every_event_is_numbered_and_comments_are_not() {
        let mut ids = EventIds::default();
        let batch = ids.tag(Bytes::from_static(b": keep-alive\n\ndata: x\n\n"));
        assert_eq!(&batch[..], b": keep-alive\n\nid: 0\ndata: x\n\n");
        let got = tagged(&[
            "data: {\"a\":1}\n\n",
            ": keep-alive\n\n",
            "event: x\ndata: 2\n\nevent: y\ndata: 3\n\n",
            "data: [DONE]\n\n",
        ]);
        assert_eq!(
            got,
            [
                "id: 0\ndata: {\"a\":1}\n\n",
                ": keep-alive\n\n",
                "id: 1\nevent: x\ndata: 2\n\nid: 2\nevent: y\ndata: 3\n\n",
                "id: 3\ndata: [DONE]\n\n",
            ]
        );
    }

    #[test]
    fn a_resume_drops_what_was_read_whatever_the_chunking() {
        let stream = tagged(&[
            "data: a\n\n",
            ": keep-alive\n\n",
            "data: b\n\n",
            "data: c\n\n",
            "data: [DONE]\n\n",
        ])
        .concat();
        for split in 1..stream.len() {
            let mut after = After::new(1);
            let mut out = Vec::new();
            out.extend_from_slice(&after.push(&stream.as_bytes()[..split]));
            out.extend_from_slice(&after.push(&stream.as_bytes()[split..]));
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "id: 2\ndata: c\n\nid: 3\ndata: [DONE]\n\n"
            );
        }
    }

    #[test]
    fn a_record_resumes_after_an_id_it_holds_and_refuses_others() {
        let chunks = tagged(&["data: a\n\n", "data: b\n\n", "data: [DONE]\n\n"]);
        let after = |last| {
            chunks_after(&chunks, last).map(|c| c.iter().map(|b| b.to_vec()).collect::<Vec<_>>())
        };
        assert_eq!(
            after(0).unwrap().concat(),
            b"id: 1\ndata: b\n\nid: 2\ndata: [DONE]\n\n"
        );
        assert_eq!(after(2), Some(Vec::new()));
        assert_eq!(after(3), None);
    }

    #[test]
    fn the_header_is_one_integer() {
        let headers = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append("last-event-id", HeaderValue::from_str(v).unwrap());
            }
            h
        };
        assert!(last_event_id(&headers(&[])).is_none());
        assert_eq!(last_event_id(&headers(&["7"])), Some(Ok(7)));
        for bad in [&["x"][..], &["-1"], &["1", "2"]] {
            assert!(matches!(
                last_event_id(&headers(bad)),
                Some(Err(ApiError::InvalidHeader { .. }))
            ));
        }
    }
}
