//! Test support: real artifacts for black-box tests.
//!
//! Plugins and the `turnpike` binary are built by running cargo for them (same target directory
//! and profile as the tests), so a test always runs what the sources say, never a stale library.
//! C fixtures are compiled with the `cc` crate against the checked-in header (or a frozen one).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

pub mod c;
pub mod http;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `target/<profile>` of the running test binary (which lives in `target/<profile>/deps`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    profile_dir()
        .parent()
        .expect("target/<profile>")
        .to_path_buf()
}

/// Builds the workspace with cargo (once per test process) and returns `package`'s artifact
/// named `file_name`. The whole workspace, not `-p package`: one package alone unifies its
/// dependencies' features differently, so cargo would build them all again for each package
/// (minutes on a small machine), where after `cargo build --workspace` this is a no-op.
fn cargo_artifact(package: &str, file_name: &str) -> PathBuf {
    static BUILT: OnceLock<Vec<PathBuf>> = OnceLock::new();
    let files = BUILT.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "--quiet",
            "--message-format=json-render-diagnostics",
            "--workspace",
        ])
        .arg("--target-dir")
        .arg(target_dir())
        .current_dir(workspace_root());
        // Cargo gives a test process its package's variables (`CARGO_MANIFEST_DIR`, `OUT_DIR`,
        // ...). Build scripts that watch one (ring's does) would rerun here and again in the
        // next plain `cargo build`, rebuilding the gateway both times: build as a shell would.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(is_package_variable) {
                cmd.env_remove(name);
            }
        }
        if profile_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo");
        assert!(
            out.status.success(),
            "cargo build --workspace failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut files = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] != "compiler-artifact" {
                continue;
            }
            let names = msg["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p.as_str());
            files.extend(names.chain(msg["executable"].as_str()).map(PathBuf::from));
        }
        files
    });
    files
        .iter()
        .find(|f| f.file_name().is_some_and(|n| n == file_name))
        .cloned()
        .unwrap_or_else(|| panic!("cargo built no `{file_name}` for {package}"))
}

/// A variable cargo sets for one package's build or test process, not a setting of cargo.
fn is_package_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "OUT_DIR"
                | "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
        )
}

fn cdylib(package: &str, lib_name: &str) -> PathBuf {
    let suffix = format!(
        "{}{lib_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    cargo_artifact(package, &suffix)
}

/// The simulator plugin.
pub fn sim_plugin() -> PathBuf {
    cdylib("turnpike-sim", "turnpike_sim")
}

/// The default engine's plugin.
pub fn cuda_plugin() -> PathBuf {
    cdylib("turnpike-cuda", "turnpike_cuda")
}

/// A `tiny` model folder, made once by `turnpike make-model` under the target folder.
pub fn tiny_model() -> PathBuf {
    static MADE: OnceLock<PathBuf> = OnceLock::new();
    MADE.get_or_init(|| {
        let dir = target_dir().join("test-models").join("tiny");
        if !dir.join("config.json").exists() {
            let out = Command::new(turnpike_bin())
                .args(["make-model", "--preset", "tiny", "--out"])
                .arg(&dir)
                .output()
                .expect("run turnpike make-model");
            // Another test process may have made it first.
            assert!(
                out.status.success() || dir.join("config.json").exists(),
                "make-model failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
    .clone()
}

/// The Rust example plugin.
pub fn rust_example_plugin() -> PathBuf {
    cdylib("turnpike-example-engine", "turnpike_example_engine")
}

/// The fault-injecting test plugin.
pub fn faulty_plugin() -> PathBuf {
    cdylib("turnpike-faulty-plugin", "turnpike_faulty_plugin")
}

/// A shipped gateway plugin (`plugins/NAME`).
pub fn gateway_plugin(name: &str) -> PathBuf {
    cdylib(
        &format!("turnpike-plugin-{name}"),
        &format!("turnpike_plugin_{name}"),
    )
}

/// The rule-breaking gateway plugin.
pub fn faulty_gateway_plugin() -> PathBuf {
    cdylib(
        "turnpike-faulty-gateway-plugin",
        "turnpike_faulty_gateway_plugin",
    )
}

/// The C example gateway plugin, compiled against the checked-in header.
pub fn c_gateway_plugin() -> PathBuf {
    let root = workspace_root();
    c::shared_library(
        "mild_words",
        &[root.join("examples/c-gateway-plugin/mild_words.c")],
        &root.join("plugin-api/include"),
        &[],
    )
}

/// The C example plugin, compiled against the checked-in header.
pub fn c_example_plugin() -> PathBuf {
    let root = workspace_root();
    c::shared_library(
        "echo_c",
        &[root.join("examples/c-engine/echo_engine.c")],
        &root.join("engine-api/include"),
        &[],
    )
}

/// Headers a C fixture can be built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// `engine-api/include`, today's.
    Current,
    /// `tests/abi/v1_0`, frozen at release.
    V1_0,
}

impl Header {
    /// The include directory.
    pub fn dir(self) -> PathBuf {
        match self {
            Self::Current => workspace_root().join("engine-api/include"),
            Self::V1_0 => workspace_root().join("tests/abi/v1_0"),
        }
    }
}

/// `tests/fixtures/c/table_variants.c` built as a plugin, with `-DVARIANT_<variant>` when given.
pub fn table_fixture(variant: Option<&str>, header: Header) -> PathBuf {
    let suffix = if header == Header::V1_0 { "_v1_0" } else { "" };
    let name = format!(
        "fixture_{}{suffix}",
        variant.unwrap_or("full").to_lowercase()
    );
    let define = variant.map(|v| format!("VARIANT_{v}"));
    let defines: Vec<&str> = define.as_deref().into_iter().collect();
    let source = workspace_root().join("tests/fixtures/c/table_variants.c");
    c::shared_library(&name, &[source], &header.dir(), &defines)
}

/// The `turnpike` binary (the simulator is built too: it is the built-in default engine).
pub fn turnpike_bin() -> PathBuf {
    sim_plugin();
    cuda_plugin();
    cargo_artifact(
        "turnpike",
        &format!("turnpike{}", std::env::consts::EXE_SUFFIX),
    )
}

/// How long tests wait for an event that should come promptly.
pub const PATIENCE: Duration = Duration::from_secs(20);
