//! `turnpike make-model`: writes one of the default engine's presets as a Hugging Face folder.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use turnpike_tools::model::{MakeError, MakeOptions, WeightType, preset, presets, write_model};

/// Arguments of `make-model`.
#[derive(Debug, Args)]
pub struct MakeModelArgs {
    /// The preset: tiny, tiny-qwen2, small, llama-3.2-1b or llama-3.1-8b.
    #[arg(long)]
    pub preset: Option<String>,
    /// The folder to write (must not exist, or be empty).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Weight type: f32, f16 or bf16 (the preset's own by default).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Split the weights into shards of at most this many MiB (fractions allowed).
    #[arg(long)]
    pub shard_mib: Option<f64>,
    /// List the presets and exit.
    #[arg(long)]
    pub list: bool,
}

/// Why `make-model` failed.
#[derive(Debug, thiserror::Error)]
pub enum MakeModelError {
    /// The arguments name nothing that can be made.
    #[error("{0}")]
    Usage(String),
    /// Writing failed.
    #[error(transparent)]
    Model(#[from] MakeError),
}

/// Runs the command.
pub(super) fn run(args: &MakeModelArgs, out: &mut dyn Write) -> Result<(), MakeModelError> {
    let names: Vec<&str> = presets().iter().map(|p| p.name).collect();
    if args.list {
        for p in presets() {
            let _ = writeln!(out, "{:<14} {}", p.name, p.purpose);
        }
        return Ok(());
    }
    let (Some(name), Some(dir)) = (&args.preset, &args.out) else {
        return Err(MakeModelError::Usage(format!(
            "give --preset NAME and --out DIR (presets: {})",
            names.join(", ")
        )));
    };
    let Some(chosen) = preset(name) else {
        return Err(MakeModelError::Usage(format!(
            "no preset `{name}` (presets: {})",
            names.join(", ")
        )));
    };
    let dtype = match args.dtype.as_deref() {
        None => None,
        Some(text) => Some(WeightType::parse(text).ok_or_else(|| {
            MakeModelError::Usage(format!("--dtype must be f32, f16 or bf16, got `{text}`"))
        })?),
    };
    let options = MakeOptions {
        seed: args.seed,
        dtype,
        shard_bytes: args
            .shard_mib
            .map(|m| ((m * 1_048_576.0) as usize).max(1024)),
    };
    write_model(&chosen, dir, options)?;
    let _ = writeln!(out, "wrote preset `{name}` to {}", dir.display());
    Ok(())
}
