//! Engines as the gateway sees them: plugins loaded from the configuration, and the registry that
//! maps each served model id to the engine serving it.
//!
//! Loading, the sink -> stream bridge and cancellation live in `turnpike_engine_api::host`; this
//! module adds what belongs to a gateway: many engines, one model namespace, and load errors that
//! name the engine as configured.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use turnpike_engine_api::host::{EngineHandle, Plugin, PluginError};
use turnpike_engine_api::{EngineError, ModelInfo};

use crate::config::EngineConfig;

/// Why the configured engines cannot be started.
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
    /// Two engines serve a model of the same id.
    #[error("model `{model}` is served by both engine `{first}` and engine `{second}`")]
    DuplicateModel {
        /// The model id.
        model: String,
        /// The engine listed first.
        first: String,
        /// The engine listed later.
        second: String,
    },
}

/// A served model and the engine that serves it.
#[derive(Debug, Clone)]
pub struct ServedModel {
    /// What the engine says about the model.
    pub info: ModelInfo,
    /// The engine's configured name.
    pub engine_name: Arc<str>,
    /// The engine.
    pub engine: EngineHandle,
    /// When the engine was loaded (seconds since the Unix epoch).
    pub created: u64,
}

/// Every served model, by id, in configuration order.
#[derive(Debug, Clone, Default)]
pub struct ModelRegistry {
    models: Vec<ServedModel>,
    by_id: HashMap<String, usize>,
}

impl ModelRegistry {
    /// Loads every configured engine and collects their models.
    pub fn load(engines: &[EngineConfig]) -> Result<Self, EngineHostError> {
        let mut registry = Self::default();
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for config in engines {
            let plugin_error = |source| EngineHostError::Plugin {
                engine: config.name.clone(),
                source,
            };
            let plugin = Plugin::load(&config.plugin).map_err(plugin_error)?;
            let engine = plugin.create(&config.config_json).map_err(plugin_error)?;
            let models = engine.models().map_err(|source| EngineHostError::Models {
                engine: config.name.clone(),
                source,
            })?;
            let info = plugin.info();
            tracing::info!(
                engine = %config.name,
                plugin = %info.name,
                version = %info.version,
                abi = %format!("{}.{}", info.abi_major, info.abi_minor),
                models = models.len(),
                "engine loaded"
            );
            let engine_name: Arc<str> = Arc::from(config.name.as_str());
            for model in models {
                registry.add(ServedModel {
                    info: model,
                    engine_name: Arc::clone(&engine_name),
                    engine: engine.clone(),
                    created,
                })?;
            }
        }
        Ok(registry)
    }

    fn add(&mut self, model: ServedModel) -> Result<(), EngineHostError> {
        if let Some(&i) = self.by_id.get(&model.info.id) {
            return Err(EngineHostError::DuplicateModel {
                model: model.info.id,
                first: self.models[i].engine_name.to_string(),
                second: model.engine_name.to_string(),
            });
        }
        self.by_id.insert(model.info.id.clone(), self.models.len());
        self.models.push(model);
        Ok(())
    }

    /// The model with this id.
    pub fn get(&self, id: &str) -> Option<&ServedModel> {
        self.by_id.get(id).map(|&i| &self.models[i])
    }

    /// Every model, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &ServedModel> {
        self.models.iter()
    }

    /// The number of models.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether no model is served.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}
