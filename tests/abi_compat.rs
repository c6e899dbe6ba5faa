//! ABI versioning: the frozen v1.0 layout, old plugins in the current host and the current
//! plugins in an old host, struct_size probing, and clear refusals of what cannot be loaded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use turnpike_engine_api::abi::{
    self, TpEmbedRequestV1, TpEngineApiV1, TpEventV1, TpHostV1, TpRequestV1, TpSinkV1, TpStr,
    TpTokens, TpTopLogprob, TpUsage, TpWriter,
};
use turnpike_engine_api::conformance::{KitOptions, run};
use turnpike_engine_api::host::{Plugin, PluginError};
use turnpike_tests::{
    Header, c, c_example_plugin, rust_example_plugin, sim_plugin, table_fixture, workspace_root,
};

/// `Struct.field -> (offset, size)` and `Struct -> (size, 0)` as a C compiler lays out `header`.
fn c_layout(header: Header) -> HashMap<String, (usize, usize)> {
    let source = workspace_root().join("tests/fixtures/c/layout_dump.c");
    let name = match header {
        Header::Current => "layout_current",
        Header::V1_0 => "layout_v1_0",
    };
    let program = c::program(name, &[source], &header.dir(), &[]);
    let out = Command::new(&program).output().expect("run layout dump");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .map(|line| {
            let mut parts = line.split_whitespace();
            let key = parts.next().expect("key").to_string();
            let a = parts.next().expect("value").parse().expect("number");
            let b = parts.next().map_or(0, |v| v.parse().expect("number"));
            (key, (a, b))
        })
        .collect()
}

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// The same table from the Rust types.
fn rust_layout() -> HashMap<String, (usize, usize)> {
    let mut map = HashMap::new();
    macro_rules! s {
        ($t:ident) => {
            map.insert(stringify!($t).to_string(), (size_of::<$t>(), 0));
        };
    }
    macro_rules! f {
        ($t:ident, $f:ident) => {
            map.insert(
                format!("{}.{}", stringify!($t), stringify!($f)),
                (offset_of!($t, $f), field_size::<$t, _>(|x| &x.$f)),
            );
        };
    }
    s!(TpStr);
    f!(TpStr, ptr);
    f!(TpStr, len);
    s!(TpTokens);
    f!(TpTokens, ptr);
    f!(TpTokens, len);
    s!(TpWriter);
    f!(TpWriter, ctx);
    f!(TpWriter, write);
    s!(TpHostV1);
    f!(TpHostV1, struct_size);
    f!(TpHostV1, abi_major);
    f!(TpHostV1, abi_minor);
    f!(TpHostV1, ctx);
    f!(TpHostV1, log);
    s!(TpRequestV1);
    f!(TpRequestV1, struct_size);
    f!(TpRequestV1, reserved);
    f!(TpRequestV1, id);
    f!(TpRequestV1, model);
    f!(TpRequestV1, prompt);
    f!(TpRequestV1, params_json);
    s!(TpEmbedRequestV1);
    f!(TpEmbedRequestV1, struct_size);
    f!(TpEmbedRequestV1, reserved);
    f!(TpEmbedRequestV1, model);
    f!(TpEmbedRequestV1, inputs);
    f!(TpEmbedRequestV1, num_inputs);
    f!(TpEmbedRequestV1, params_json);
    s!(TpTopLogprob);
    f!(TpTopLogprob, token_id);
    f!(TpTopLogprob, logprob);
    s!(TpUsage);
    f!(TpUsage, prompt_tokens);
    f!(TpUsage, cached_prompt_tokens);
    f!(TpUsage, completion_tokens);
    s!(TpEventV1);
    f!(TpEventV1, struct_size);
    f!(TpEventV1, kind);
    f!(TpEventV1, choice_index);
    f!(TpEventV1, flags);
    f!(TpEventV1, token_id);
    f!(TpEventV1, logprob);
    f!(TpEventV1, top_logprobs);
    f!(TpEventV1, num_top_logprobs);
    f!(TpEventV1, finish_reason);
    f!(TpEventV1, stop_token_id);
    f!(TpEventV1, status);
    f!(TpEventV1, usage);
    f!(TpEventV1, message);
    s!(TpSinkV1);
    f!(TpSinkV1, ctx);
    f!(TpSinkV1, on_event);
    f!(TpSinkV1, release);
    s!(TpEngineApiV1);
    f!(TpEngineApiV1, struct_size);
    f!(TpEngineApiV1, abi_major);
    f!(TpEngineApiV1, abi_minor);
    f!(TpEngineApiV1, name);
    f!(TpEngineApiV1, version);
    f!(TpEngineApiV1, create);
    f!(TpEngineApiV1, destroy);
    f!(TpEngineApiV1, models);
    f!(TpEngineApiV1, submit);
    f!(TpEngineApiV1, cancel);
    f!(TpEngineApiV1, stats);
    f!(TpEngineApiV1, health);
    f!(TpEngineApiV1, embed);
    map.insert("TP_ABI_MAJOR".into(), (usize::from(abi::TP_ABI_MAJOR), 0));
    map
}

