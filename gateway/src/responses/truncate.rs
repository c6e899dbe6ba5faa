//! `truncation: "auto"`: a conversation too long for the model's context loses items from its
//! beginning until its prompt fits. Which items go is decided here, apart from how a prompt is
//! counted (the caller passes the count), so the rule can be read and tested on its own:
//!
//! - the fewest items are dropped, always whole items, oldest first; `instructions` are not
//!   items and always stay;
//! - the kept part then starts at a user message where one is left, so the model never sees an
//!   answer, a tool result or reasoning whose question was dropped;
//! - when even the last item alone does not fit, only it is kept and the caller's context check
//!   refuses the request as it would without truncation.

use serde_json::Value;

use crate::error::ApiError;

/// The index of the first item of `items` to keep so that `count(&items[start..])`, a prompt's
/// token count, is at most `limit`. `count` is called O(log n) times.
pub fn first_kept(
    items: &[Value],
    limit: usize,
    mut count: impl FnMut(&[Value]) -> Result<usize, ApiError>,
) -> Result<usize, ApiError> {
    let Some(last) = items.len().checked_sub(1) else {
        return Ok(0);
    };
    if count(items)? <= limit {
        return Ok(0);
    }
    // Dropping items never lengthens the prompt: find the fewest to drop by bisection.
    let (mut fits, mut too_long) = (last, 0);
    if count(&items[last..])? > limit {
        return Ok(last);
    }
    while fits - too_long > 1 {
        let mid = too_long + (fits - too_long) / 2;
        if count(&items[mid..])? <= limit {
            fits = mid;
        } else {
            too_long = mid;
        }
    }
    Ok((fits..=last)
        .find(|&i| is_user_message(&items[i]))
        .unwrap_or(fits))
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
        assert_eq!(first_kept(&items, 10, words).ok(), Some(0));
        assert_eq!(first_kept(&[], 0, words).ok(), Some(0));
    }

    #[test]
    fn drops_the_fewest_oldest_items_and_starts_at_a_user_message() {
        let items = vec![
            message("user", 4),
            message("assistant", 4),
            message("user", 4),
            message("assistant", 4),
            message("user", 4),
        ];
        // 20 tokens; 13 fit the last three items (12), which start at a user message.
        assert_eq!(first_kept(&items, 13, words).ok(), Some(2));
        // 9 fit the last two (8), which start with an answer: the question went, so it goes too.
        assert_eq!(first_kept(&items, 9, words).ok(), Some(4));
    }

    #[test]
    fn a_tool_result_whose_call_was_dropped_goes_too() {
        let items = vec![
            message("user", 6),
            json!({"type": "function_call", "name": "f", "arguments": "{}"}),
            json!({"type": "function_call_output", "output": "x"}),
            message("user", 2),
        ];
        assert_eq!(first_kept(&items, 6, words).ok(), Some(3));
    }

    #[test]
    fn a_last_item_too_long_alone_is_kept_for_the_context_check() {
        let items = vec![message("user", 2), message("user", 50)];
        assert_eq!(first_kept(&items, 10, words).ok(), Some(1));
    }

    #[test]
    fn without_a_user_message_left_the_fewest_are_dropped() {
        let items = vec![message("assistant", 5), message("assistant", 5)];
        assert_eq!(first_kept(&items, 6, words).ok(), Some(1));
    }
}
