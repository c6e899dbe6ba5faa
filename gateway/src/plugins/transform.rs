//! Response transforms over a generation's events: each choice's text goes through the chain of
//! its plugins' transforms (the first's output feeds the second), and a choice's held-back tail
//! is flushed just before it finishes. Streamed and non-streamed answers see the same events, so
//! they agree whenever each transform does not depend on how the text was cut (rule 6 of the
//! plugin contract, checked by the conformance kit).

use std::collections::HashMap;
use std::time::Instant;

use turnpike_plugin_api::host::TransformHandle;

use crate::error::ApiError;
use crate::observability::metrics;
use crate::pipeline::run::GenEvent;

/// One plugin's transform of one choice.
pub(super) struct Link {
    /// The plugin, for metrics and errors.
    pub(super) plugin: String,
    /// Its transform.
    pub(super) handle: TransformHandle,
    /// Feeds so far, their time, and whether one failed: counted once, when the choice's
    /// transform closes (a feed per token would cost a metrics lookup per token).
    pub(super) feeds: u64,
    pub(super) time: std::time::Duration,
    pub(super) failed: bool,
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.feeds == 0 {
            return;
        }
        let outcome = if self.failed { "failed" } else { "ok" };
        metrics::plugin_calls(&self.plugin, "transform", outcome, self.feeds, self.time);
    }
}

/// The transforms of one generation, opened lazily per choice.
pub(crate) struct OutputTransforms {
    /// Opens the chain of a choice.
    open: Box<dyn Fn(u32) -> Result<Vec<Link>, ApiError> + Send>,
    chains: HashMap<u32, Vec<Link>>,
    retry_after: std::time::Duration,
}

impl std::fmt::Debug for OutputTransforms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputTransforms")
            .field("choices", &self.chains.len())
            .finish_non_exhaustive()
    }
}

impl OutputTransforms {
    pub(super) fn new(
        open: Box<dyn Fn(u32) -> Result<Vec<Link>, ApiError> + Send>,
        retry_after: std::time::Duration,
    ) -> Self {
        Self {
            open,
            chains: HashMap::new(),
            retry_after,
        }
    }

    fn feed(&mut self, choice: u32, text: &str, last: bool) -> Result<String, ApiError> {
        if !self.chains.contains_key(&choice) {
            let chain = (self.open)(choice)?;
            self.chains.insert(choice, chain);
        }
        let retry_after = self.retry_after;
        let Some(chain) = self.chains.get_mut(&choice) else {
            return Ok(text.to_string());
        };
        let mut piece = text.to_string();
        for link in chain.iter_mut() {
            let started = Instant::now();
            let fed = link.handle.feed(&piece, last);
            link.feeds += 1;
            link.time += started.elapsed();
            link.failed |= fed.is_err();
            piece = fed.map_err(|e| ApiError::PluginFailed {
                detail: format!("plugin `{}` transform: {e}", link.plugin),
                retry_after,
            })?;
        }
        Ok(piece)
    }

    /// Puts the events to send in place of `event` into `out`.
    pub(crate) fn apply(&mut self, event: GenEvent, out: &mut impl Extend<GenEvent>) {
        match event {
            GenEvent::Text {
                choice,
                text,
                logprobs,
            } => match self.feed(choice, &text, false) {
                Ok(text) => out.extend([GenEvent::Text {
                    choice,
                    text,
                    logprobs,
                }]),
                Err(e) => out.extend([GenEvent::Error(e)]),
            },
            GenEvent::Finish { choice, reason } => match self.feed(choice, "", true) {
                Ok(tail) if tail.is_empty() => out.extend([GenEvent::Finish { choice, reason }]),
                Ok(tail) => out.extend([
                    GenEvent::Text {
                        choice,
                        text: tail,
                        logprobs: Vec::new(),
                    },
                    GenEvent::Finish { choice, reason },
                ]),
                Err(e) => out.extend([GenEvent::Error(e)]),
            },
            other => out.extend([other]),
        }
    }
}
