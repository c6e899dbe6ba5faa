//! `[[plugins]]`: gateway plugins to load, each attached to some models and tenants, run in the
//! order written. Validated here; the configuration composes it.
//!
//! ```toml
//! [[plugins]]
//! name = "redact"                       # defaults to the library's file stem
//! library = "plugins/libturnpike_plugin_redact.so"
//! models = ["*"]                        # which models it sees (default: all)
//! tenants = ["acme"]                    # which tenants (default: all)
//! failure = "closed"                    # a failing hook fails the request (or "open": skip it)
//! timeout_ms = 1000                     # most a guard may take
//! tool_timeout_ms = 30000               # most a server tool call may take
//! tool_result_tokens = 4096             # most tokens of a tool's answer the model sees
//! [plugins.config]                      # given to the plugin's create, as JSON
//! emails = true
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::tenancy::NameSet;

/// What a hook's failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The request fails (503 `plugin_unavailable`, or the stream ends with it).
    Closed,
    /// The hook is skipped and logged.
    Open,
}

/// One plugin to load.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// Its name in logs, metrics and traces.
    pub name: String,
    /// The shared library.
    pub library: PathBuf,
    /// Its configuration, as JSON.
    pub config_json: String,
    /// The models it sees.
    pub models: NameSet,
    /// The tenants it sees.
    pub tenants: NameSet,
    /// What its failure does.
    pub failure: OnFailure,
    /// Most a guard may take.
    pub timeout: Duration,
    /// Most a tool call may take.
    pub tool_timeout: Duration,
    /// Most tokens of a tool's answer the model is shown (the rest is cut, and the answer says
    /// so).
    pub tool_result_tokens: usize,
}

/// `[[plugins]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlugin {
    #[serde(default)]
    name: Option<String>,
    library: String,
    #[serde(default)]
    config: Option<toml::Table>,
    #[serde(default)]
    models: Option<Vec<String>>,
    #[serde(default)]
    tenants: Option<Vec<String>>,
    #[serde(default)]
    failure: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    tool_timeout_ms: Option<u64>,
    #[serde(default)]
    tool_result_tokens: Option<usize>,
}

impl RawPlugin {
    /// Validates; `to_json` turns the config table into JSON (with `${config_dir}` expanded).
    pub fn validate(
        self,
        base: &Path,
        to_json: &dyn Fn(toml::Table) -> Result<String, String>,
    ) -> Result<PluginConfig, String> {
        if self.library.trim().is_empty() {
            return Err("library: the path is empty".into());
        }
        let library = base.join(&self.library);
        let name = match self.name {
            Some(name) => name,
            None => library
                .file_stem()
                .map(|s| s.to_string_lossy().trim_start_matches("lib").to_string())
                .unwrap_or_default(),
        };
        crate::tenancy::settings::check_name("plugin", &name)?;
        let failure = match self.failure.as_deref() {
            None | Some("closed") => OnFailure::Closed,
            Some("open") => OnFailure::Open,
            Some(other) => return Err(format!("failure: `{other}` is not \"closed\" or \"open\"")),
        };
        let timeout = self.timeout_ms.unwrap_or(1000);
        let tool_timeout = self.tool_timeout_ms.unwrap_or(30_000);
        if timeout == 0 || tool_timeout == 0 {
            return Err("timeout_ms and tool_timeout_ms must be greater than 0".into());
        }
        let tool_result_tokens = self.tool_result_tokens.unwrap_or(4096);
        if !(16..=1_000_000).contains(&tool_result_tokens) {
            return Err("tool_result_tokens must be 16 to 1000000".into());
        }
        let list = |l: Option<Vec<String>>| l.as_deref().map_or(NameSet::All, NameSet::from_list);
        Ok(PluginConfig {
            name,
            library,
            config_json: to_json(self.config.unwrap_or_default())?,
            models: list(self.models),
            tenants: list(self.tenants),
            failure,
            timeout: Duration::from_millis(timeout),
            tool_timeout: Duration::from_millis(tool_timeout),
            tool_result_tokens,
        })
    }
}
