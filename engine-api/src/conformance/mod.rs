//! The conformance kit: checks any engine plugin keeps the ABI contract.
//!
//! The kit drives the plugin through its raw function table with instrumented sinks, so it sees
//! exactly what the plugin does: how many FINAL events and releases each request gets, whether
//! events arrive after either, whether `on_event` calls overlap, and what `destroy` leaves behind.
//! It needs nothing from the plugin but its configuration: prompts are built from the first
//! served model's vocabulary, and checks for optional features (several choices, logprobs,
//! stats, health, embeddings) are skipped when the plugin declares it lacks them.
//!
//! ```no_run
//! # use turnpike_engine_api::conformance::{KitOptions, run};
//! let report = run("target/debug/libturnpike_sim.so".as_ref(), &KitOptions::default())?;
//! assert!(report.passed(), "{report}");
//! # Ok::<(), turnpike_engine_api::host::PluginError>(())
//! ```

mod checks_generate;
mod checks_lifecycle;
mod recorder;

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

pub use self::recorder::{Recorder, Seen};
use crate::event::EngineError;
use crate::host::{EngineHandle, Plugin, PluginError, PluginInfo};
use crate::json::{GenerationParams, ModelInfo};

/// How to run the kit.
#[derive(Debug, Clone)]
pub struct KitOptions {
    /// The JSON configuration passed to `create`.
    pub config: String,
    /// Which model to use; the first one served when `None`.
    pub model: Option<String>,
    /// How long to wait for any one expected event.
    pub timeout: Duration,
}

impl Default for KitOptions {
    fn default() -> Self {
        Self {
            config: "{}".into(),
            model: None,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The plugin kept the contract.
    Pass,
    /// Not applicable to this plugin, and why.
    Skip(String),
    /// The plugin broke the contract, and how.
    Fail(String),
}

/// One check and its outcome.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// Short name of the check.
    pub name: &'static str,
    /// What happened.
    pub outcome: Outcome,
}

/// Everything the kit found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The plugin checked.
    pub plugin: PluginInfo,
    /// Each check in the order run.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// True when no check failed.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Fail(_)))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.plugin;
        writeln!(
            f,
            "{} {} (ABI {}.{}) at {}",
            p.name,
            p.version,
            p.abi_major,
            p.abi_minor,
            p.path.display()
        )?;
        for check in &self.checks {
            match &check.outcome {
                Outcome::Pass => writeln!(f, "  pass  {}", check.name)?,
                Outcome::Skip(why) => writeln!(f, "  skip  {}: {why}", check.name)?,
                Outcome::Fail(why) => writeln!(f, "  FAIL  {}: {why}", check.name)?,
            }
        }
        Ok(())
    }
}

/// Loads the plugin at `path` and runs every check.
pub fn run(path: &Path, options: &KitOptions) -> Result<Report, PluginError> {
    run_plugin(&Plugin::load(path)?, options)
}

/// Runs every check on a loaded plugin. Fails only when no engine can be created at all.
pub fn run_plugin(plugin: &Plugin, options: &KitOptions) -> Result<Report, PluginError> {
    let mut report = Report {
        plugin: plugin.info().clone(),
        checks: Vec::new(),
    };
    report.checks.push(CheckResult {
        name: "table",
        outcome: checks_generate::table(plugin),
    });
    let engine = plugin.create(&options.config)?;
    let model = match checks_generate::pick_model(&engine, options) {
        Ok(model) => {
            report.checks.push(CheckResult {
                name: "models",
                outcome: Outcome::Pass,
            });
            model
        }
        Err(why) => {
            report.checks.push(CheckResult {
                name: "models",
                outcome: Outcome::Fail(why),
            });
            return Ok(report);
        }
    };
    let kit = Kit {
        plugin,
        engine,
        model,
        options,
    };
    for (name, check) in CHECKS {
        let outcome = match check(&kit) {
            Ok(()) => Outcome::Pass,
            Err(Miss::Skip(why)) => Outcome::Skip(why),
            Err(Miss::Fail(why)) => Outcome::Fail(why),
        };
        report.checks.push(CheckResult { name, outcome });
    }
    Ok(report)
}

type Check = fn(&Kit<'_>) -> Result<(), Miss>;

const CHECKS: &[(&str, Check)] = &[
    ("generate", checks_generate::generate),
    ("max_tokens", checks_generate::max_tokens),
    ("n_choices", checks_generate::n_choices),
    ("logprobs", checks_generate::logprobs),
    (
        "refuse_unknown_model",
        checks_generate::refuse_unknown_model,
    ),
    (
        "refuse_malformed_params",
        checks_generate::refuse_malformed_params,
    ),
    ("newer_host_request", checks_generate::newer_host_request),
    ("stats", checks_generate::stats),
    ("health", checks_generate::health),
    ("embed", checks_generate::embed),
    ("cancel_before_start", checks_lifecycle::cancel_before_start),
    ("cancel_during", checks_lifecycle::cancel_during),
    ("cancel_after_final", checks_lifecycle::cancel_after_final),
    ("cancel_unknown", checks_lifecycle::cancel_unknown),
    ("concurrent_requests", checks_lifecycle::concurrent_requests),
    ("destroy_idle", checks_lifecycle::destroy_idle),
    (
        "destroy_with_live_requests",
        checks_lifecycle::destroy_with_live_requests,
    ),
];

/// Why a check did not pass.
pub(crate) enum Miss {
    Skip(String),
    Fail(String),
}

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), Miss> {
    if ok { Ok(()) } else { Err(Miss::Fail(why())) }
}

