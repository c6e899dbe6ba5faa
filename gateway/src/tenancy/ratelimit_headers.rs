//! The `x-ratelimit-*` headers, as OpenAI sends them: for requests and for tokens, the limit,
//! what remains, and the time until the bucket is full again (`1s`, `6m0s`, `250ms`).

use axum::http::{HeaderMap, HeaderValue};

use super::limits::LimitReport;
use crate::clock::format_reset;
use crate::store::Level;

fn put(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(name, v);
    }
}

fn triple(headers: &mut HeaderMap, names: [&'static str; 3], level: &Level) {
    put(headers, names[0], level.window.capacity.to_string());
    put(headers, names[1], level.remaining.to_string());
    put(headers, names[2], format_reset(level.reset));
}

/// Writes the headers a report has levels for.
pub fn apply(headers: &mut HeaderMap, report: &LimitReport) {
    if let Some(level) = &report.requests {
        triple(
            headers,
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
            level,
        );
    }
    if let Some(level) = &report.tokens {
        triple(
            headers,
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
            level,
        );
    }
    if let Some(position) = report.queue_position {
        put(headers, "x-queue-position", position.to_string());
    }
    if let Some(route) = &report.route {
        put(headers, "x-turnpike-route", route.clone());
    }
    if let Some(cost) = report.cost {
        put(headers, "x-turnpike-cost", cost.to_string());
    }
    if let Some(warning) = &report.budget_warning {
        put(headers, "x-turnpike-budget-warning", warning.clone());
    }
}
