//! Loading a model's draft model (`speculative.draft_model` / `draft_layers`): a second model
//! with the target's vocabulary, or the target's own first layers, on the same device kind
//! with a small KV cache of its own.

use std::path::Path;

use serde_json::Value;
use turnpike_engine_api::EngineError;
use turnpike_engine_api::plugin::Host;

use super::draft_model::DraftModel;
use super::open::open_device;
use super::{KvBudget, ModelSettings, available_memory};
use crate::model::ModelFolder;

/// The draft model `settings` name, loaded; `None` where the model drafts by prompt lookup or
/// not at all. Load it before the target, so a GPU target's cache is sized after it.
pub(super) fn load_draft(
    settings: &ModelSettings,
    target: &ModelFolder,
    host: &Host,
) -> Result<Option<DraftModel>, EngineError> {
    let Some(speculative) = settings.speculative.as_ref().filter(|s| s.uses_model()) else {
        return Ok(None);
    };
    let fail = |e: String| {
        EngineError::invalid_config(format!("model `{}`: draft model: {e}", settings.id))
    };
    let path = speculative
        .draft_model
        .clone()
        .unwrap_or_else(|| settings.path.clone());
    let mut folder = ModelFolder::open(&path).map_err(|e| fail(e.to_string()))?;
    if folder.encoder.is_some() {
        return Err(fail(format!(
            "{} is an encoder; a draft model generates",
            path.display()
        )));
    }
    if path != settings.path {
        same_vocabulary(target, &folder).map_err(fail)?;
    }
    if let Some(layers) = speculative.draft_layers {
        if layers > folder.spec.num_layers {
            return Err(fail(format!(
                "draft_layers is {layers}; {} has {} layers",
                path.display(),
                folder.spec.num_layers
            )));
        }
        folder.spec.num_layers = layers;
    }
    let max_context = folder.spec.max_context.min(target.spec.max_context);
    folder.spec.max_context = max_context;
    // Enough for the sequences that draft at once to hold full contexts in halves, at most an
    // eighth of the memory: a draft that does not fit is only not made.
    let wanted =
        (speculative.max_running * max_context * folder.spec.kv_values_per_token() * 2) as u64;
    let bytes = wanted.min(available_memory().unwrap_or(8 << 30) / 8);
    let draft_settings = ModelSettings {
        id: format!("{} (draft)", settings.id),
        path: path.clone(),
        kv_cache: KvBudget::Bytes(bytes),
        max_running: speculative.max_running,
        max_n: 1,
        max_context: Some(max_context),
        speculative: None,
        kv_events: None,
        ..settings.clone()
    };
    let device = open_device(&draft_settings, &folder, host)?;
    host.info(&format!(
        "model `{}`: drafts from {} ({} layers) on the {}: {} KV blocks",
        settings.id,
        path.display(),
        folder.spec.num_layers,
        device.name(),
        device.num_blocks()
    ));
    // A drafted token's cost as a share of a step of the model, by the weights each reads
    // (the same element types assumed).
    let cost = folder.spec.step_weights() as f32 / target.spec.step_weights().max(1) as f32;
    Ok(Some(DraftModel::new(
        device,
        settings.block_size as usize,
        folder.spec.vocab_size,
        settings.max_batch_tokens,
        max_context,
        cost,
    )))
}

/// The draft's token ids must mean what the target's mean: the same vocabulary size and, where
/// both have a `tokenizer.json`, the same vocabulary and added tokens.
fn same_vocabulary(target: &ModelFolder, draft: &ModelFolder) -> Result<(), String> {
    if draft.spec.vocab_size != target.spec.vocab_size {
        return Err(format!(
            "its vocabulary has {} tokens, the model's {}",
            draft.spec.vocab_size, target.spec.vocab_size
        ));
    }
    let (Some(ours), Some(theirs)) = (&target.tokenizer, &draft.tokenizer) else {
        return Ok(());
    };
    if vocabulary(ours)? != vocabulary(theirs)? {
        return Err(format!(
            "{} and {} give tokens different ids",
            theirs.display(),
            ours.display()
        ));
    }
    Ok(())
}

/// A `tokenizer.json`'s vocabulary and added tokens.
fn vocabulary(path: &Path) -> Result<(Value, Value), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let json: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let added = json["added_tokens"]
        .as_array()
        .map(|tokens| {
            tokens
                .iter()
                .map(|t| serde_json::json!([t["id"], t["content"]]))
                .collect()
        })
        .unwrap_or_default();
    Ok((json["model"]["vocab"].clone(), Value::Array(added)))
}
