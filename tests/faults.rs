//! A misbehaving plugin (panics everywhere, lost and leaked sinks) is contained: each fault
//! becomes a status or one FINAL event, every sink is released once, and the host lives on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;
use turnpike_engine_api::conformance::submit_recorded;
use turnpike_engine_api::host::{EngineHandle, EngineRequest, Plugin, PluginError};
use turnpike_engine_api::{EmbedParams, EngineEvent, FinalEvent, GenerationParams, Status};
use turnpike_tests::{PATIENCE, faulty_plugin};

fn engine(fault: &str) -> EngineHandle {
    let plugin = Plugin::load(faulty_plugin()).expect("loads");
    plugin
        .create(&json!({"fault": fault}).to_string())
        .expect("creates")
}

fn request(max_tokens: u32) -> EngineRequest {
    EngineRequest {
        trace_context: None,
        model: "faulty".into(),
        prompt: vec![1, 2, 3],
        params: GenerationParams {
            max_tokens,
            ..GenerationParams::default()
        },
    }
}

async fn final_of(engine: &EngineHandle) -> (usize, FinalEvent) {
    let mut stream = engine.submit(&request(4)).expect("accepted");
    let mut tokens = 0;
    loop {
        let event = tokio::time::timeout(PATIENCE, stream.recv())
            .await
            .expect("in time")
            .expect("an event");
        match event {
            EngineEvent::Token(_) => tokens += 1,
            EngineEvent::ChoiceEnd { .. } => {}
            EngineEvent::Final(fin) => return (tokens, fin),
        }
    }
}

#[test]
fn a_panic_in_create_is_a_create_error_with_the_panic_message() {
    let plugin = Plugin::load(faulty_plugin()).expect("loads");
    let err = plugin
        .create(r#"{"fault": "panic_in_create"}"#)
        .expect_err("fails");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            PluginError::CreateFailed {
                status: Status::Internal,
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("plugin panicked in create: injected panic in create"),
        "{text}"
    );
}

#[test]
fn a_panic_in_submit_is_an_internal_status_and_the_host_lives_on() {
    let broken = engine("panic_in_submit");
    for _ in 0..3 {
        let (recorder, submitted) =
            submit_recorded(&broken, "faulty", &[1], r#"{"max_tokens": 2}"#);
        let err = submitted.expect_err("refused");
        assert_eq!(err.status, Status::Internal);
        assert!(
            err.message
                .contains("plugin panicked in submit: injected panic in submit"),
            "{err}"
        );
        let (seen, released) = recorder.wait_released(PATIENCE);
        assert!(released && seen.releases == 1, "{seen:?}");
        assert!(seen.tokens.is_empty() && seen.finals.is_empty(), "{seen:?}");
    }
    // The engine still answers its other entries, and a healthy engine from the same library works.
    assert_eq!(broken.stats().expect("stats").failed, 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (tokens, fin) = rt.block_on(final_of(&engine("none")));
    assert_eq!((tokens, fin.status), (4, Status::Ok));
}

#[test]
fn events_from_a_sink_kept_past_a_panicking_submit_never_reach_the_host() {
    let broken = engine("panic_after_handoff");
    let (recorder, submitted) = submit_recorded(&broken, "faulty", &[1], "{}");
    let err = submitted.expect_err("refused");
    assert_eq!(err.status, Status::Internal);
    // The worker finishes 20 ms later; its events are suppressed, its sink released once.
    let (seen, released) = recorder.wait_released(PATIENCE);
    std::thread::sleep(Duration::from_millis(50));
    assert!(released, "{seen:?}");
    let seen = recorder.seen();
    assert_eq!(seen.releases, 1, "{seen:?}");
    assert!(seen.tokens.is_empty() && seen.finals.is_empty(), "{seen:?}");
}

#[tokio::test]
async fn a_panicking_worker_ends_its_request_with_an_internal_final() {
    let (tokens, fin) = final_of(&engine("panic_in_worker")).await;
    assert_eq!(tokens, 1);
    assert_eq!(fin.status, Status::Internal);
    assert_eq!(fin.message, "engine panicked while running the request");
}

#[tokio::test]
async fn a_sink_dropped_unfinished_ends_with_an_internal_final() {
    let (tokens, fin) = final_of(&engine("drop_sink")).await;
    assert_eq!(tokens, 1);
    assert_eq!(fin.status, Status::Internal);
    assert_eq!(
        fin.message,
        "engine dropped the request without finishing it"
    );
}

#[tokio::test]
async fn an_error_after_the_final_counts_as_accepted() {
    let (_, fin) = final_of(&engine("final_then_error")).await;
    assert_eq!(fin.status, Status::Ok);
}

#[tokio::test]
async fn an_error_after_a_token_is_carried_by_the_final() {
    let (tokens, fin) = final_of(&engine("token_then_error")).await;
    assert_eq!(tokens, 1);
    assert_eq!(fin.status, Status::Internal);
    assert_eq!(fin.message, "an error after a token");
}

#[test]
fn destroy_waits_for_sinks_held_by_engine_threads() {
    let late = engine("finish_late");
    let (recorder, submitted) = submit_recorded(&late, "faulty", &[1], "{}");
    submitted.expect("accepted");
    drop(late);
    let seen = recorder.seen();
    assert_eq!(
        (seen.finals.len(), seen.releases),
        (1, 1),
        "destroy returned early: {seen:?}"
    );
    assert_eq!(seen.finals[0].status, Status::Ok);
}

#[test]
fn sinks_an_engine_still_holds_are_cancelled_when_it_is_destroyed() {
    let leaky = engine("leak_on_destroy");
    let recorders: Vec<_> = (0..3)
        .map(|_| {
            let (recorder, submitted) = submit_recorded(&leaky, "faulty", &[1], "{}");
            submitted.expect("accepted");
            recorder
        })
        .collect();
    assert!(recorders.iter().all(|r| r.seen().finals.is_empty()));
    drop(leaky);
    for recorder in recorders {
        let seen = recorder.seen();
        assert_eq!((seen.finals.len(), seen.releases), (1, 1), "{seen:?}");
        assert_eq!(seen.finals[0].status, Status::Cancelled);
        assert_eq!(seen.finals[0].message, "engine destroyed");
    }
}

#[test]
fn panics_in_other_entries_are_statuses() {
    let models = engine("panic_in_models").models().expect_err("fails");
    assert!(models.message.contains("panicked in models"), "{models}");
    let stats = engine("panic_in_stats").stats().expect_err("fails");
    assert!(stats.message.contains("panicked in stats"), "{stats}");
    let health = engine("panic_in_health").health().expect_err("fails");
    assert!(health.message.contains("panicked in health"), "{health}");
    let embed = engine("panic_in_embed")
        .embed("faulty", &[vec![1]], &EmbedParams::default())
        .expect_err("fails");
    assert!(embed.message.contains("panicked in embed"), "{embed}");
    assert_eq!(engine("panic_in_cancel").cancel(1), Status::Internal);
    // Destroying an engine whose shutdown panics returns normally.
    drop(engine("panic_in_shutdown"));
    for e in [models, stats, health, embed] {
        assert_eq!(e.status, Status::Internal);
    }
}

#[test]
fn a_bad_configuration_is_refused_by_create() {
    let plugin = Plugin::load(faulty_plugin()).expect("loads");
    let err = plugin
        .create(r#"{"fault": "none", "colour": "red"}"#)
        .expect_err("unknown key");
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
}
