//! Handles of the metrics every request records, kept by their labels: the recorder looks a
//! metric up by name and labels, which allocates the label strings and hashes them on every
//! call, and a request records several (its HTTP status and duration, its model's tokens, time
//! to first token and time per output token). A kept handle costs one map lookup by a borrowed
//! key instead, and a request's model handles are found once (`RequestRecord` keeps them).
//!
//! Each table is bounded: label values come from the router's routes, HTTP statuses and the
//! served models, and a table that still passes [`MOST`] entries (models reloaded many times)
//! starts again empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use metrics::{Counter, Histogram};

/// Most entries a table keeps.
const MOST: usize = 4096;

/// What a model's generations record.
#[derive(Debug)]
pub(crate) struct ModelHandles {
    model: String,
    prompt_tokens: Counter,
    completion_tokens: Counter,
    time_to_first_token: Histogram,
    time_per_output_token: Histogram,
}

impl ModelHandles {
    /// A request's first text or tool call came `elapsed` after it arrived.
    pub(crate) fn first_token(&self, elapsed: std::time::Duration) {
        self.time_to_first_token.record(elapsed.as_secs_f64());
    }

    /// A request ended with these token counts.
    pub(crate) fn tokens(&self, prompt: u64, completion: u64) {
        self.prompt_tokens.increment(prompt);
        self.completion_tokens.increment(completion);
        super::metrics::decoded(&self.model, completion);
    }

    /// A request's time per output token after the first (decode latency per token).
    pub(crate) fn per_output_token(&self, seconds: f64) {
        self.time_per_output_token.record(seconds);
    }
}

/// What a route records: its duration, and its count per status.
#[derive(Debug)]
struct RouteHandles {
    duration: Histogram,
    by_status: HashMap<u16, Counter>,
}

static MODELS: Mutex<Option<HashMap<String, Arc<ModelHandles>>>> = Mutex::new(None);
static ROUTES: Mutex<Option<HashMap<String, RouteHandles>>> = Mutex::new(None);

fn lock<T>(table: &Mutex<T>) -> MutexGuard<'_, T> {
    // Inserts and lookups only: a poisoned table is consistent.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `model`'s handles.
pub(super) fn model(model: &str) -> Arc<ModelHandles> {
    let mut table = lock(&MODELS);
    let table = table.get_or_insert_with(HashMap::new);
    if let Some(handles) = table.get(model) {
        return Arc::clone(handles);
    }
    // The recorder first: a handle taken before it is installed would count nowhere.
    super::metrics::handle();
    let name = || model.to_string();
    let handles = Arc::new(ModelHandles {
        model: name(),
        prompt_tokens: metrics::counter!("turnpike_tokens_total", "model" => name(), "kind" => "prompt"),
        completion_tokens: metrics::counter!("turnpike_tokens_total", "model" => name(), "kind" => "completion"),
        time_to_first_token: metrics::histogram!("turnpike_time_to_first_token_seconds", "model" => name()),
        time_per_output_token: metrics::histogram!("turnpike_time_per_output_token_seconds", "model" => name()),
    });
    if table.len() >= MOST {
        table.clear();
    }
    table.insert(name(), Arc::clone(&handles));
    handles
}

/// Counts a response of `endpoint` (a route) with `status` that took `seconds`.
pub(super) fn http_request(endpoint: &str, status: u16, seconds: f64) {
    let mut table = lock(&ROUTES);
    let table = table.get_or_insert_with(HashMap::new);
    if !table.contains_key(endpoint) {
        super::metrics::handle();
        if table.len() >= MOST {
            table.clear();
        }
        let duration = metrics::histogram!("turnpike_http_request_duration_seconds", "endpoint" => endpoint.to_string());
        table.insert(
            endpoint.to_string(),
            RouteHandles {
                duration,
                by_status: HashMap::new(),
            },
        );
    }
    let Some(route) = table.get_mut(endpoint) else {
        return;
    };
    route.duration.record(seconds);
    route
        .by_status
        .entry(status)
        .or_insert_with(|| {
            metrics::counter!("turnpike_http_requests_total", "endpoint" => endpoint.to_string(), "status" => status.to_string())
        })
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::super::metrics::render;
    use super::*;

    #[test]
    fn kept_handles_count_where_the_recorder_shows_them() {
        http_request("/kept/route", 200, 0.01);
        http_request("/kept/route", 200, 0.02);
        http_request("/kept/route", 404, 0.01);
        model("kept-model").tokens(5, 7);
        model("kept-model").tokens(1, 2);
        model("kept-model").first_token(std::time::Duration::from_millis(3));
        let text = render();
        for line in [
            r#"turnpike_http_requests_total{endpoint="/kept/route",status="200"} 2"#,
            r#"turnpike_http_requests_total{endpoint="/kept/route",status="404"} 1"#,
            r#"turnpike_http_request_duration_seconds_count{endpoint="/kept/route"} 3"#,
            r#"turnpike_tokens_total{model="kept-model",kind="prompt"} 6"#,
            r#"turnpike_tokens_total{model="kept-model",kind="completion"} 9"#,
            r#"turnpike_time_to_first_token_seconds_count{model="kept-model"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