#[test]
fn the_frozen_v1_0_layout_holds_in_the_current_abi() {
    let frozen = c_layout(Header::V1_0);
    let current_c = c_layout(Header::Current);
    let rust = rust_layout();
    assert!(frozen.len() > 60, "the dump covers every field");
    for (key, &(a, b)) in &frozen {
        let now = rust
            .get(key)
            .unwrap_or_else(|| panic!("{key} of v1.0 is gone from the Rust ABI"));
        if key.contains('.') || key.starts_with("TP_") {
            assert_eq!(
                *now,
                (a, b),
                "{key}: v1.0 (offset, size) {:?}, now {now:?}",
                (a, b)
            );
        } else {
            // Whole structs may only grow.
            assert!(now.0 >= a, "{key} shrank from {a} to {} bytes", now.0);
        }
    }
    assert_eq!(
        current_c, rust,
        "the checked-in header and the Rust types disagree"
    );
}

#[test]
fn a_plugin_built_for_v1_0_conforms_in_this_host() {
    let report = run(&table_fixture(None, Header::V1_0), &KitOptions::default()).expect("loads");
    assert!(report.passed(), "{report}");
}

#[test]
fn a_host_built_for_v1_0_runs_todays_plugins() {
    let source = workspace_root().join("tests/fixtures/c/old_host.c");
    let old_host = c::program("old_host_v1_0", &[source], &Header::V1_0.dir(), &["dl"]);
    for plugin in [
        sim_plugin(),
        rust_example_plugin(),
        c_example_plugin(),
        table_fixture(None, Header::Current),
    ] {
        let out = Command::new(&old_host)
            .arg(&plugin)
            .output()
            .expect("run old host");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "old host with {}: {stdout}\n{}",
            plugin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("tokens=5 finals=1 releases=1"), "{stdout}");
    }
}

#[test]
fn a_plugin_built_for_a_later_minor_loads_and_its_new_entries_are_ignored() {
    let plugin = Plugin::load(table_fixture(Some("FUTURE_MINOR"), Header::Current)).expect("loads");
    let info = plugin.info();
    assert_eq!(info.abi_minor, abi::TP_ABI_MINOR + 1);
    assert!(info.table_size as usize > size_of::<TpEngineApiV1>());
    // The extra entry aborts the process if called; the kit exercises every entry this host knows.
    let report = turnpike_engine_api::conformance::run_plugin(&plugin, &KitOptions::default())
        .expect("runs");
    assert!(report.passed(), "{report}");
}

#[test]
fn entries_beyond_struct_size_are_never_called() {
    let plugin =
        Plugin::load(table_fixture(Some("REQUIRED_ONLY"), Header::Current)).expect("loads");
    let info = plugin.info();
    assert!(
        !info.has_stats && !info.has_health && !info.has_embed,
        "{info:?}"
    );
    let engine = plugin.create("{}").expect("creates");
    assert!(engine.stats().is_err());
    assert!(engine.health().is_ok(), "no health entry means healthy");
    assert!(!engine.supports_embeddings());
    drop(engine);
    let report = turnpike_engine_api::conformance::run_plugin(&plugin, &KitOptions::default())
        .expect("runs");
    assert!(report.passed(), "{report}");
}

#[test]
fn header_compiles_as_cxx() {
    let root = workspace_root();
    let source = root.join("tests/fixtures/c/header_check.cpp");
    let object = c::cxx_object("header_check", &source, &root.join("engine-api/include"));
    assert!(object.exists());
}

fn load_error(variant: &str) -> PluginError {
    Plugin::load(table_fixture(Some(variant), Header::Current)).expect_err("must not load")
}

#[test]
fn unloadable_plugins_are_refused_with_the_reason() {
    let too_small = load_error("TOO_SMALL");
    assert!(
        matches!(too_small, PluginError::BadTable { .. }),
        "{too_small}"
    );
    assert!(
        too_small
            .to_string()
            .contains("does not cover the required entries"),
        "{too_small}"
    );

    for variant in ["MAJOR2", "V2_SYMBOL"] {
        let err = load_error(variant);
        assert!(
            matches!(err, PluginError::AbiMajorMismatch { found: 2, .. }),
            "{variant}: {err}"
        );
        assert!(
            err.to_string().contains("built for engine ABI major 2"),
            "{err}"
        );
    }

    let none = load_error("NO_SYMBOL");
    assert!(matches!(none, PluginError::NotAPlugin { .. }), "{none}");

    let plugin = Plugin::load(table_fixture(Some("CREATE_FAILS"), Header::Current)).expect("loads");
    let err = plugin.create("{}").expect_err("create fails");
    let text = err.to_string();
    assert!(matches!(err, PluginError::CreateFailed { .. }), "{text}");
    assert!(
        text.contains("invalid_config")
            && text.contains("license file /opt/vendor/license.key is missing"),
        "{text}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let text_file = dir.path().join("libnotes.so");
    std::fs::write(&text_file, "these are notes, not a library\n").expect("write");
    let err = Plugin::load(&text_file).expect_err("text is not a library");
    assert!(matches!(err, PluginError::NotALibrary { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with(&text_file.display().to_string()),
        "{err}"
    );

    let err = Plugin::load(dir.path().join("missing.so")).expect_err("missing");
    assert!(matches!(err, PluginError::NotFound { .. }), "{err}");
}
