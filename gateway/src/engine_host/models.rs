//! Served models: each public id (name, pinned `name-YYYY-MM-DD`, alias) resolved to an engine,
//! the engine's id for the model, and the model folder's tokenizer and chat template.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use turnpike_engine_api::ModelInfo;

use super::EngineHostError;
use super::backend::Backend;
use super::model_map::ModelMap;
use super::settings::ModelConfig;
use crate::text::template::ChatTemplate;
use crate::text::tokenizer::TextTokenizer;
use crate::text::tools::ToolCallFormat;

/// Prompts each model keeps the token ids of, and the bytes they may take.
const PROMPT_CACHE_ENTRIES: usize = 4096;
const PROMPT_CACHE_BYTES: usize = 16 << 20;

/// Everything a request for one model needs.
#[derive(Debug)]
pub struct ServedModel {
    /// The id it is listed under first (pinned id, or name).
    pub id: String,
    /// The engine's configured name.
    pub engine_name: String,
    /// The engine.
    pub backend: Arc<dyn Backend>,
    /// What the engine says about the model.
    pub info: ModelInfo,
    /// The model's tokenizer.
    pub tokenizer: Arc<TextTokenizer>,
    /// Token ids of its recent prompts, by text.
    pub prompt_cache: Arc<crate::text::prompt_cache::PromptCache>,
    /// Its chat template; chat requests need one.
    pub template: Option<ChatTemplate>,
    /// Context window in tokens.
    pub context_length: u32,
    /// Most output tokens a request may ask for.
    pub max_output_tokens: u32,
    /// Tokens that end a turn (the engine's end-of-sequence tokens and the folder's
    /// `generation_config.json` ones).
    pub stop_token_ids: Vec<u32>,
    /// Shown as `owned_by`.
    pub owned_by: String,
    /// Shown as `created` (the version date, else load time).
    pub created: u64,
    /// Shown as `shutdown_date`.
    pub shutdown_date: Option<String>,
    /// `system_fingerprint`: which engine build and model served a response.
    pub fingerprint: String,
    /// How the model writes tool calls.
    pub tool_call_parser: Option<ToolCallFormat>,
    /// Its chat template shows no tools, so the generic tool prompt shows them
    /// ([`crate::text::tool_prompt`]).
    pub generic_tools: bool,
    /// The markers around its reasoning, for a reasoning model.
    pub reasoning: Option<crate::text::reasoning::ReasoningMarkers>,
    /// Structured output when its engine cannot constrain it.
    pub structured_output: super::settings::StructuredOutput,
    /// The sampling its makers recommend, for what a request leaves unset.
    pub sampling: super::ModelSampling,
}

/// Public ids and the models they name.
#[derive(Debug, Default)]
pub struct ModelRegistry {
    by_id: HashMap<String, Arc<ServedModel>>,
    /// Every id, in configuration order, for `GET /v1/models`.
    listing: Vec<(String, Arc<ServedModel>)>,
    /// Each engine once, for readiness.
    engines: Vec<(String, Arc<dyn Backend>)>,
    /// The admin API's aliases and shutdown dates over the configured ids.
    map: RwLock<Arc<ModelMap>>,
}

/// `id`, naming `model`, with its shutdown date (the model map's, else the configured one).
fn listed(map: &ModelMap, id: &str, model: &Arc<ServedModel>) -> ListedModel {
    ListedModel {
        id: id.to_string(),
        model: Arc::clone(model),
        shutdown_date: map
            .shutdown_dates
            .get(id)
            .cloned()
            .or_else(|| model.shutdown_date.clone()),
    }
}

/// One public id as `GET /v1/models` lists it.
#[derive(Debug, Clone)]
pub struct ListedModel {
    /// The id.
    pub id: String,
    /// The model it names.
    pub model: Arc<ServedModel>,
    /// When it stops being served, if announced.
    pub shutdown_date: Option<String>,
}

