//! The gateway plugin conformance kit over every shipped gateway plugin and the C example, and
//! proof that it catches a plugin breaking each rule it checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use turnpike_plugin_api::conformance::{Report, run};
use turnpike_tests::{c_gateway_plugin, faulty_gateway_plugin, gateway_plugin};

fn kit(path: &Path, config: &str) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(run(path, config))
}

fn failed(report: &Report) -> Vec<String> {
    report.failures().iter().map(|c| c.name.clone()).collect()
}

#[test]
fn the_shipped_plugins_conform() {
    for (name, config) in [
        (
            "redact",
            r#"{"custom": [{"name": "ticket", "pattern": "\\bT-[0-9]{6}\\b"}]}"#,
        ),
        (
            "guard",
            r#"{"deny": ["forbidden"], "max_prompt_chars": 100000}"#,
        ),
    ] {
        let report = kit(&gateway_plugin(name), config);
        assert!(report.passed(), "{name}: {report:#?}");
        assert!(report.checks.len() > 3, "{name}: {report:#?}");
    }
}

#[test]
fn the_c_example_conforms() {
    let report = kit(&c_gateway_plugin(), "{}");
    assert!(report.passed(), "{report:#?}");
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert!(names.iter().any(|n| n.starts_with("guard")), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("transform")),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.contains("unix_time")), "{names:?}");
}

#[test]
fn a_well_behaved_faulty_plugin_conforms() {
    let report = kit(&faulty_gateway_plugin(), "{}");
    assert!(report.passed(), "{report:#?}");
}

#[test]
fn the_kit_reports_each_broken_rule() {
    let faulty = faulty_gateway_plugin();
    let guard_panic = failed(&kit(&faulty, r#"{"break": "guard_panic"}"#));
    assert!(
        guard_panic.iter().any(|n| n.contains("a valid verdict")),
        "{guard_panic:?}"
    );
    let slow = failed(&kit(&faulty, r#"{"break": "guard_slow"}"#));
    assert!(
        slow.iter().all(|n| n.ends_with("prompt")) && !slow.is_empty(),
        "{slow:?}"
    );
    let bad = failed(&kit(&faulty, r#"{"break": "guard_bad_status"}"#));
    assert!(bad.iter().any(|n| n.contains("a valid verdict")), "{bad:?}");
    let chunky = failed(&kit(&faulty, r#"{"break": "transform_chunky"}"#));
    assert!(
        chunky.iter().any(|n| n.contains("however it is cut")),
        "{chunky:?}"
    );
    let silent = failed(&kit(&faulty, r#"{"break": "tool_silent"}"#));
    assert!(
        silent.iter().any(|n| n.contains("within its deadline")),
        "{silent:?}"
    );
    assert!(
        silent.iter().any(|n| n.contains("cancelled call")),
        "{silent:?}"
    );
    // Destroying the instance still answers the calls it kept (the SDK sees to it).
    assert!(!silent.iter().any(|n| n.contains("destroy")), "{silent:?}");
}

#[test]
fn a_library_that_is_not_a_gateway_plugin_is_refused_with_the_reason() {
    let report = kit(&turnpike_tests::sim_plugin(), "{}");
    assert!(!report.passed());
    assert!(
        report.checks[0]
            .detail
            .contains("not a Turnpike gateway plugin"),
        "{report:#?}"
    );
}
