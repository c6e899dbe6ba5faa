//! Checks of the table, model list, generation, refusals and optional entries.

use std::collections::HashSet;

use serde_json::json;

use super::recorder::Recorder;
use super::{Kit, KitOptions, Miss, Outcome, ensure};
use crate::abi::TpRequestV1;
use crate::event::{FinishReason, Status};
use crate::host::{EngineHandle, Plugin};
use crate::json::{EmbedParams, ModelInfo};
use crate::layout;

pub(super) fn table(plugin: &Plugin) -> Outcome {
    let info = plugin.info();
    if info.name.trim().is_empty() {
        return Outcome::Fail("name is empty".into());
    }
    if info.version.trim().is_empty() {
        return Outcome::Fail("version is empty".into());
    }
    if !info.table_size.is_multiple_of(8) {
        return Outcome::Fail(format!(
            "struct_size {} is not a multiple of 8",
            info.table_size
        ));
    }
    Outcome::Pass
}

pub(super) fn pick_model(engine: &EngineHandle, options: &KitOptions) -> Result<ModelInfo, String> {
    let models = engine.models().map_err(|e| format!("models failed: {e}"))?;
    if models.is_empty() {
        return Err("models returned an empty list".into());
    }
    let mut ids = HashSet::new();
    for m in &models {
        if !ids.insert(m.id.as_str()) {
            return Err(format!("model id `{}` appears twice", m.id));
        }
        if m.vocab_size == 0 || m.max_context == 0 {
            return Err(format!(
                "model `{}` has a zero vocab_size or max_context",
                m.id
            ));
        }
    }
    match &options.model {
        None => Ok(models[0].clone()),
        Some(id) => models
            .iter()
            .find(|m| &m.id == id)
            .cloned()
            .ok_or_else(|| format!("the plugin does not serve model `{id}`")),
    }
}

pub(super) fn generate(kit: &Kit<'_>) -> Result<(), Miss> {
    let seen = kit.run_to_end(&json!({"max_tokens": 8}))?;
    let fin = &seen.finals[0];
    ensure(fin.status == Status::Ok, || {
        format!("status {}: {}", fin.status, fin.message)
    })?;
    ensure(seen.tokens.len() <= 8, || {
        format!("{} tokens for max_tokens 8", seen.tokens.len())
    })?;
    ensure(seen.tokens.iter().all(|t| t.choice == 0), || {
        "token for a choice other than 0".into()
    })?;
    ensure(fin.finish.reason.is_some(), || {
        "successful FINAL without a finish reason".into()
    })?;
    let prompt = kit.prompt().len() as u32;
    ensure(fin.usage.prompt_tokens == prompt, || {
        format!(
            "usage.prompt_tokens {} for a {prompt}-token prompt",
            fin.usage.prompt_tokens
        )
    })?;
    ensure(
        fin.usage.completion_tokens as usize >= seen.tokens.len(),
        || {
            format!(
                "usage.completion_tokens {} but {} tokens sent",
                fin.usage.completion_tokens,
                seen.tokens.len()
            )
        },
    )
}

pub(super) fn max_tokens(kit: &Kit<'_>) -> Result<(), Miss> {
    let seen = kit.run_to_end(&json!({"max_tokens": 5, "ignore_eos": true}))?;
    let fin = &seen.finals[0];
    ensure(fin.status == Status::Ok, || {
        format!("status {}: {}", fin.status, fin.message)
    })?;
    ensure(seen.tokens.len() <= 5, || {
        format!("{} tokens for max_tokens 5", seen.tokens.len())
    })?;
    if fin.finish.reason == Some(FinishReason::Length) {
        ensure(fin.usage.completion_tokens == 5, || {
            format!(
                "finish `length` after {} of 5 tokens",
                fin.usage.completion_tokens
            )
        })?;
    }
    Ok(())
}

pub(super) fn n_choices(kit: &Kit<'_>) -> Result<(), Miss> {
    let max_n = kit.model.capabilities.max_n;
    if max_n < 2 {
        return Err(Miss::Skip(format!("model declares max_n {max_n}")));
    }
    let seen = kit.run_to_end(&json!({"max_tokens": 6, "n": 2, "seed": 7}))?;
    let fin = &seen.finals[0];
    ensure(fin.status == Status::Ok, || {
        format!("status {}: {}", fin.status, fin.message)
    })?;
    ensure(seen.tokens.iter().all(|t| t.choice < 2), || {
        "token for a choice >= n".into()
    })?;
    ensure(seen.choice_ends.iter().all(|&c| c < 2), || {
        "CHOICE_END for a choice >= n".into()
    })?;
    let mut ended = seen.choice_ends.clone();
    ended.sort_unstable();
    ended.dedup();
    ensure(ended.len() == seen.choice_ends.len(), || {
        "a choice ended twice".into()
    })?;
    for choice in 0..2 {
        let count = seen.tokens.iter().filter(|t| t.choice == choice).count();
        ensure(count <= 6, || {
            format!("choice {choice} got {count} tokens for max_tokens 6")
        })?;
    }
    Ok(())
}

