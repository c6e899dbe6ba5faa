//! The trace spans of a generation's engine part (see `observability::traces`): `engine` from
//! submit to the end, with the token counts, and beneath it `prefill` up to the first event and
//! `decode` after it. Nothing is made when traces are off.

use crate::observability::traces::TARGET as TRACE;

/// `engine`, from submit to the end, and beneath it `prefill` (to the first event), then
/// `decode`.
#[derive(Debug)]
pub(crate) struct EngineSpans {
    /// The `engine` span.
    pub(crate) engine: tracing::Span,
    phase: tracing::Span,
    decoding: bool,
}

impl EngineSpans {
    /// The spans of a generation starting now, or `None` when traces are off.
    pub(crate) fn start(model: &str, prompt_tokens: u64) -> Option<Self> {
        let engine = tracing::info_span!(
            target: TRACE,
            "engine",
            model = model,
            // Signed: OpenTelemetry's integers are i64 (a u64 would go as a string).
            prompt_tokens = i64::try_from(prompt_tokens).unwrap_or(i64::MAX),
            completion_tokens = tracing::field::Empty,
        );
        if engine.is_disabled() {
            return None;
        }
        let phase = tracing::info_span!(target: TRACE, parent: &engine, "prefill");
        Some(Self {
            engine,
            phase,
            decoding: false,
        })
    }

    /// The first event came: prefill is over.
    pub(crate) fn first_event(&mut self) {
        if !self.decoding {
            self.decoding = true;
            self.phase = tracing::info_span!(target: TRACE, parent: &self.engine, "decode");
        }
    }
}
