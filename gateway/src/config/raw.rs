//! The configuration file as written (TOML), and its validation into [`super::Config`].

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::{
    CanaryConfig, Config, DEFAULT_LISTEN, Defaults, EngineConfig, EngineTarget, ModelConfig,
    StructuredOutput,
};
use crate::engine_host::settings::{MODEL_ID_RULE, is_date, is_model_id};
use crate::text::reasoning::ReasoningMarkers;
use crate::text::tools::ToolCallFormat;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    server: super::raw_server::RawServer,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    engines: Option<Vec<RawEngine>>,
    #[serde(default)]
    models: Option<Vec<RawModel>>,
    #[serde(default)]
    auth: Option<crate::tenancy::settings::RawAuth>,
    #[serde(default)]
    plans: std::collections::BTreeMap<String, crate::tenancy::settings::RawLimits>,
    #[serde(default)]
    tenants: std::collections::BTreeMap<String, crate::tenancy::settings::RawLimits>,
    #[serde(default)]
    state: crate::tenancy::settings::RawState,
    #[serde(default)]
    idempotency: crate::tenancy::settings::RawIdempotency,
    #[serde(default)]
    queue: crate::tenancy::settings::RawQueue,
    #[serde(default)]
    metrics: crate::observability::metrics::RawMetrics,
    #[serde(default)]
    logging: crate::observability::RawLogging,
    #[serde(default)]
    tracing: Option<crate::observability::traces::RawTracing>,
    #[serde(default)]
    admin: crate::admin::settings::RawAdmin,
    #[serde(default)]
    plugins: Vec<crate::plugins::settings::RawPlugin>,
    #[serde(default)]
    spend: crate::spend::settings::RawSpend,
    #[serde(default)]
    files: crate::files::settings::RawFiles,
    #[serde(default)]
    batches: crate::batches::settings::RawBatches,
}

/// The seed's suggested defaults (section 18).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawDefaults {
    max_request_tokens: u32,
    max_output_tokens: u32,
    temperature: f32,
    top_p: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    tool_call_parser: Option<ToolCallFormat>,
}

impl Default for RawDefaults {
    fn default() -> Self {
        Self {
            max_request_tokens: 8192,
            max_output_tokens: 1024,
            temperature: 0.7,
            top_p: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            tool_call_parser: None,
        }
    }
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    engine: String,
    #[serde(default)]
    engine_model: Option<String>,
    folder: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    owned_by: Option<String>,
    #[serde(default)]
    deprecation_date: Option<String>,
    #[serde(default)]
    context_length: Option<u32>,
    #[serde(default)]
    max_output_tokens: Option<u32>,
    #[serde(default)]
    tool_call_parser: Option<ToolCallFormat>,
    #[serde(default)]
    reasoning: Option<ReasoningMarkers>,
    #[serde(default)]
    structured_output: StructuredOutput,
    #[serde(default)]
    standby: Vec<RawTarget>,
    #[serde(default)]
    canary: Option<RawCanary>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    engine: String,
    #[serde(default)]
    engine_model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    engine: String,
    #[serde(default)]
    engine_model: Option<String>,
    #[serde(default)]
    percent: u32,
    #[serde(default)]
    tenants: Vec<String>,
}

