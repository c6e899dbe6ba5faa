//! The `x-ratelimit-*` headers, as OpenAI sends them: for requests and for tokens, the limit,
//! what remains, and the time until the bucket is full again (`1s`, `6m0s`, `250ms`).

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};

use super::limits::LimitReport;
use crate::store::Level;

/// `250ms`, `1.5s`, `6m0s`, `2h3m0s`.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        let text = format!("{secs:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        return format!("{text}s");
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_read_like_openai_durations() {
        assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
        assert_eq!(format_reset(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_secs(7380)), "2h3m0s");
    }
}
