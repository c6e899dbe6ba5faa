//! Engines as the gateway sees them: plugins loaded from the configuration behind the
//! [`Backend`] trait, and the [`ModelRegistry`] of public model ids.
//!
//! Loading, the sink -> stream bridge and cancellation of a single plugin live in
//! `turnpike_engine_api::host`; this module adds what belongs to a gateway: many engines, one
//! model namespace with aliases and pinned versions, and load errors that name what the operator
//! configured.

pub mod backend;
mod failover;
pub mod model_map;
pub mod models;
pub mod routed;
pub mod sampling;
pub mod settings;

use std::path::Path;
use std::sync::Arc;

use turnpike_engine_api::host::{Plugin, PluginError};
use turnpike_engine_api::{EngineError, ModelInfo};

pub use backend::{Backend, EngineRun, PluginBackend};
pub use model_map::ModelMap;
pub use models::{ListedModel, ModelRegistry, ServedModel};
pub use sampling::ModelSampling;

pub use settings::{Defaults, EngineConfig, ModelConfig, StructuredOutput};

/// Why the configured engines or models cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum EngineHostError {
    /// The plugin cannot be loaded or its engine created.
    #[error("engine `{engine}`: {source}")]
    Plugin {
        /// The engine's configured name.
        engine: String,
        /// What went wrong.
        #[source]
        source: PluginError,
    },
    /// The engine was created but cannot list its models.
    #[error("engine `{engine}`: models failed: {source}")]
    Models {
        /// The engine's configured name.
        engine: String,
        /// What went wrong.
        #[source]
        source: EngineError,
    },
    /// A configured model cannot be served.
    #[error("model `{model}`: {message}")]
    Model {
        /// The model's configured name.
        model: String,
        /// What is wrong.
        message: String,
    },
    /// Engines list models, but none of them can be served (none names a tokenizer).
    #[error(
        "no model is served: {models} name no tokenizer (put the model's tokenizer.json beside it, or configure [[models]] with a tokenizer folder)"
    )]
    NothingServed {
        /// The engine models, as `engine/model`.
        models: String,
    },
    /// Two models claim the same public id.
    #[error("the model id `{model}` is served twice")]
    DuplicateModel {
        /// The id.
        model: String,
    },
}

/// Loads every configured engine plugin and builds the model registry.
pub fn load(
    plugins: &[EngineConfig],
    models: Option<&[ModelConfig]>,
    defaults: &Defaults,
) -> Result<ModelRegistry, EngineHostError> {
    let mut engines: Vec<(String, Arc<dyn Backend>)> = Vec::new();
    for engine in plugins {
        let plugin_error = |source| EngineHostError::Plugin {
            engine: engine.name.clone(),
            source,
        };
        let plugin = Plugin::load(&engine.plugin).map_err(plugin_error)?;
        let handle = plugin.create(&engine.config_json).map_err(plugin_error)?;
        let info = plugin.info();
        tracing::info!(
            engine = %engine.name,
            plugin = %info.name,
            version = %info.version,
            abi = %format!("{}.{}", info.abi_major, info.abi_minor),
            "engine loaded"
        );
        engines.push((engine.name.clone(), PluginBackend::shared(handle)));
    }
    load_with(engines, models, defaults)
}