/// Shared state of one kit run.
pub(crate) struct Kit<'a> {
    plugin: &'a Plugin,
    engine: EngineHandle,
    model: ModelInfo,
    options: &'a KitOptions,
}

/// Submits a request whose events go to a new [`Recorder`]; returns it and the outcome.
pub fn submit_recorded(
    engine: &EngineHandle,
    model: &str,
    prompt: &[u32],
    params_json: &str,
) -> (&'static Recorder, Result<u64, EngineError>) {
    let (recorder, sink) = Recorder::sink();
    // SAFETY: a recorder's context is never freed, and a second release is only counted, so the
    // sink stays valid whatever the plugin does; it goes to this one submit.
    let submitted = unsafe { engine.submit_raw(model, prompt, params_json, sink) };
    (recorder, submitted)
}

/// A short prompt of token ids valid for `model`, as the kit sends.
pub fn sample_prompt(model: &ModelInfo) -> Vec<u32> {
    let top = model.vocab_size.max(1);
    [5u32, 6, 7, 8].iter().map(|t| t % top).collect()
}

/// Generation parameters long enough that a request is still running when cancelled.
pub fn long_params(model: &ModelInfo) -> GenerationParams {
    let room = model
        .max_context
        .saturating_sub(sample_prompt(model).len() as u32);
    GenerationParams {
        max_tokens: room.clamp(1, 100_000),
        ignore_eos: true,
        ..GenerationParams::default()
    }
}

impl Kit<'_> {
    /// A short prompt of valid token ids.
    fn prompt(&self) -> Vec<u32> {
        sample_prompt(&self.model)
    }

    /// Parameters for a request long enough to still be running when cancelled.
    fn long_params(&self) -> Value {
        let p = long_params(&self.model);
        json!({"max_tokens": p.max_tokens, "ignore_eos": p.ignore_eos})
    }

    fn submit(&self, params: &Value) -> (&'static Recorder, Result<u64, EngineError>) {
        self.submit_text(&self.model.id, &params.to_string())
    }

    fn submit_text(
        &self,
        model: &str,
        params: &str,
    ) -> (&'static Recorder, Result<u64, EngineError>) {
        submit_recorded(&self.engine, model, &self.prompt(), params)
    }

    /// Submits, requires acceptance, and waits for the end.
    fn run_to_end(&self, params: &Value) -> Result<Seen, Miss> {
        let (recorder, submitted) = self.submit(params);
        submitted.map_err(|e| Miss::Fail(format!("request refused: {e}")))?;
        let (seen, ended) = recorder.wait_ended(self.options.timeout);
        self.ended_once(&seen, ended, recorder)?;
        Ok(seen)
    }

    /// The contract for an accepted request that has ended.
    fn ended_once(&self, seen: &Seen, ended: bool, recorder: &Recorder) -> Result<(), Miss> {
        ensure(ended, || {
            format!(
                "no FINAL and release within {:?} (finals {}, releases {})",
                self.options.timeout,
                seen.finals.len(),
                seen.releases
            )
        })?;
        ensure(seen.finals.len() == 1, || {
            format!("{} FINAL events", seen.finals.len())
        })?;
        ensure(seen.releases == 1, || format!("{} releases", seen.releases))?;
        ensure(seen.after_final == 0, || {
            format!("{} events after FINAL", seen.after_final)
        })?;
        ensure(seen.after_release == 0, || {
            format!("{} events after release", seen.after_release)
        })?;
        ensure(seen.malformed.is_empty(), || {
            format!("malformed events: {:?}", seen.malformed)
        })?;
        ensure(!recorder.overlapped(), || {
            "on_event calls overlapped for one request".into()
        })?;
        let vocab = self.model.vocab_size;
        ensure(seen.tokens.iter().all(|t| t.token_id < vocab), || {
            format!("a token id is not below vocab_size {vocab}")
        })
    }

    /// The contract for a refused request: no events, one release.
    fn refused_cleanly(&self, recorder: &Recorder, what: &str) -> Result<(), Miss> {
        let (seen, released) = recorder.wait_released(self.options.timeout);
        ensure(released, || format!("{what}: sink never released"))?;
        ensure(seen.releases == 1, || {
            format!("{what}: {} releases", seen.releases)
        })?;
        let events = seen.tokens.len() + seen.choice_ends.len() + seen.finals.len();
        ensure(events == 0, || {
            format!("{what}: refused request got {events} events")
        })
    }
}
