//! A non-streamed response is the fold of the stream: the same events, gathered per choice.

use futures_util::StreamExt;

use super::run::{Finished, GenEvent, TokenLogprob, Totals};
use crate::error::ApiError;

/// One choice, whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ChoiceResult {
    /// All its text.
    pub text: String,
    /// Its reasoning (models with reasoning markers).
    pub reasoning: String,
    /// Per token, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Character offset of each token's text (for legacy logprobs).
    pub text_offsets: Vec<u64>,
    /// Tool calls, in order.
    pub tool_calls: Vec<FoldedCall>,
    /// Server tools the gateway ran for it, in order.
    pub server_tools: Vec<super::run::ServerToolRun>,
    /// Why it ended.
    pub finish: Option<Finished>,
    /// Characters in `text` so far (kept so offsets cost nothing per token).
    chars: u64,
}

/// A tool call: id, function name, arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoldedCall {
    /// `call_...`.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// A whole generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Folded {
    /// Choices, by index.
    pub choices: Vec<ChoiceResult>,
    /// Token counts.
    pub totals: Totals,
    /// When the first text or tool call came (for time to first token and per output token).
    pub first_output: Option<std::time::Instant>,
}

/// Reads `stream` to its end; `choices` is the number of choices it holds.
pub(crate) async fn fold(
    mut stream: impl futures_core::Stream<Item = GenEvent> + Unpin,
    choices: usize,
) -> Result<Folded, ApiError> {
    let mut out = Folded {
        choices: vec![ChoiceResult::default(); choices],
        totals: Totals::default(),
        first_output: None,
    };
    while let Some(event) = stream.next().await {
        if out.first_output.is_none()
            && matches!(event, GenEvent::Text { .. } | GenEvent::ToolCall { .. })
        {
            out.first_output = Some(std::time::Instant::now());
        }
        match event {
            GenEvent::Text {
                choice,
                text,
                logprobs,
            } => {
                let Some(c) = out.choices.get_mut(choice as usize) else {
                    continue;
                };
                for lp in logprobs {
                    c.text_offsets.push(c.chars);
                    c.logprobs.push(lp);
                }
                c.chars += text.chars().count() as u64;
                c.text.push_str(&text);
            }
            GenEvent::Reasoning { choice, text } => {
                if let Some(c) = out.choices.get_mut(choice as usize) {
                    c.reasoning.push_str(&text);
                }
            }
            GenEvent::ToolCall {
                choice,
                id,
                name,
                arguments,
                ..
            } => {
                if let Some(c) = out.choices.get_mut(choice as usize) {
                    c.tool_calls.push(FoldedCall {
                        id,
                        name,
                        arguments,
                    });
                }
            }
            GenEvent::Finish { choice, reason } => {
                if let Some(c) = out.choices.get_mut(choice as usize) {
                    c.finish = Some(reason);
                }
            }
            GenEvent::ServerTool(run) => {
                if let Some(c) = out.choices.get_mut(run.choice as usize) {
                    c.server_tools.push(*run);
                }
            }
            GenEvent::Usage(totals) => out.totals = totals,
            GenEvent::Error(e) => return Err(e),
        }
    }
    Ok(out)
}
