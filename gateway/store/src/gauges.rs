//! The store's own gauges (described with the gateway's other metrics).

/// Whether the state store answers its health probe (`turnpike_state_store_up`).
pub(crate) fn state_store_up(up: bool) {
    metrics::gauge!("turnpike_state_store_up").set(if up { 1.0 } else { 0.0 });
}

/// The in-memory store's stored values (`turnpike_stored_values`, `..._bytes`).
pub(crate) fn stored_values(values: usize, bytes: usize) {
    metrics::gauge!("turnpike_stored_values").set(values as f64);
    metrics::gauge!("turnpike_stored_value_bytes").set(bytes as f64);
}

/// The in-memory idempotency table's size (`turnpike_idempotency_records`, `..._bytes`).
pub(crate) fn idempotency_records(records: usize, bytes: usize) {
    metrics::gauge!("turnpike_idempotency_records").set(records as f64);
    metrics::gauge!("turnpike_idempotency_bytes").set(bytes as f64);
}

/// The in-memory usage log waiting for export, and records it dropped when full
/// (`turnpike_usage_log_records`, `turnpike_usage_log_dropped_total`).
pub(crate) fn usage_log(records: usize, dropped: bool) {
    metrics::gauge!("turnpike_usage_log_records").set(records as f64);
    if dropped {
        metrics::counter!("turnpike_usage_log_dropped_total").increment(1);
    }
}

/// Requests waiting for a grouped Redis call of one kind (`turnpike_state_batch_queue`): the
/// handle, which a queue keeps (it changes on every request's call).
pub(crate) fn batch_queue(kind: &'static str) -> metrics::Gauge {
    metrics::gauge!("turnpike_state_batch_queue", "kind" => kind)
}

/// The usage journal's size (`turnpike_usage_journal_bytes`): the handle, which the journal
/// keeps (it changes on every append).
pub(crate) fn usage_journal_bytes() -> metrics::Gauge {
    metrics::gauge!("turnpike_usage_journal_bytes")
}

/// A record the usage journal could not take (written to Redis directly)
/// (`turnpike_usage_journal_full_total`).
pub(crate) fn usage_journal_full() {
    metrics::counter!("turnpike_usage_journal_full_total").increment(1);
}

/// Journaled usage records Redis does not have yet (`turnpike_usage_journal_waiting`).
pub(crate) fn usage_journal_waiting(records: u64) {
    metrics::gauge!("turnpike_usage_journal_waiting").set(records as f64);
}
