//! Compaction (`POST /v1/responses/compact`): the model summarises a long conversation, and the
//! summary travels back to the client inside a `compaction` item that later requests send as
//! input in place of the turns it replaces.
//!
//! The item's `encrypted_content` is opaque to clients, as OpenAI's is, but it is an encoding,
//! not a secret: a version prefix and the summary in URL-safe base64. Hiding it would protect
//! nothing (the caller could ask the same model for the same summary), and signing it would
//! protect nothing either (a caller who forges one only changes its own prompt, which its input
//! controls anyway). An encoding keeps items valid across replicas and restarts with no key to
//! manage. A content that does not decode is refused as invalid input.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use crate::ids::new_id;

/// What an `encrypted_content` starts with (the encoding's version).
const PREFIX: &str = "tpc1.";

/// The instruction the model summarises a conversation under, sent as the last user message.
pub(crate) const INSTRUCTION: &str = "Summarize the conversation so far so that it can continue from \
the summary alone. Keep the user's goals and requests, the facts, decisions and results reached, \
the state of any tool calls, and every open question. Write only the summary.";

/// How the model is shown a compaction item: a user message that starts with this line.
const SHOWN_AS: &str = "A summary of the earlier conversation:";

/// `summary` as an item's `encrypted_content`.
pub(crate) fn encode(summary: &str) -> String {
    format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(summary))
}

/// The summary in an item's `encrypted_content`, if it holds one.
pub(crate) fn decode(content: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(content.strip_prefix(PREFIX)?).ok()?;
    String::from_utf8(bytes).ok()
}

/// A new compaction item holding `summary`.
pub(crate) fn item(summary: &str) -> Value {
    json!({"type": "compaction", "id": new_id("cmp_"), "encrypted_content": encode(summary)})
}

/// The text the model is shown for a compaction item whose content holds `summary`.
pub(crate) fn shown(summary: &str) -> String {
    format!("{SHOWN_AS}\n\n{summary}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_round_trips_and_foreign_content_does_not_decode() {
        let summary = "The user wants a landing page — café, dogs, \"quotes\".";
        let content = encode(summary);
        assert!(content.starts_with(PREFIX));
        assert_eq!(decode(&content).as_deref(), Some(summary));
        assert_eq!(decode("gAAAAABpM0Yj-xyz="), None);
        assert_eq!(decode("tpc1.***"), None);
        assert!(
            item(summary)["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("cmp_"))
        );
    }
}
