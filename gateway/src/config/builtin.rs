//! The built-in default configuration: what `turnpike` serves with no configuration file.
//!
//! It runs the default engine found next to the binary (`libturnpike_cuda.so`, device `auto`)
//! and serves one model, `tiny`: the engine's smallest preset, made on first start into the
//! user's cache folder (`$XDG_CACHE_HOME/turnpike/models`, else `~/.cache/...`) with the
//! project's own tokenizer and chat template. So the default needs no files and no network.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::json;
use turnpike_tools::model as make;

use super::{Config, Defaults, EngineConfig, ModelConfig, ServerConfig, TenancyConfig};
use crate::text::tools::ToolCallFormat;

/// The preset the built-in default serves.
const MODEL: &str = "tiny";

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

/// The built-in engine and model, served at `listen` with the file's (validated) server settings
/// and defaults.
pub(super) fn config(
    listen: SocketAddr,
    server: ServerConfig,
    defaults: Defaults,
    tenancy: TenancyConfig,
) -> Result<Config, String> {
    let tiny = make::preset(MODEL).ok_or_else(|| format!("no preset `{MODEL}`"))?;
    let folder =
        make::cached_model(&tiny, 0).map_err(|e| format!("making model `{MODEL}`: {e}"))?;
    let engine = json!({
        "models": [{"id": MODEL, "path": folder, "owned_by": "turnpike", "device": "auto"}]
    });
    Ok(Config {
        listen,
        server,
        metrics: Default::default(),
        logging: Default::default(),
        tracing: None,
        admin: None,
        plugins: Vec::new(),
        files: Default::default(),
        batches: Default::default(),
        engines: vec![EngineConfig {
            name: "default".into(),
            plugin: plugin_beside_binary("turnpike_cuda"),
            config_json: engine.to_string(),
        }],
        models: Some(vec![ModelConfig {
            name: MODEL.into(),
            version: None,
            aliases: Vec::new(),
            engine: "default".into(),
            engine_model: MODEL.into(),
            folder,
            owned_by: Some("turnpike".into()),
            deprecation_date: None,
            context_length: None,
            max_output_tokens: defaults.max_output_tokens,
            // The embedded chat template teaches Llama 3 JSON calls.
            tool_call_parser: Some(ToolCallFormat::Llama3Json),
            reasoning: None,
            structured_output: Default::default(),
            standby: Vec::new(),
            canary: None,
        }]),
        defaults,
        tenancy,
    })
}