/// Builds the model registry over ready engines (plugins, or fakes in tests). Without `models`,
/// every engine model that names its tokenizer is served under its own id.
pub fn load_with(
    engines: Vec<(String, Arc<dyn Backend>)>,
    models: Option<&[ModelConfig]>,
    defaults: &Defaults,
) -> Result<ModelRegistry, EngineHostError> {
    let mut catalogue = Vec::with_capacity(engines.len());
    for (name, backend) in &engines {
        let list = backend.models().map_err(|source| EngineHostError::Models {
            engine: name.clone(),
            source,
        })?;
        catalogue.push((name.clone(), list));
    }
    let configs: Vec<ModelConfig> = match models {
        Some(list) => list
            .iter()
            .map(|m| ModelConfig {
                tool_call_parser: m.tool_call_parser.or(defaults.tool_call_parser),
                ..m.clone()
            })
            .collect(),
        None => catalogue
            .iter()
            .flat_map(|(engine, list)| list.iter().map(move |m| (engine, m)))
            .filter_map(|(engine, m)| {
                let folder = Path::new(m.tokenizer.as_deref()?).parent()?.to_path_buf();
                Some(ModelConfig {
                    name: m.id.clone(),
                    version: None,
                    aliases: Vec::new(),
                    engine: engine.clone(),
                    engine_model: m.id.clone(),
                    folder,
                    owned_by: m.owned_by.clone(),
                    deprecation_date: None,
                    context_length: None,
                    max_output_tokens: defaults.max_output_tokens,
                    tool_call_parser: defaults.tool_call_parser,
                    reasoning: None,
                    structured_output: Default::default(),
                    standby: Vec::new(),
                    canary: None,
                })
            })
            .collect(),
    };
    let mut served = Vec::with_capacity(configs.len());
    for config in configs {
        let (backend, list) = engines
            .iter()
            .zip(&catalogue)
            .find(|((name, _), _)| *name == config.engine)
            .map(|((_, backend), (_, list))| (backend, list))
            .ok_or_else(|| EngineHostError::Model {
                model: config.name.clone(),
                message: format!("no engine named `{}`", config.engine),
            })?;
        let backend =
            routed_backend(&config, backend, list, &engines, &catalogue).map_err(|message| {
                EngineHostError::Model {
                    model: config.name.clone(),
                    message,
                }
            })?;
        let model = models::served_model(&config, &backend, list).map_err(|message| {
            EngineHostError::Model {
                model: config.name.clone(),
                message,
            }
        })?;
        tracing::info!(model = %model.id, engine = %config.engine, context = model.context_length, "model ready");
        served.push((config, model));
    }
    let untokenized: Vec<String> = catalogue
        .iter()
        .flat_map(|(engine, list)| list.iter().map(move |m| (engine, m)))
        .filter(|(_, m)| m.tokenizer.is_none())
        .map(|(engine, m)| format!("`{engine}/{}`", m.id))
        .collect();
    if served.is_empty() && models.is_none() && !untokenized.is_empty() {
        // A gateway that lists nothing would answer every request 404; refuse to start.
        return Err(EngineHostError::NothingServed {
            models: untokenized.join(", "),
        });
    }
    if served.is_empty() {
        tracing::warn!(
            "no model is served: configure [[models]], or engines whose models name a tokenizer"
        );
    }
    ModelRegistry::build(engines, served)
}

/// The model's engine, or, with standbys or a canary, a [`routed::RoutedBackend`] over them;
/// each target must serve the model's id with the same vocabulary.
fn routed_backend(
    config: &ModelConfig,
    primary: &Arc<dyn Backend>,
    primary_list: &[ModelInfo],
    engines: &[(String, Arc<dyn Backend>)],
    catalogue: &[(String, Vec<ModelInfo>)],
) -> Result<Arc<dyn Backend>, String> {
    if config.standby.is_empty() && config.canary.is_none() {
        return Ok(Arc::clone(primary));
    }
    let vocab = primary_list
        .iter()
        .find(|m| m.id == config.engine_model)
        .map(|m| m.vocab_size);
    let target = |t: &settings::EngineTarget, role: &str| -> Result<routed::Target, String> {
        let (backend, list) = engines
            .iter()
            .zip(catalogue)
            .find(|((name, _), _)| *name == t.engine)
            .map(|((_, backend), (_, list))| (backend, list))
            .ok_or_else(|| format!("{role}: no engine named `{}`", t.engine))?;
        let info = list
            .iter()
            .find(|m| m.id == t.engine_model)
            .ok_or_else(|| {
                format!(
                    "{role}: engine `{}` has no model `{}`",
                    t.engine, t.engine_model
                )
            })?;
        if vocab.is_some_and(|v| v != info.vocab_size) {
            return Err(format!(
                "{role}: `{}` on `{}` has another vocabulary than the model's own",
                t.engine_model, t.engine
            ));
        }
        Ok(routed::Target {
            engine: t.engine.clone(),
            backend: Arc::clone(backend),
            engine_model: t.engine_model.clone(),
        })
    };
    let primary = target(
        &settings::EngineTarget {
            engine: config.engine.clone(),
            engine_model: config.engine_model.clone(),
        },
        "engine",
    )?;
    let standby = config
        .standby
        .iter()
        .map(|t| target(t, "standby"))
        .collect::<Result<Vec<_>, _>>()?;
    let canary = config
        .canary
        .as_ref()
        .map(|c| {
            Ok::<_, String>(routed::Canary {
                target: target(&c.target, "canary")?,
                percent: c.percent,
                tenants: c.tenants.clone(),
            })
        })
        .transpose()?;
    Ok(Arc::new(routed::RoutedBackend::new(
        config.name.clone(),
        primary,
        standby,
        canary,
    )))
}
