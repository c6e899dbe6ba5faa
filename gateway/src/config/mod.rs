//! Gateway configuration: the raw TOML document ([`raw`]) and the validated [`Config`] made from
//! it in one step. Unknown keys are errors; nothing downstream re-checks what is validated here.
//!
//! With no file, [`Config::builtin`] is the built-in default: listen on loopback, and run the
//! simulator engine from the directory of the `turnpike` binary.

mod raw;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
        /// The file.
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
    /// Engine plugins to load, in order.
    pub engines: Vec<EngineConfig>,
}

/// One engine plugin to load.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// A label for logs and metrics.
    pub name: String,
    /// The plugin library.
    pub plugin: PathBuf,
    /// The configuration given to the plugin's `create`, as JSON.
    pub config_json: String,
}

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

impl Config {
    /// The built-in default: loopback, the simulator engine next to the binary.
    pub fn builtin() -> Self {
        Self {
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8080))),
            engines: vec![EngineConfig {
                name: "sim".into(),
                plugin: plugin_beside_binary("turnpike_sim"),
                config_json: "{}".into(),
            }],
        }
    }

    /// Reads and validates a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Validates TOML text; `path` names the source in errors and anchors relative paths.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: raw::RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        raw.validate(path.parent().unwrap_or(Path::new(".")))
            .map_err(|message| ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            })
    }
}

/// `lib<name>.so` (or the platform's equivalent) in the directory of the running binary.
pub fn plugin_beside_binary(name: &str) -> PathBuf {
    let file = format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&file)))
        .unwrap_or_else(|| PathBuf::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, Path::new("/etc/turnpike/turnpike.toml"))
    }

    #[test]
    fn full_config() {
        let config = parse(
            r#"
            [server]
            listen = "0.0.0.0:9000"

            [[engines]]
            name = "sim"
            plugin = "plugins/libturnpike_sim.so"
            config = { seed = 3, models = [{ id = "a", latency = "fast" }] }
            "#,
        )
        .expect("valid");
        assert_eq!(config.listen, "0.0.0.0:9000".parse().expect("addr"));
        assert_eq!(
            config.engines[0].plugin,
            Path::new("/etc/turnpike/plugins/libturnpike_sim.so")
        );
        let json: serde_json::Value =
            serde_json::from_str(&config.engines[0].config_json).expect("json");
        assert_eq!(json["models"][0]["latency"], "fast");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        for (text, needle) in [
            (
                "[server]\nlisten = \"127.0.0.1:1\"\nport = 3\n",
                "unknown field `port`",
            ),
            ("[server]\nlisten = \"nowhere\"\n", "server.listen"),
            (
                "[[engines]]\nplugin = \"a.so\"\nflavour = 1\n",
                "unknown field `flavour`",
            ),
            (
                "[[engines]]\nname = \"x\"\nplugin = \"a.so\"\n[[engines]]\nname = \"x\"\nplugin = \"b.so\"\n",
                "engine name `x`",
            ),
            ("engines = []\n", "at least one engine"),
        ] {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "`{err}` should mention `{needle}`");
        }
    }

    #[test]
    fn builtin_runs_the_simulator() {
        let config = Config::builtin();
        assert_eq!(config.engines.len(), 1);
        assert!(
            config.engines[0]
                .plugin
                .to_string_lossy()
                .contains("turnpike_sim")
        );
    }
}
