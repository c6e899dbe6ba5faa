//! Owned Rust forms of statuses and events, and their conversion to and from `TpEventV1`.
//!
//! Plugins emit these through [`crate::plugin::Sink`]; hosts receive them from
//! `host::EventStream`. The conversion lives here, once, for both sides.

use std::fmt;

use crate::abi::{self, TpEventV1, TpStatus, TpTopLogprob, TpUsage};
use crate::json::MAX_TOP_LOGPROBS;
use crate::layout;

/// One alternative token and its log probability (the ABI struct, reused as is).
pub type TopLogprob = TpTopLogprob;
/// Token counts of a request (the ABI struct, reused as is).
pub type Usage = TpUsage;

/// Outcome of a call or of a request; see the `TP_STATUS_*` constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok,
    /// Cancelled by `cancel` or `destroy`.
    Cancelled,
    /// Malformed or out-of-range request.
    InvalidRequest,
    /// Unknown model.
    NotFound,
    /// At capacity; retry later.
    Overloaded,
    /// Cannot serve right now.
    Unavailable,
    /// Asked for something the engine does not do.
    Unsupported,
    /// A fault inside the engine.
    Internal,
    /// `create` got a configuration it cannot use.
    InvalidConfig,
    /// A status from a newer minor version; treated as internal.
    Unknown(u32),
}

impl Status {
    /// The status for a raw value.
    pub fn from_raw(raw: TpStatus) -> Self {
        match raw {
            abi::TP_STATUS_OK => Self::Ok,
            abi::TP_STATUS_CANCELLED => Self::Cancelled,
            abi::TP_STATUS_INVALID_REQUEST => Self::InvalidRequest,
            abi::TP_STATUS_NOT_FOUND => Self::NotFound,
            abi::TP_STATUS_OVERLOADED => Self::Overloaded,
            abi::TP_STATUS_UNAVAILABLE => Self::Unavailable,
            abi::TP_STATUS_UNSUPPORTED => Self::Unsupported,
            abi::TP_STATUS_INTERNAL => Self::Internal,
            abi::TP_STATUS_INVALID_CONFIG => Self::InvalidConfig,
            other => Self::Unknown(other),
        }
    }

    /// The raw value.
    pub fn to_raw(self) -> TpStatus {
        match self {
            Self::Ok => abi::TP_STATUS_OK,
            Self::Cancelled => abi::TP_STATUS_CANCELLED,
            Self::InvalidRequest => abi::TP_STATUS_INVALID_REQUEST,
            Self::NotFound => abi::TP_STATUS_NOT_FOUND,
            Self::Overloaded => abi::TP_STATUS_OVERLOADED,
            Self::Unavailable => abi::TP_STATUS_UNAVAILABLE,
            Self::Unsupported => abi::TP_STATUS_UNSUPPORTED,
            Self::Internal => abi::TP_STATUS_INTERNAL,
            Self::InvalidConfig => abi::TP_STATUS_INVALID_CONFIG,
            Self::Unknown(raw) => raw,
        }
    }

    /// A short snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Cancelled => "cancelled",
            Self::InvalidRequest => "invalid_request",
            Self::NotFound => "not_found",
            Self::Overloaded => "overloaded",
            Self::Unavailable => "unavailable",
            Self::Unsupported => "unsupported",
            Self::Internal => "internal",
            Self::InvalidConfig => "invalid_config",
            Self::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(raw) => write!(f, "unknown status {raw}"),
            other => f.write_str(other.name()),
        }
    }
}

/// A failure reported by an engine: a status and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct EngineError {
    /// What kind of failure.
    pub status: Status,
    /// Why, for humans.
    pub message: String,
}

impl EngineError {
    /// An error of any status.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    /// `TP_STATUS_INVALID_REQUEST`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidRequest, message)
    }
    /// `TP_STATUS_NOT_FOUND`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Status::NotFound, message)
    }
    /// `TP_STATUS_UNSUPPORTED`.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Status::Unsupported, message)
    }
    /// `TP_STATUS_OVERLOADED`.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(Status::Overloaded, message)
    }
    /// `TP_STATUS_INTERNAL`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Status::Internal, message)
    }
    /// `TP_STATUS_INVALID_CONFIG`.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidConfig, message)
    }
}

/// Why a choice stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// End-of-sequence or a stop token id.
    Stop,
    /// `max_tokens` or the context window.
    Length,
}

/// How a choice ended: the reason (none when cancelled or failed) and the matched stop token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finish {
    /// The reason; `None` when the request was cancelled or failed.
    pub reason: Option<FinishReason>,
    /// The end-of-sequence or stop token that ended the choice.
    pub stop_token: Option<u32>,
}

