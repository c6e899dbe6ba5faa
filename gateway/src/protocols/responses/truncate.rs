//! `truncation: "auto"`: a conversation too long for the model's context loses items from its
//! beginning until its prompt fits. Which items go is decided here, apart from how a prompt is
//! counted (the caller passes the count), so the rule can be read and tested on its own:
//!
//! - the fewest items are dropped, always whole items, oldest first; the kept part starts at a
//!   user message (or a compaction item, shown as one), so the model never sees an answer, a tool
//!   result or reasoning whose question was dropped, and chat templates that insist on a user
//!   turn first accept it;
//! - only such starting points are ever counted, and a count that fails (a template that refuses
//!   the slice) is taken as "does not fit";
//! - when even the last starting point does not fit, it is kept anyway and the caller's context
//!   check refuses the request as it would without truncation.

use serde_json::Value;

use crate::error::ApiError;

/// The index of the first item of `items` to keep so that `count(&items[start..])`, a prompt's
/// token count, is at most `limit`. `count` is called O(log n) times.
pub(crate) fn first_kept(
    items: &[Value],
    limit: usize,
    mut count: impl FnMut(&[Value]) -> Result<usize, ApiError>,
) -> usize {
    let mut fits = |start: usize| count(&items[start..]).is_ok_and(|n| n <= limit);
    if items.is_empty() || fits(0) {
        return 0;
    }
    let starts: Vec<usize> = (1..items.len())
        .filter(|&i| is_user_message(&items[i]))
        .collect();
    let Some(&last) = starts.last() else {
        return 0;
    };
    if !fits(last) {
        return last;
    }
    // Dropping items never lengthens the prompt: the earliest start that fits, by bisection.
    let (mut lo, mut hi) = (0, starts.len() - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(starts[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    starts[lo]
}

/// A user message, or a compaction item (shown to the model as one).
fn is_user_message(item: &Value) -> bool {
    match item.get("type").and_then(Value::as_str) {
        Some("message") => item.get("role").and_then(Value::as_str) == Some("user"),
        Some("compaction") => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(role: &str, words: usize) -> Value {
        json!({"type": "message", "role": role, "content": "w ".repeat(words)})
    }

    /// Question, answer, question, answer, question: 4 tokens each.
    fn five_turns() -> Vec<Value> {
        ["user", "assistant", "user", "assistant", "user"]
            .iter()
            .map(|role| message(role, 4))
            .collect()
    }

    /// One token per word.
    fn words(items: &[Value]) -> Result<usize, ApiError> {
        Ok(items
            .iter()
            .map(|i| {
                i["content"]
                    .as_str()
                    .map_or(3, |c| c.split_whitespace().count())
            })
            .sum())
    }

    #[test]
    fn keeps_everything_that_fits() {
        let items = vec![message("user", 5), message("assistant", 5)];
        assert_eq!(first_kept(&items, 10, words), 0);
        assert_eq!(first_kept(&[], 0, words), 0);
    }

    #[test]
    fn drops_the_fewest_oldest_items_and_starts_at_a_user_message() {
        let items = five_turns();
        // 20 tokens; 13 fit the last three items (12), which start at a user message.
        assert_eq!(first_kept(&items, 13, words), 2);
        // 9 fit the last two (8), which start with an answer: the question went, so it goes too.
        assert_eq!(first_kept(&items, 9, words), 4);
    }

    #[test]
    fn a_tool_result_whose_call_was_dropped_goes_too() {
        let items = vec![
            message("user", 6),
            json!({"type": "function_call", "name": "f", "arguments": "{}"}),
            json!({"type": "function_call_output", "output": "x"}),
            message("user", 2),
        ];
        assert_eq!(first_kept(&items, 6, words), 3);
    }

    #[test]
    fn only_user_messages_are_counted_and_a_refused_count_does_not_fit() {
        let items = five_turns();
        let mut counted = Vec::new();
        // A template that refuses a conversation starting with an answer, and counts 4 a turn.
        let first = first_kept(&items, 8, |kept| {
            counted.push(items.len() - kept.len());
            if kept[0]["role"] == "assistant" {
                return Err(ApiError::invalid("messages", "roles must alternate"));
            }
            words(kept)
        });
        assert_eq!(first, 4);
        assert!(counted.iter().all(|&start| start % 2 == 0), "{counted:?}");
    }

    #[test]
    fn a_last_item_too_long_alone_is_kept_for_the_context_check() {
        let items = vec![message("user", 2), message("user", 50)];
        assert_eq!(first_kept(&items, 10, words), 1);
    }

    #[test]
    fn without_a_user_message_to_start_at_nothing_is_dropped() {
        let items = vec![message("assistant", 5), message("assistant", 5)];
        assert_eq!(first_kept(&items, 6, words), 0);
    }
}
