//! The conformance kit over every shipped plugin, and proof that the kit catches violations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use turnpike_engine_api::conformance::{KitOptions, Outcome, Report, run};
use turnpike_tests::{
    Header, c_example_plugin, cuda_plugin, faulty_plugin, rust_example_plugin, sim_plugin,
    table_fixture, tiny_model,
};

fn kit(path: &Path, config: &str) -> Report {
    let options = KitOptions {
        config: config.into(),
        ..KitOptions::default()
    };
    run(path, &options).unwrap_or_else(|e| panic!("kit could not start: {e}"))
}

fn assert_conforms(path: &Path, config: &str) -> Report {
    let report = kit(path, config);
    assert!(report.passed(), "{report}");
    report
}

#[test]
fn simulator_conforms_with_every_feature() {
    let report = assert_conforms(&sim_plugin(), "{}");
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Skip(_)))
        .collect();
    assert!(
        skipped.is_empty(),
        "the simulator supports everything the kit checks: {report}"
    );
}

#[test]
fn simulator_conforms_with_latency_queueing_and_echo() {
    let config = r#"{
        "max_running": 2,
        "max_queued": 256,
        "models": [
            {"id": "timed", "latency": {"ttft_ms": 1, "itl_ms": 0.5, "itl_jitter_ms": 0.2}},
            {"id": "echo", "output": {"mode": "echo"}}
        ]
    }"#;
    assert_conforms(&sim_plugin(), config);
    let options = KitOptions {
        config: config.into(),
        model: Some("echo".into()),
        ..KitOptions::default()
    };
    let report = run(&sim_plugin(), &options).expect("kit");
    assert!(report.passed(), "{report}");
}

#[test]
fn default_engine_conforms_on_the_cpu() {
    let config = serde_json::json!({
        "seed": 1,
        "models": [{"id": "tiny", "path": tiny_model(), "device": "cpu", "threads": 1,
                    "max_running": 8, "max_batch_tokens": 64}]
    });
    let report = assert_conforms(&cuda_plugin(), &config.to_string());
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Skip(_)))
        .collect();
    assert!(skipped.is_empty(), "nothing skipped: {report}");
}

#[test]
fn rust_example_conforms() {
    assert_conforms(&rust_example_plugin(), "{}");
}

#[test]
fn c_example_conforms() {
    assert_conforms(&c_example_plugin(), "{}");
}

#[test]
fn an_engine_that_finishes_inside_submit_conforms() {
    assert_conforms(&faulty_plugin(), "{}");
}

fn violating_fixture(variant: &str) -> std::path::PathBuf {
    table_fixture(Some(variant), Header::Current)
}

fn failure(report: &Report, check: &str) -> String {
    let found = report
        .checks
        .iter()
        .find(|c| c.name == check)
        .unwrap_or_else(|| panic!("no check {check}"));
    match &found.outcome {
        Outcome::Fail(why) => why.clone(),
        other => panic!("{check} should fail, got {other:?}\n{report}"),
    }
}

#[test]
fn the_kit_catches_two_final_events() {
    let report = kit(&violating_fixture("TWO_FINALS"), "{}");
    assert!(
        failure(&report, "generate").contains("2 FINAL events"),
        "{report}"
    );
}

#[test]
fn the_kit_catches_a_sink_never_released() {
    let options = KitOptions {
        timeout: std::time::Duration::from_millis(300),
        ..KitOptions::default()
    };
    let report = run(&violating_fixture("NO_RELEASE"), &options).expect("kit");
    assert!(
        failure(&report, "generate").contains("releases 0"),
        "{report}"
    );
    assert!(
        failure(&report, "destroy_with_live_requests").contains("0 releases"),
        "{report}"
    );
}

#[test]
fn the_kit_catches_events_after_the_final() {
    let report = kit(&violating_fixture("TOKEN_AFTER_FINAL"), "{}");
    assert!(
        failure(&report, "generate").contains("events after FINAL"),
        "{report}"
    );
}
