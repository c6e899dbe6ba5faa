//! `turnpike plugin check` and `turnpike plugin conformance`.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use turnpike_engine_api::conformance::{self, KitOptions};
use turnpike_engine_api::host::{EngineHandle, EngineRequest, EventStream, Plugin, PluginError};
use turnpike_engine_api::{EngineEvent, FinalEvent, GenerationParams, ModelInfo, Status};

use super::PluginArgs;
use super::plugin_config::plugin_config;

/// Why a plugin command failed; one line that names the file.
#[derive(Debug, thiserror::Error)]
pub enum PluginCommandError {
    /// The plugin cannot be loaded or its engine created.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The `--config` argument is unusable.
    #[error("{}: {message}", path.display())]
    Config {
        /// The plugin.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The engine misbehaved during the check.
    #[error("{}: {message}", path.display())]
    Check {
        /// The plugin.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Conformance checks failed.
    #[error("{}: {failed} of {total} conformance checks failed", path.display())]
    Conformance {
        /// The plugin.
        path: PathBuf,
        /// Failed checks.
        failed: usize,
        /// All checks.
        total: usize,
    },
}

/// The `--config` argument's JSON.
fn config(args: &PluginArgs) -> Result<String, PluginCommandError> {
    plugin_config(args.config.as_deref()).map_err(|message| PluginCommandError::Config {
        path: args.path.clone(),
        message,
    })
}

fn load(args: &PluginArgs) -> Result<(Plugin, String), PluginCommandError> {
    let config = config(args)?;
    Ok((Plugin::load(&args.path)?, config))
}

/// Loads, describes, and exercises a plugin: one short generation and one cancel.
pub(super) async fn check(
    args: &PluginArgs,
    out: &mut dyn Write,
) -> Result<(), PluginCommandError> {
    let (plugin, config) = load(args)?;
    let fail = |message: String| PluginCommandError::Check {
        path: args.path.clone(),
        message,
    };
    let info = plugin.info();
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let _ = writeln!(out, "plugin    {} {}", info.name, info.version);
    let _ = writeln!(out, "file      {}", info.path.display());
    let _ = writeln!(
        out,
        "abi       {}.{} (table {} bytes; stats {}, health {}, embeddings {})",
        info.abi_major,
        info.abi_minor,
        info.table_size,
        yes_no(info.has_stats),
        yes_no(info.has_health),
        yes_no(info.has_embed)
    );
    let engine = plugin.create(&config)?;
    let models = engine
        .models()
        .map_err(|e| fail(format!("models failed ({}): {}", e.status, e.message)))?;
    for m in &models {
        let embeddings = m
            .embedding_dim
            .map_or(String::new(), |d| format!(", embeddings {d}"));
        let _ = writeln!(
            out,
            "model     {} (context {}, vocab {}{embeddings})",
            m.id, m.max_context, m.vocab_size
        );
    }
    let model = match &args.model {
        Some(id) => models
            .iter()
            .find(|m| &m.id == id)
            .ok_or_else(|| fail(format!("serves no model `{id}`")))?,
        None => models
            .first()
            .ok_or_else(|| fail("models returned an empty list".into()))?,
    };
    let timeout = Duration::from_secs(args.timeout.max(1));

    let started = Instant::now();
    let short = GenerationParams {
        max_tokens: 8,
        ..GenerationParams::default()
    };
    let mut stream = submit(&engine, model, short).map_err(&fail)?;
    let (tokens, fin) = until_final(&mut stream, timeout, None)
        .await
        .map_err(&fail)?;
    if fin.status != Status::Ok {
        return Err(fail(format!(
            "generation ended {}: {}",
            fin.status, fin.message
        )));
    }
    let finish = fin
        .finish
        .reason
        .map_or("none".to_string(), |r| format!("{r:?}").to_lowercase());
    let _ = writeln!(
        out,
        "generate  ok: {tokens} tokens, finish {finish}, {:.1} ms",
        ms(started)
    );

    let started = Instant::now();
    let mut stream = submit(&engine, model, conformance::long_params(model)).map_err(&fail)?;
    let (tokens, fin) = until_final(&mut stream, timeout, Some(&engine))
        .await
        .map_err(&fail)?;
    match fin.status {
        Status::Cancelled | Status::Ok => {
            let _ = writeln!(
                out,
                "cancel    ok: ended {} after {tokens} tokens, {:.1} ms",
                fin.status,
                ms(started)
            );
        }
        other => {
            return Err(fail(format!(
                "cancelled request ended {other}: {}",
                fin.message
            )));
        }
    }
    match engine.health() {
        Ok(()) => {
            let _ = writeln!(out, "health    ok");
        }
        Err(e) => return Err(fail(format!("health: {e}"))),
    }
    if let Ok(stats) = engine.stats() {
        let json = serde_json::to_string(&stats).unwrap_or_default();
        let _ = writeln!(out, "stats     {json}");
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn submit(
    engine: &EngineHandle,
    model: &ModelInfo,
    params: GenerationParams,
) -> Result<EventStream, String> {
    let request = EngineRequest {
        trace_context: None,
        model: model.id.clone(),
        prompt: conformance::sample_prompt(model),
        params,
    };
    engine
        .submit(&request)
        .map_err(|e| format!("submit refused ({}): {}", e.status, e.message))
}

/// Reads events until the FINAL; with `cancel_with`, cancels the request after its first token.
async fn until_final(
    stream: &mut EventStream,
    timeout: Duration,
    cancel_with: Option<&EngineHandle>,
) -> Result<(usize, FinalEvent), String> {
    let id = stream.id();
    let read = async {
        let mut tokens = 0;
        let mut cancel_with = cancel_with;
        while let Some(event) = stream.recv().await {
            match event {
                EngineEvent::Token(_) => {
                    tokens += 1;
                    if let Some(engine) = cancel_with.take() {
                        let _ = engine.cancel(id);
                    }
                }
                EngineEvent::ChoiceEnd { .. } => {}
                EngineEvent::Final(fin) => return (tokens, fin),
            }
        }
        (
            tokens,
            FinalEvent::failed(
                Status::Internal,
                "stream ended without a final event",
                Default::default(),
            ),
        )
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| format!("no final event within {timeout:?}"))
}

/// Runs the conformance kit and prints its report.
pub(super) fn conformance(
    args: &PluginArgs,
    out: &mut dyn Write,
) -> Result<(), PluginCommandError> {
    let (plugin, config) = load(args)?;
    let options = KitOptions {
        config,
        model: args.model.clone(),
        timeout: Duration::from_secs(args.timeout.max(1)),
    };
    let report = conformance::run_plugin(&plugin, &options)?;
    let _ = write!(out, "{report}");
    verdict(args, report.failures().count(), report.checks.len())
}

/// `Ok` when no check of `total` failed.
fn verdict(args: &PluginArgs, failed: usize, total: usize) -> Result<(), PluginCommandError> {
    if failed == 0 {
        return Ok(());
    }
    Err(PluginCommandError::Conformance {
        path: args.path.clone(),
        failed,
        total,
    })
}

/// Runs the gateway plugin conformance kit and prints its report.
pub(super) async fn gateway_conformance(
    args: &PluginArgs,
    out: &mut dyn Write,
) -> Result<(), PluginCommandError> {
    let report = turnpike_plugin_api::conformance::run(&args.path, &config(args)?).await;
    for check in &report.checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        let _ = writeln!(out, "{mark} {}: {}", check.name, check.detail);
    }
    verdict(args, report.failures().len(), report.checks.len())
}