fn read_json(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Unix seconds of midnight UTC on `YYYY-MM-DD`.
fn date_to_unix(date: &str) -> Option<u64> {
    let y: i64 = date.get(0..4)?.parse().ok()?;
    let m: i64 = date.get(5..7)?.parse().ok()?;
    let d: i64 = date.get(8..10)?.parse().ok()?;
    let yy = if m <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    u64::try_from(days * 86_400).ok()
}

/// A short stable digest of the engine build and model.
fn fingerprint(parts: &[&str]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a
    for byte in parts.join("\u{1f}").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("fp_{:010x}", hash & 0xff_ffff_ffff)
}

/// How model `id` calls tools: the configured format, else the one its template teaches, else
/// Hermes blocks; and whether the generic tool prompt must show it the tools (its template
/// shows none). Said in the log, since it decides what a request offering tools gets.
fn tool_calls(
    id: &str,
    configured: Option<ToolCallFormat>,
    template: Option<&ChatTemplate>,
) -> (Option<ToolCallFormat>, bool) {
    let Some(template) = template else {
        return (configured, false);
    };
    let shows = template.shows_tools();
    let taught = crate::text::tool_prompt::format_taught(template.source());
    let format = configured.or(taught).unwrap_or(ToolCallFormat::Hermes);
    let source = match (configured, taught) {
        (Some(_), _) => "configured",
        (None, Some(_)) => "taught by its chat template",
        (None, None) => "the default",
    };
    if shows {
        tracing::info!(model = %id, format = ?format, "tool calls are read in the {source} format; the chat template shows the tools");
    } else {
        tracing::info!(model = %id, format = ?format, "tool calls are read in the {source} format; the chat template shows no tools, so the generic tool prompt describes them in a system message");
    }
    (Some(format), !shows)
}

/// Builds one served model from its configuration and the engine that serves it.
pub(super) fn served_model(
    config: &ModelConfig,
    backend: &Arc<dyn Backend>,
    engine_models: &[ModelInfo],
) -> Result<ServedModel, String> {
    let info = engine_models
        .iter()
        .find(|m| m.id == config.engine_model)
        .cloned()
        .ok_or_else(|| {
            format!(
                "engine `{}` serves no model `{}`",
                config.engine, config.engine_model
            )
        })?;
    let folder = &config.folder;
    let tokenizer = TextTokenizer::from_file(&folder.join("tokenizer.json"))?;
    if tokenizer.vocab_size() > info.vocab_size {
        return Err(format!(
            "{}: the tokenizer has {} tokens but the engine's model only {}",
            folder.display(),
            tokenizer.vocab_size(),
            info.vocab_size
        ));
    }
    let tokenizer_config = read_json(&folder.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let template = ChatTemplate::from_folder(folder, &tokenizer_config)
        .map_err(|e| format!("{}: {e}", folder.display()))?;
    let context_length = match config.context_length {
        Some(c) if c > info.max_context => {
            return Err(format!(
                "context_length {c} exceeds the engine's {} for `{}`",
                info.max_context, config.engine_model
            ));
        }
        Some(c) => c,
        None => info.max_context,
    };
    let mut stop_token_ids = info.eos_token_ids.clone();
    let mut sampling = super::ModelSampling::default();
    if let Some(generation) = read_json(&folder.join("generation_config.json"))? {
        let ids = match &generation["eos_token_id"] {
            Value::Array(list) => list.iter().filter_map(Value::as_u64).collect(),
            other => other.as_u64().into_iter().collect::<Vec<_>>(),
        };
        stop_token_ids.extend(ids.into_iter().filter_map(|id| u32::try_from(id).ok()));
        sampling = super::ModelSampling::from_generation_config(&generation);
    }
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    let id = match &config.version {
        Some(v) => format!("{}-{v}", config.name),
        None => config.name.clone(),
    };
    let (tool_call_parser, generic_tools) =
        tool_calls(&id, config.tool_call_parser, template.as_ref());
    Ok(ServedModel {
        fingerprint: fingerprint(&[
            &backend.label(),
            &config.engine_model,
            env!("CARGO_PKG_VERSION"),
        ]),
        created: config
            .version
            .as_deref()
            .and_then(date_to_unix)
            .unwrap_or_else(crate::clock::unix_now),
        owned_by: config
            .owned_by
            .clone()
            .or_else(|| info.owned_by.clone())
            .unwrap_or_else(|| "turnpike".into()),
        shutdown_date: config.deprecation_date.clone(),
        engine_name: config.engine.clone(),
        backend: Arc::clone(backend),
        tokenizer: Arc::new(tokenizer),
        prompt_cache: Arc::new(crate::text::prompt_cache::PromptCache::new(
            PROMPT_CACHE_ENTRIES,
            PROMPT_CACHE_BYTES,
        )),
        max_output_tokens: config.max_output_tokens.min(context_length),
        id,
        info,
        template,
        context_length,
        stop_token_ids,
        tool_call_parser,
        generic_tools,
        reasoning: config.reasoning.clone(),
        structured_output: config.structured_output,
        sampling,
    })
}

impl ModelRegistry {
    /// A registry of `models` (each with its configuration) served by `engines`.
    pub(super) fn build(
        engines: Vec<(String, Arc<dyn Backend>)>,
        models: Vec<(ModelConfig, ServedModel)>,
    ) -> Result<Self, EngineHostError> {
        let mut registry = Self {
            engines,
            ..Self::default()
        };
        let mut newest: HashMap<String, (String, Arc<ServedModel>)> = HashMap::new();
        for (config, model) in models {
            let model = Arc::new(model);
            registry.insert(model.id.clone(), &model)?;
            for alias in &config.aliases {
                registry.insert(alias.clone(), &model)?;
            }
            if let Some(version) = &config.version {
                let entry = newest
                    .entry(config.name.clone())
                    .or_insert_with(|| (version.clone(), Arc::clone(&model)));
                if *version > entry.0 {
                    *entry = (version.clone(), Arc::clone(&model));
                }
            }
        }
        let mut floating: Vec<_> = newest.into_iter().collect();
        floating.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, (_, model)) in floating {
            registry.insert(name, &model)?;
        }
        Ok(registry)
    }

    fn insert(&mut self, id: String, model: &Arc<ServedModel>) -> Result<(), EngineHostError> {
        if self.by_id.contains_key(&id) {
            return Err(EngineHostError::DuplicateModel { model: id });
        }
        self.by_id.insert(id.clone(), Arc::clone(model));
        self.listing.push((id, Arc::clone(model)));
        Ok(())
    }

    /// The model a configured public id names (no alias of the model map).
    pub fn get(&self, id: &str) -> Option<&Arc<ServedModel>> {
        self.by_id.get(id)
    }

    /// The model a public id names: a configured id, or an alias of the model map.
    pub fn resolve(&self, id: &str) -> Option<Arc<ServedModel>> {
        if let Some(model) = self.by_id.get(id) {
            return Some(Arc::clone(model));
        }
        let map = self.map();
        let target = map.aliases.get(id)?;
        self.by_id.get(target).cloned()
    }

    /// Every configured public id and its model, in configuration order.
    pub fn listing(&self) -> impl Iterator<Item = (&str, &Arc<ServedModel>)> {
        self.listing.iter().map(|(id, m)| (id.as_str(), m))
    }

    /// Every public id with its model and shutdown date: the configured ones in configuration
    /// order, then the model map's aliases.
    pub fn entries(&self) -> Vec<ListedModel> {
        let map = self.map();
        let configured = self.listing.iter().map(|(id, m)| listed(&map, id, m));
        let aliases = map
            .aliases
            .iter()
            .filter_map(|(alias, target)| self.by_id.get(target).map(|m| listed(&map, alias, m)));
        configured.chain(aliases).collect()
    }

    /// One public id as `GET /v1/models` lists it.
    pub fn entry(&self, id: &str) -> Option<ListedModel> {
        let model = self.resolve(id)?;
        Some(listed(&self.map(), id, &model))
    }

    /// The admin API's price in effect at `now` for a model called `asked` and served as
    /// `id`, if it set one.
    pub fn price(&self, asked: &str, id: &str, now: i64) -> Option<crate::spend::prices::Price> {
        let map = self.map();
        if map.price_table.is_empty() {
            return None;
        }
        map.price_table.price([asked, id], now)
    }

    /// The model map in force.
    pub fn map(&self) -> Arc<ModelMap> {
        Arc::clone(
            &self
                .map
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Why `map` cannot stand over this registry's ids, if it cannot.
    pub fn check_map(&self, map: &ModelMap) -> Result<(), String> {
        map.check(&|id| self.by_id.contains_key(id))
    }

    /// Checks `map` and puts it in force.
    pub fn set_map(&self, mut map: ModelMap) -> Result<(), String> {
        self.check_map(&map)?;
        map.price_table = Arc::new(map.compile_prices()?);
        *self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(map);
        Ok(())
    }

    /// Each engine once, with its name.
    pub fn engines(&self) -> impl Iterator<Item = (&str, &Arc<dyn Backend>)> {
        self.engines.iter().map(|(name, b)| (name.as_str(), b))
    }

    /// Whether no model is served.
    pub fn is_empty(&self) -> bool {
        self.listing.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_fingerprints() {
        assert_eq!(date_to_unix("1970-01-01"), Some(0));
        assert_eq!(date_to_unix("2024-02-29"), Some(1_709_164_800));
        assert_eq!(fingerprint(&["a", "b"]), fingerprint(&["a", "b"]));
        assert_ne!(fingerprint(&["a", "b"]), fingerprint(&["ab", ""]));
        assert!(fingerprint(&["x"]).starts_with("fp_"));
    }
}
