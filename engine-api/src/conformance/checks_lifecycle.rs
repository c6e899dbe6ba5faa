//! Checks of cancellation, concurrency and destruction.

use std::time::Duration;

use serde_json::{Value, json};

use super::recorder::{Recorder, Seen};
use super::{Kit, Miss, ensure, submit_recorded};
use crate::event::{FinishReason, Status};
use crate::host::EngineHandle;

/// A cancelled request ends cancelled, or OK if generation finished first.
fn cancelled_or_finished(seen: &Seen, params: &Value) -> Result<(), Miss> {
    let fin = &seen.finals[0];
    match fin.status {
        Status::Cancelled => Ok(()),
        Status::Ok => {
            let max = params["max_tokens"].as_u64().unwrap_or(0);
            let complete = fin.finish.reason == Some(FinishReason::Length)
                && u64::from(fin.usage.completion_tokens) == max;
            ensure(complete, || {
                "cancelled request ended OK before reaching max_tokens".into()
            })
        }
        other => Err(Miss::Fail(format!(
            "cancelled request ended {other}: {}",
            fin.message
        ))),
    }
}

pub(super) fn cancel_before_start(kit: &Kit<'_>) -> Result<(), Miss> {
    let params = kit.long_params();
    let (recorder, submitted) = kit.submit(&params);
    let id = submitted.map_err(|e| Miss::Fail(format!("request refused: {e}")))?;
    kit.engine.cancel(id);
    let (seen, ended) = recorder.wait_ended(kit.options.timeout);
    kit.ended_once(&seen, ended, recorder)?;
    cancelled_or_finished(&seen, &params)
}

pub(super) fn cancel_during(kit: &Kit<'_>) -> Result<(), Miss> {
    let params = kit.long_params();
    let (recorder, submitted) = kit.submit(&params);
    let id = submitted.map_err(|e| Miss::Fail(format!("request refused: {e}")))?;
    let (_, started) = recorder.wait_until(kit.options.timeout, |s| {
        !s.tokens.is_empty() || !s.finals.is_empty()
    });
    ensure(started, || {
        format!("no token within {:?}", kit.options.timeout)
    })?;
    kit.engine.cancel(id);
    kit.engine.cancel(id);
    let (seen, ended) = recorder.wait_ended(kit.options.timeout);
    kit.ended_once(&seen, ended, recorder)?;
    cancelled_or_finished(&seen, &params)
}

pub(super) fn cancel_after_final(kit: &Kit<'_>) -> Result<(), Miss> {
    let (recorder, submitted) = kit.submit(&json!({"max_tokens": 2}));
    let id = submitted.map_err(|e| Miss::Fail(format!("request refused: {e}")))?;
    let (seen, ended) = recorder.wait_ended(kit.options.timeout);
    kit.ended_once(&seen, ended, recorder)?;
    kit.engine.cancel(id);
    kit.engine.cancel(id);
    std::thread::sleep(Duration::from_millis(50));
    kit.ended_once(&recorder.seen(), true, recorder)
}

pub(super) fn cancel_unknown(kit: &Kit<'_>) -> Result<(), Miss> {
    let status = kit.engine.cancel(u64::MAX - 7);
    ensure(status == Status::Ok, || {
        format!("cancel of an unknown id returned {status}")
    })
}

pub(super) fn concurrent_requests(kit: &Kit<'_>) -> Result<(), Miss> {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 8;
    let outcomes: Vec<Result<(), Miss>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let mut sent = Vec::new();
                    for i in 0..PER_THREAD {
                        let long = i % 2 == 1;
                        let params = if long {
                            kit.long_params()
                        } else {
                            json!({"max_tokens": 4})
                        };
                        let (recorder, submitted) = kit.submit(&params);
                        match submitted {
                            Ok(id) => {
                                if long {
                                    kit.engine.cancel(id);
                                }
                                sent.push((recorder, params, long));
                            }
                            Err(e) => return Err(Miss::Fail(format!("request refused: {e}"))),
                        }
                    }
                    for (recorder, params, long) in sent {
                        let (seen, ended) = recorder.wait_ended(kit.options.timeout);
                        kit.ended_once(&seen, ended, recorder)?;
                        if long {
                            cancelled_or_finished(&seen, &params)?;
                        } else {
                            let fin = &seen.finals[0];
                            ensure(fin.status == Status::Ok, || {
                                format!("status {}: {}", fin.status, fin.message)
                            })?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(Miss::Fail("kit thread panicked".into())))
            })
            .collect()
    });
    outcomes.into_iter().collect()
}

/// Drops the handle (which destroys the engine) on another thread; false if it does not return
/// in time.
fn destroy_within(engine: EngineHandle, timeout: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(engine);
        let _ = tx.send(());
    });
    rx.recv_timeout(timeout).is_ok()
}

pub(super) fn destroy_idle(kit: &Kit<'_>) -> Result<(), Miss> {
    let engine = kit
        .plugin
        .create(&kit.options.config)
        .map_err(|e| Miss::Fail(format!("second engine: {e}")))?;
    ensure(destroy_within(engine, kit.options.timeout), || {
        format!(
            "destroy of an idle engine did not return within {:?}",
            kit.options.timeout
        )
    })
}

pub(super) fn destroy_with_live_requests(kit: &Kit<'_>) -> Result<(), Miss> {
    let engine = kit
        .plugin
        .create(&kit.options.config)
        .map_err(|e| Miss::Fail(format!("second engine: {e}")))?;
    let params = kit.long_params().to_string();
    let mut live: Vec<&'static Recorder> = Vec::new();
    for _ in 0..4 {
        let (recorder, submitted) = submit_recorded(&engine, &kit.model.id, &kit.prompt(), &params);
        submitted.map_err(|e| Miss::Fail(format!("request refused: {e}")))?;
        live.push(recorder);
    }
    let _ = live[0].wait_until(kit.options.timeout, |s| !s.tokens.is_empty());
    ensure(destroy_within(engine, kit.options.timeout), || {
        format!(
            "destroy with live requests did not return within {:?}",
            kit.options.timeout
        )
    })?;
    for (i, recorder) in live.iter().enumerate() {
        let seen = recorder.seen();
        ensure(seen.finals.len() == 1 && seen.releases == 1, || {
            format!(
                "request {i} had {} FINAL events and {} releases when destroy returned",
                seen.finals.len(),
                seen.releases
            )
        })?;
    }
    std::thread::sleep(Duration::from_millis(50));
    for recorder in live {
        let seen = recorder.seen();
        ensure(seen.after_release == 0 && seen.after_final == 0, || {
            "events arrived after FINAL or release".into()
        })?;
    }
    Ok(())
}