pub(super) fn logprobs(kit: &Kit<'_>) -> Result<(), Miss> {
    let caps = &kit.model.capabilities;
    if !caps.logprobs {
        return Err(Miss::Skip("model declares no logprobs".into()));
    }
    let k = caps.max_top_logprobs.min(3);
    let seen = kit.run_to_end(&json!({"max_tokens": 4, "logprobs": true, "top_logprobs": k}))?;
    ensure(!seen.tokens.is_empty(), || "no tokens".into())?;
    for t in &seen.tokens {
        let lp = t
            .logprob
            .ok_or_else(|| Miss::Fail("token without a logprob".into()))?;
        ensure(lp.is_finite() && lp <= 0.0, || {
            format!("logprob {lp} is not a finite value <= 0")
        })?;
        ensure(t.top_logprobs.len() == k as usize, || {
            format!("{} alternatives for top_logprobs {k}", t.top_logprobs.len())
        })?;
        let sorted = t
            .top_logprobs
            .windows(2)
            .all(|w| w[0].logprob >= w[1].logprob);
        ensure(sorted, || "alternatives are not most likely first".into())?;
        let finite = t
            .top_logprobs
            .iter()
            .all(|a| a.logprob.is_finite() && a.logprob <= 0.0);
        ensure(finite, || {
            "an alternative's logprob is not a finite value <= 0".into()
        })?;
    }
    Ok(())
}

pub(super) fn refuse_unknown_model(kit: &Kit<'_>) -> Result<(), Miss> {
    let (recorder, submitted) =
        kit.submit_text("turnpike-conformance-no-such-model", r#"{"max_tokens": 4}"#);
    ensure(submitted.is_err(), || {
        "a request for an unknown model was accepted".into()
    })?;
    kit.refused_cleanly(recorder, "unknown model")
}

pub(super) fn refuse_malformed_params(kit: &Kit<'_>) -> Result<(), Miss> {
    let (recorder, submitted) = kit.submit_text(&kit.model.id.clone(), "{not json");
    ensure(submitted.is_err(), || {
        "malformed params_json was accepted".into()
    })?;
    kit.refused_cleanly(recorder, "malformed params")
}

/// A host of a later minor sends a larger request struct; the plugin must read its prefix.
pub(super) fn newer_host_request(kit: &Kit<'_>) -> Result<(), Miss> {
    #[repr(C)]
    struct Newer {
        v1: TpRequestV1,
        unknown_field: u64,
    }
    let prompt = kit.prompt();
    let params = r#"{"max_tokens": 3}"#;
    let request = Newer {
        v1: TpRequestV1 {
            struct_size: size_of::<Newer>() as u32,
            reserved: 0,
            id: kit.engine.next_request_id(),
            model: layout::tp_str(&kit.model.id),
            prompt: layout::tp_tokens(&prompt),
            params_json: layout::tp_str(params),
            trace_context: layout::tp_str(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        },
        unknown_field: u64::MAX,
    };
    let (recorder, sink) = Recorder::sink();
    // SAFETY: `request` is a live `Newer`, valid for its declared size during the call; a
    // recorder's sink stays valid whatever the plugin does, and goes to this one submit.
    let submitted = unsafe { kit.engine.submit_request(&request.v1, sink) };
    submitted.map_err(|e| Miss::Fail(format!("larger request struct refused: {e}")))?;
    let (seen, ended) = recorder.wait_ended(kit.options.timeout);
    kit.ended_once(&seen, ended, recorder)?;
    let fin = &seen.finals[0];
    ensure(fin.status == Status::Ok, || {
        format!("status {}: {}", fin.status, fin.message)
    })
}

pub(super) fn stats(kit: &Kit<'_>) -> Result<(), Miss> {
    if !kit.plugin.info().has_stats {
        return Err(Miss::Skip("plugin has no stats entry".into()));
    }
    let stats = kit
        .engine
        .stats()
        .map_err(|e| Miss::Fail(format!("stats failed: {e}")))?;
    ensure(stats.completed > 0, || {
        format!(
            "stats report {} completed after the kit's requests",
            stats.completed
        )
    })
}

pub(super) fn health(kit: &Kit<'_>) -> Result<(), Miss> {
    if !kit.plugin.info().has_health {
        return Err(Miss::Skip("plugin has no health entry".into()));
    }
    kit.engine
        .health()
        .map_err(|e| Miss::Fail(format!("a fresh engine is unhealthy: {e}")))
}

pub(super) fn embed(kit: &Kit<'_>) -> Result<(), Miss> {
    let has_entry = kit.plugin.info().has_embed;
    let Some(dim) = kit.model.embedding_dim else {
        return Err(Miss::Skip(if has_entry {
            "the chosen model declares no embedding_dim".into()
        } else {
            "plugin serves no embeddings".into()
        }));
    };
    ensure(has_entry, || {
        format!("model declares embedding_dim {dim} but embed is NULL")
    })?;
    let inputs = vec![kit.prompt(), kit.prompt()[..2].to_vec()];
    let vectors = kit
        .engine
        .embed(&kit.model.id, &inputs, &EmbedParams::default())
        .map_err(|e| Miss::Fail(format!("embed failed: {e}")))?;
    ensure(vectors.len() == 2, || {
        format!("{} vectors for 2 inputs", vectors.len())
    })?;
    ensure(vectors.iter().all(|v| v.len() == dim as usize), || {
        format!("vector length is not the declared embedding_dim {dim}")
    })?;
    ensure(vectors.iter().flatten().all(|x| x.is_finite()), || {
        "a non-finite value".into()
    })?;
    let refused = kit.engine.embed(
        "turnpike-conformance-no-such-model",
        &inputs,
        &EmbedParams::default(),
    );
    ensure(refused.is_err(), || {
        "embeddings for an unknown model succeeded".into()
    })
}
