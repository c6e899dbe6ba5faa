//! The query of a list endpoint (`limit` and `order`), read the same way by every list:
//! a Responses input-item list, files, batches.

use std::collections::HashMap;

use crate::error::ApiError;

/// `limit`: 1 to `most`, `default` when absent.
pub(crate) fn limit(
    query: &HashMap<String, String>,
    default: usize,
    most: usize,
) -> Result<usize, ApiError> {
    match query.get("limit") {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=most).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("'limit' must be an integer from 1 to {most}"),
                )
            }),
    }
}

/// `order`: `desc` (the default) or `asc`; whether it is ascending.
pub(crate) fn ascending(query: &HashMap<String, String>) -> Result<bool, ApiError> {
    match query.get("order").map(String::as_str) {
        None | Some("desc") => Ok(false),
        Some("asc") => Ok(true),
        Some(other) => Err(ApiError::invalid(
            "order",
            format!("'{other}' is not an order; expected asc or desc"),
        )),
    }
}