impl RawConfig {
    /// Validates; relative paths are taken relative to `base` (the file's directory).
    pub(super) fn validate(self, base: &Path) -> Result<Config, String> {
        let listen_text = self.server.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen = listen_text.parse().map_err(|e| {
            format!("server.listen: `{listen_text}` is not an address like 127.0.0.1:8080 ({e})")
        })?;
        let server = self.server.validate(base)?;
        let defaults = self.defaults.validate()?;
        let metrics = self.metrics.validate();
        let logging = self.logging.validate()?;
        let tracing = self.tracing.map(|t| t.validate()).transpose()?;
        let tenancy = crate::tenancy::settings::RawTenancy {
            auth: self.auth,
            plans: self.plans,
            tenants: self.tenants,
            state: self.state,
            idempotency: self.idempotency,
            queue: self.queue,
            spend: self.spend,
        }
        .validate(base, self.engines.is_none())?;
        let client_ca = server
            .tls
            .as_ref()
            .is_some_and(|t| t.client_ca_file.is_some());
        let admin = self
            .admin
            .validate(base, tenancy.auth_required, client_ca, &|name| {
                std::env::var(name).ok()
            })?;
        let plugins = validate_plugins(self.plugins, base)?;
        let files = self.files.validate(base)?;
        let batches = self.batches.validate()?;
        let Some(raw_engines) = self.engines else {
            if self.models.is_some() {
                return Err("models: listed without [[engines]] to serve them".into());
            }
            return super::builtin::config(listen, server, defaults, tenancy)
                .map(|config| Config {
                    metrics,
                    logging,
                    tracing,
                    admin,
                    plugins,
                    files,
                    batches,
                    ..config
                })
                .map_err(|e| format!("built-in default: {e}"));
        };
        if raw_engines.is_empty() {
            return Err(
                "engines: configure at least one engine (or omit the key for the built-in default)"
                    .into(),
            );
        }
        let mut names = HashSet::new();
        let mut engines = Vec::with_capacity(raw_engines.len());
        for (i, raw) in raw_engines.into_iter().enumerate() {
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
        let models = match self.models {
            None => None,
            Some(list) => Some(validate_models(list, &names, base, &defaults)?),
        };
        Ok(Config {
            listen,
            server,
            defaults,
            engines,
            models,
            tenancy,
            metrics,
            logging,
            tracing,
            admin,
            plugins,
            files,
            batches,
        })
    }
}

fn validate_plugins(
    raw: Vec<crate::plugins::settings::RawPlugin>,
    base: &Path,
) -> Result<Vec<crate::plugins::settings::PluginConfig>, String> {
    let to_json = |table: toml::Table| {
        let mut value = toml::Value::Table(table);
        expand_config_dir(&mut value, base);
        serde_json::to_string(&value)
            .map_err(|e| format!("config: cannot be expressed as JSON: {e}"))
    };
    let mut names = HashSet::new();
    let mut plugins = Vec::with_capacity(raw.len());
    for (i, plugin) in raw.into_iter().enumerate() {
        let plugin = plugin
            .validate(base, &to_json)
            .map_err(|e| format!("plugins[{i}]: {e}"))?;
        if !names.insert(plugin.name.clone()) {
            return Err(format!(
                "plugins[{i}]: plugin name `{}` is used twice",
                plugin.name
            ));
        }
        plugins.push(plugin);
    }
    Ok(plugins)
}

impl RawDefaults {
    fn validate(&self) -> Result<Defaults, String> {
        if self.max_request_tokens == 0 || self.max_output_tokens == 0 {
            return Err(
                "defaults: max_request_tokens and max_output_tokens must be greater than 0".into(),
            );
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(format!(
                "defaults.temperature must be in [0, 2], got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!(
                "defaults.top_p must be in (0, 1], got {}",
                self.top_p
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(format!("defaults.{name} must be in [-2, 2], got {v}"));
            }
        }
        Ok(Defaults {
            max_request_tokens: self.max_request_tokens,
            max_output_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            tool_call_parser: self.tool_call_parser,
        })
    }
}

fn validate_models(
    list: Vec<RawModel>,
    engines: &HashSet<String>,
    base: &Path,
    defaults: &Defaults,
) -> Result<Vec<ModelConfig>, String> {
    if list.is_empty() {
        return Err(
            "models: list at least one model (or omit the key to serve every engine model)".into(),
        );
    }
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut models = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let at = format!("models[{i}] (`{}`)", m.name);
        if !is_model_id(&m.name) {
            return Err(format!(
                "models[{i}].name: `{}` is not a usable model name ({MODEL_ID_RULE})",
                m.name
            ));
        }
        if let Some(alias) = m.aliases.iter().find(|a| !is_model_id(a)) {
            return Err(format!(
                "{at}.aliases: `{alias}` is not a usable model name ({MODEL_ID_RULE})"
            ));
        }
        if !engines.contains(&m.engine) {
            return Err(format!("{at}.engine: no engine named `{}`", m.engine));
        }
        for (key, date) in [
            ("version", &m.version),
            ("deprecation_date", &m.deprecation_date),
        ] {
            if let Some(d) = date
                && !is_date(d)
            {
                return Err(format!("{at}.{key}: `{d}` is not a date like 2026-01-31"));
            }
        }
        if let Some(r) = &m.reasoning
            && (r.start.is_empty() || r.end.is_empty() || r.start == r.end)
        {
            return Err(format!(
                "{at}.reasoning: start and end must be two different non-empty markers"
            ));
        }
        if m.context_length == Some(0) || m.max_output_tokens == Some(0) {
            return Err(format!(
                "{at}: context_length and max_output_tokens must be greater than 0"
            ));
        }
        let pinned = m.version.as_ref().map(|v| format!("{}-{v}", m.name));
        // Each model answers to its pinned id (or its name) and its aliases; a versioned model's
        // bare name is shared by its versions and resolves to the newest.
        for id in pinned
            .iter()
            .chain(m.version.is_none().then_some(&m.name))
            .chain(&m.aliases)
        {
            if let Some(other) = ids.insert(id.clone(), i) {
                return Err(format!(
                    "{at}: the name `{id}` is also used by models[{other}]"
                ));
            }
        }
        let engine_model = m.engine_model.unwrap_or_else(|| m.name.clone());
        let target = |engine: String, id: Option<String>| EngineTarget {
            engine,
            engine_model: id.unwrap_or_else(|| engine_model.clone()),
        };
        let standby: Vec<EngineTarget> = m
            .standby
            .into_iter()
            .map(|t| target(t.engine, t.engine_model))
            .collect();
        let canary = match m.canary {
            Some(c) if c.percent > 100 => {
                return Err(format!("{at}.canary.percent must be 0..=100"));
            }
            Some(c) if c.percent == 0 && c.tenants.is_empty() => {
                return Err(format!(
                    "{at}.canary takes no traffic: give percent or tenants"
                ));
            }
            Some(c) => Some(CanaryConfig {
                target: target(c.engine, c.engine_model),
                percent: c.percent,
                tenants: c.tenants,
            }),
            None => None,
        };
        models.push(ModelConfig {
            engine_model,
            standby,
            canary,
            folder: base.join(&m.folder),
            max_output_tokens: m.max_output_tokens.unwrap_or(defaults.max_output_tokens),
            name: m.name,
            version: m.version,
            aliases: m.aliases,
            engine: m.engine,
            owned_by: m.owned_by,
            deprecation_date: m.deprecation_date,
            context_length: m.context_length,
            tool_call_parser: m.tool_call_parser,
            reasoning: m.reasoning,
            structured_output: m.structured_output,
        });
    }
    // A versioned model's bare name floats to its newest version: no other model may claim it.
    for m in models.iter().filter(|m| m.version.is_some()) {
        if let Some(other) = ids.get(&m.name) {
            return Err(format!(
                "the name `{}` floats to the newest version of a versioned model but is also used by models[{other}]",
                m.name
            ));
        }
    }
    Ok(models)
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
        let mut config = toml::Value::Table(self.config.unwrap_or_default());
        expand_config_dir(&mut config, base);
        let config_json = serde_json::to_string(&config)
            .map_err(|e| format!("config: cannot be expressed as JSON: {e}"))?;
        Ok(EngineConfig {
            name,
            plugin,
            config_json,
        })
    }
}

/// Replaces `${config_dir}` in every string of a plugin's configuration with the directory of
/// the configuration file: the gateway cannot know which of a plugin's values are paths.
fn expand_config_dir(value: &mut toml::Value, base: &Path) {
    match value {
        toml::Value::String(s) if s.contains("${config_dir}") => {
            *s = s.replace("${config_dir}", &base.to_string_lossy());
        }
        toml::Value::Array(items) => items.iter_mut().for_each(|v| expand_config_dir(v, base)),
        toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| expand_config_dir(v, base)),
        _ => {}
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

#[cfg(test)]
mod tests {
    use super::is_date;

    #[test]
    fn dates() {
        assert!(is_date("2026-11-01"));
        for bad in [
            "2026-13-01",
            "2026-1-01",
            "20261101",
            "2026-11-32",
            "abcd-ef-gh",
        ] {
            assert!(!is_date(bad), "{bad}");
        }
    }
}
