//! The built-in default configuration: what `turnpike` serves with no configuration file.
//!
//! It runs the simulator engine found next to the binary and serves one model, `sim`, with the
//! project's own small tokenizer and chat template (`examples/models/sim-small`). Those files are
//! compiled into the binary and written once to a temporary folder, so the default needs no files
//! and no network.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{Config, Defaults, EngineConfig, ModelConfig, ServerConfig, TenancyConfig};
use crate::pipeline::tools::ToolCallFormat;

const MODEL_FILES: [(&str, &str); 3] = [
    (
        "tokenizer.json",
        include_str!("../../../examples/models/sim-small/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_str!("../../../examples/models/sim-small/tokenizer_config.json"),
    ),
    (
        "generation_config.json",
        include_str!("../../../examples/models/sim-small/generation_config.json"),
    ),
];

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

/// Writes the embedded model folder (once; atomically, so concurrent starts agree).
fn model_folder() -> Result<PathBuf, String> {
    let dir =
        std::env::temp_dir().join(format!("turnpike-{}-sim-small", env!("CARGO_PKG_VERSION")));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, contents) in MODEL_FILES {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|existing| existing == contents.as_bytes()) {
            continue;
        }
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, contents)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(dir)
}

/// The id of the end-of-turn token in the embedded tokenizer.
fn end_of_turn() -> Option<u64> {
    let doc: serde_json::Value = serde_json::from_str(MODEL_FILES[0].1).ok()?;
    doc["added_tokens"]
        .as_array()?
        .iter()
        .find(|t| t["content"] == "<|eot_id|>")?["id"]
        .as_u64()
}

/// The built-in engine and model, served at `listen` with the file's (validated) server settings
/// and defaults.
pub(super) fn config(
    listen: SocketAddr,
    server: ServerConfig,
    defaults: Defaults,
    tenancy: TenancyConfig,
) -> Result<Config, String> {
    let folder = model_folder()?;
    let tokenizer: &Path = &folder.join("tokenizer.json");
    let sim = json!({
        "models": [{
            "id": "sim",
            "owned_by": "turnpike",
            "tokenizer": tokenizer,
            "eos_token_id": end_of_turn(),
            "latency": "fast",
            "output": {"mode": "random", "length": [20, 120]},
        }]
    });
    Ok(Config {
        listen,
        server,
        engines: vec![EngineConfig {
            name: "sim".into(),
            plugin: plugin_beside_binary("turnpike_sim"),
            config_json: sim.to_string(),
        }],
        models: Some(vec![ModelConfig {
            name: "sim".into(),
            version: None,
            aliases: Vec::new(),
            engine: "sim".into(),
            engine_model: "sim".into(),
            folder,
            owned_by: Some("turnpike".into()),
            deprecation_date: None,
            context_length: None,
            max_output_tokens: defaults.max_output_tokens,
            // The embedded chat template teaches Llama 3 JSON calls.
            tool_call_parser: Some(ToolCallFormat::Llama3Json),
        }]),
        defaults,
        tenancy,
    })
}
