//! The configuration file as written (TOML), and its validation into [`super::Config`].

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

use super::{Config, DEFAULT_LISTEN, EngineConfig};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    engines: Option<Vec<RawEngine>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default)]
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    #[serde(default)]
    name: Option<String>,
    plugin: String,
    /// Passed to the plugin's `create` as JSON.
    #[serde(default)]
    config: Option<toml::Table>,
}

impl RawConfig {
    /// Validates; relative plugin paths are taken relative to `base` (the file's directory).
    pub(super) fn validate(self, base: &Path) -> Result<Config, String> {
        let listen_text = self.server.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen = listen_text.parse().map_err(|e| {
            format!("server.listen: `{listen_text}` is not an address like 127.0.0.1:8080 ({e})")
        })?;
        let engines = match self.engines {
            None => Config::builtin().engines,
            Some(list) if list.is_empty() => {
                return Err("engines: configure at least one engine (or omit the key for the built-in default)".into());
            }
            Some(list) => {
                let mut names = HashSet::new();
                let mut engines = Vec::with_capacity(list.len());
                for (i, raw) in list.into_iter().enumerate() {
                    let engine = raw
                        .validate(base)
                        .map_err(|e| format!("engines[{i}]: {e}"))?;
                    if !names.insert(engine.name.clone()) {
                        return Err(format!(
                            "engines[{i}]: engine name `{}` is used twice",
                            engine.name
                        ));
                    }
                    engines.push(engine);
                }
                engines
            }
        };
        Ok(Config { listen, engines })
    }
}

impl RawEngine {
    fn validate(self, base: &Path) -> Result<EngineConfig, String> {
        if self.plugin.trim().is_empty() {
            return Err("plugin: the path is empty".into());
        }
        let plugin = base.join(&self.plugin);
        let name = match self.name {
            Some(name) if name.trim().is_empty() => return Err("name: the name is empty".into()),
            Some(name) => name,
            None => default_name(&plugin),
        };
        let config = self.config.unwrap_or_default();
        let config_json = serde_json::to_string(&config)
            .map_err(|e| format!("config: cannot be expressed as JSON: {e}"))?;
        Ok(EngineConfig {
            name,
            plugin,
            config_json,
        })
    }
}

/// `libturnpike_sim.so` -> `turnpike_sim`.
fn default_name(plugin: &Path) -> String {
    let stem = plugin
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem.strip_prefix(std::env::consts::DLL_PREFIX)
        .unwrap_or(&stem)
        .to_string()
}
