//! A request body as what the picker routes on: its prompt as units for prefix affinity.
//! Token ids (a completions `prompt` of ids, as Turnpike's upstream plugin sends) are used as
//! they are; text (chat `messages`, a completions `prompt`, a Responses `input`) becomes four
//! bytes per unit, in order, so a shared system prompt is a shared prefix. A body that is not
//! JSON routes by load alone.

use serde_json::Value;

/// The affinity units of a request body (empty when it has no prompt), and whether they are
/// token ids.
pub(crate) fn prompt_units(body: &[u8]) -> (Vec<u32>, bool) {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
        return (Vec::new(), false);
    };
    if let Some(Value::Array(ids)) = map.get("prompt")
        && !ids.is_empty()
        && ids.iter().all(Value::is_u64)
    {
        let ids = ids
            .iter()
            .filter_map(Value::as_u64)
            .map(|id| u32::try_from(id).unwrap_or(u32::MAX))
            .collect();
        return (ids, true);
    }
    let mut text = Vec::new();
    for key in ["messages", "prompt", "input", "system"] {
        if let Some(v) = map.get(key) {
            collect_text(v, &mut text);
        }
    }
    let units = text
        .chunks(4)
        .map(|c| c.iter().fold(0u32, |acc, &b| (acc << 8) | u32::from(b)))
        .collect();
    (units, false)
}

/// The strings in `v`, in document order (roles and contents alike).
fn collect_text(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::String(s) => {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        Value::Array(items) => items.iter().for_each(|i| collect_text(i, out)),
        Value::Object(map) => map.values().for_each(|i| collect_text(i, out)),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::Bool(_) | Value::Null => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_ids_and_text_shares_its_prefix() {
        assert_eq!(
            prompt_units(br#"{"prompt": [5, 6, 7]}"#),
            (vec![5, 6, 7], true)
        );
        let (a, _) = prompt_units(
            br#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"a"}]}"#,
        );
        let (b, text) = prompt_units(
            br#"{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"b"}],"model":"m"}"#,
        );
        assert!(a.len() > 4 && a[..4] == b[..4]);
        assert_ne!(a, b);
        assert!(!text);
        assert!(prompt_units(b"not json").0.is_empty());
    }
}