impl Finish {
    /// Ended by a stop token (or end-of-sequence).
    pub fn stop(token: u32) -> Self {
        Self {
            reason: Some(FinishReason::Stop),
            stop_token: Some(token),
        }
    }
    /// Ended by the length limit.
    pub fn length() -> Self {
        Self {
            reason: Some(FinishReason::Length),
            stop_token: None,
        }
    }
}

/// One generated token of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Choice index.
    pub choice: u32,
    /// The token.
    pub token_id: u32,
    /// Its log probability, when asked for.
    pub logprob: Option<f32>,
    /// Most likely alternatives, most likely first; empty when not asked for.
    pub top_logprobs: Vec<TopLogprob>,
}

/// The end of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalEvent {
    /// How the request ended.
    pub status: Status,
    /// Why it failed; empty on success.
    pub message: String,
    /// Finish of every choice that did not end with its own `ChoiceEnd`.
    pub finish: Finish,
    /// Token counts.
    pub usage: Usage,
}

impl FinalEvent {
    /// A successful end.
    pub fn ok(finish: Finish, usage: Usage) -> Self {
        Self {
            status: Status::Ok,
            message: String::new(),
            finish,
            usage,
        }
    }
    /// A failed or cancelled end.
    pub fn failed(status: Status, message: impl Into<String>, usage: Usage) -> Self {
        Self {
            status,
            message: message.into(),
            finish: Finish::default(),
            usage,
        }
    }
}

/// An event of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// A token.
    Token(TokenEvent),
    /// One choice of several ended.
    ChoiceEnd {
        /// Choice index.
        choice: u32,
        /// How it ended.
        finish: Finish,
    },
    /// The request ended; always the last event.
    Final(FinalEvent),
}

fn finish_to_raw(finish: &Finish, ev: &mut TpEventV1) {
    ev.finish_reason = match finish.reason {
        None => abi::TP_FINISH_NONE,
        Some(FinishReason::Stop) => abi::TP_FINISH_STOP,
        Some(FinishReason::Length) => abi::TP_FINISH_LENGTH,
    };
    if let Some(token) = finish.stop_token {
        ev.flags |= abi::TP_EVENT_FLAG_STOP_TOKEN;
        ev.stop_token_id = token;
    }
}

fn finish_from_raw(ev: &TpEventV1) -> Finish {
    let reason = match ev.finish_reason {
        abi::TP_FINISH_STOP => Some(FinishReason::Stop),
        abi::TP_FINISH_LENGTH => Some(FinishReason::Length),
        _ => None,
    };
    let stop_token = (ev.flags & abi::TP_EVENT_FLAG_STOP_TOKEN != 0).then_some(ev.stop_token_id);
    Finish { reason, stop_token }
}

fn blank_event(kind: u32) -> TpEventV1 {
    TpEventV1 {
        struct_size: std::mem::size_of::<TpEventV1>() as u32,
        kind,
        choice_index: 0,
        flags: 0,
        token_id: 0,
        logprob: 0.0,
        top_logprobs: std::ptr::null(),
        num_top_logprobs: 0,
        finish_reason: abi::TP_FINISH_NONE,
        stop_token_id: 0,
        status: abi::TP_STATUS_OK,
        usage: Usage::default(),
        message: layout::tp_str(""),
    }
}

/// Calls `f` with a raw token event borrowing `top_logprobs` (no allocation).
pub(crate) fn raw_token<R>(
    choice: u32,
    token_id: u32,
    logprob: Option<f32>,
    top_logprobs: &[TopLogprob],
    f: impl FnOnce(&TpEventV1) -> R,
) -> R {
    let mut ev = blank_event(abi::TP_EVENT_TOKEN);
    ev.choice_index = choice;
    ev.token_id = token_id;
    if let Some(lp) = logprob {
        ev.flags |= abi::TP_EVENT_FLAG_LOGPROB;
        ev.logprob = lp;
    }
    if !top_logprobs.is_empty() {
        ev.top_logprobs = top_logprobs.as_ptr();
        ev.num_top_logprobs = top_logprobs.len() as u32;
    }
    f(&ev)
}

impl EngineEvent {
    /// Calls `f` with a raw event borrowing from `self`.
    pub fn with_raw<R>(&self, f: impl FnOnce(&TpEventV1) -> R) -> R {
        match self {
            Self::Token(t) => raw_token(t.choice, t.token_id, t.logprob, &t.top_logprobs, f),
            Self::ChoiceEnd { choice, finish } => {
                let mut ev = blank_event(abi::TP_EVENT_CHOICE_END);
                ev.choice_index = *choice;
                finish_to_raw(finish, &mut ev);
                f(&ev)
            }
            Self::Final(fin) => {
                let mut ev = blank_event(abi::TP_EVENT_FINAL);
                ev.status = fin.status.to_raw();
                ev.usage = fin.usage;
                ev.message = layout::tp_str(&fin.message);
                finish_to_raw(&fin.finish, &mut ev);
                f(&ev)
            }
        }
    }

    /// Copies a raw event into an owned one; `Ok(None)` for an event kind this side does not
    /// know (a later minor's), which readers skip.
    ///
    /// # Safety
    /// `ptr` must point to a live event written by the other side, whose `struct_size` is truthful
    /// and whose pointers are valid as the ABI describes.
    pub unsafe fn from_raw(ptr: *const TpEventV1) -> Result<Option<Self>, String> {
        // SAFETY: the caller vouches for the event's validity.
        let ev = unsafe { layout::read_at_least(ptr, layout::EVENT_V1_0_SIZE, "event") }?;
        Ok(Some(match ev.kind {
            abi::TP_EVENT_TOKEN => {
                if ev.num_top_logprobs > MAX_TOP_LOGPROBS {
                    return Err(format!(
                        "{} top logprobs, more than the {MAX_TOP_LOGPROBS} allowed",
                        ev.num_top_logprobs
                    ));
                }
                let top_logprobs = if ev.top_logprobs.is_null() || ev.num_top_logprobs == 0 {
                    Vec::new()
                } else {
                    // SAFETY: the ABI says `top_logprobs` holds `num_top_logprobs` entries.
                    unsafe {
                        std::slice::from_raw_parts(ev.top_logprobs, ev.num_top_logprobs as usize)
                    }
                    .to_vec()
                };
                Self::Token(TokenEvent {
                    choice: ev.choice_index,
                    token_id: ev.token_id,
                    logprob: (ev.flags & abi::TP_EVENT_FLAG_LOGPROB != 0).then_some(ev.logprob),
                    top_logprobs,
                })
            }
            abi::TP_EVENT_CHOICE_END => Self::ChoiceEnd {
                choice: ev.choice_index,
                finish: finish_from_raw(&ev),
            },
            abi::TP_EVENT_FINAL => Self::Final(FinalEvent {
                status: Status::from_raw(ev.status),
                // SAFETY: the ABI says `message` is valid for this call.
                message: unsafe { layout::str_lossy(ev.message) },
                finish: finish_from_raw(&ev),
                usage: ev.usage,
            }),
            _ => return Ok(None),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(ev: EngineEvent) -> EngineEvent {
        // SAFETY: `raw` is a live event borrowed from `ev` for the closure.
        ev.with_raw(|raw| unsafe { EngineEvent::from_raw(raw) })
            .expect("valid event")
            .expect("a known kind")
    }

    #[test]
    fn events_survive_the_raw_form() {
        let events = [
            EngineEvent::Token(TokenEvent {
                choice: 2,
                token_id: 42,
                logprob: Some(-0.25),
                top_logprobs: vec![
                    TopLogprob {
                        token_id: 42,
                        logprob: -0.25,
                    },
                    TopLogprob {
                        token_id: 7,
                        logprob: -2.0,
                    },
                ],
            }),
            EngineEvent::Token(TokenEvent {
                choice: 0,
                token_id: 1,
                logprob: None,
                top_logprobs: vec![],
            }),
            EngineEvent::ChoiceEnd {
                choice: 1,
                finish: Finish::stop(2),
            },
            EngineEvent::Final(FinalEvent::ok(
                Finish::length(),
                Usage {
                    prompt_tokens: 3,
                    cached_prompt_tokens: 1,
                    completion_tokens: 9,
                },
            )),
            EngineEvent::Final(FinalEvent::failed(
                Status::Unknown(99),
                "device lost",
                Usage::default(),
            )),
        ];
        for ev in events {
            assert_eq!(round_trip(ev.clone()), ev);
        }
    }

    #[test]
    fn statuses_round_trip() {
        for raw in 0..12 {
            assert_eq!(Status::from_raw(raw).to_raw(), raw);
        }
    }

    #[test]
    fn unknown_kinds_are_skipped_and_absurd_counts_refused() {
        let mut raw = blank_event(99);
        // SAFETY: `raw` is a live event.
        assert_eq!(unsafe { EngineEvent::from_raw(&raw) }, Ok(None));
        raw.kind = abi::TP_EVENT_TOKEN;
        raw.num_top_logprobs = 1 << 30;
        // SAFETY: `raw` is a live event; the count is refused before the pointer is read.
        assert!(unsafe { EngineEvent::from_raw(&raw) }.is_err());
    }

    #[test]
    fn short_events_are_rejected() {
        let mut raw = blank_event(abi::TP_EVENT_TOKEN);
        raw.struct_size = 8;
        // SAFETY: `raw` is a live event.
        assert!(unsafe { EngineEvent::from_raw(&raw) }.is_err());
    }
}
