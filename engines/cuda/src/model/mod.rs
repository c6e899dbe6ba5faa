//! Model folders and GGUF files ([`gguf`]): the validated shape ([`config`]), the weights
//! ([`weights`]), and the models the project makes itself ([`make`]).

pub mod architecture;
pub mod config;
pub mod encoder;
pub mod gguf;
mod layers;
pub mod packed;
mod pages;
pub mod pooling;
pub mod rotary;
pub mod weights;

use std::path::{Path, PathBuf};

pub use config::{ModelSpec, RopeScaling};
pub use layers::{F32Reader, Layer, LayeredWeights, PackedReader, TensorReader};
pub use packed::Packed;
pub use rotary::RotaryTables;
pub use weights::{Tensor, Weights};

/// Why a model folder cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is malformed or inconsistent.
    #[error("{0}")]
    Config(String),
    /// The folder holds something this engine cannot run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
}

impl From<gguf::GgufError> for ModelError {
    fn from(e: gguf::GgufError) -> Self {
        match e {
            gguf::GgufError::Io { path, source } => Self::Io { path, source },
            unsupported @ gguf::GgufError::Unsupported { .. } => {
                Self::Unsupported(unsupported.to_string())
            }
            format @ gguf::GgufError::Format { .. } => Self::Config(format.to_string()),
        }
    }
}

impl ModelError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A model folder ready to load: its spec, end-of-sequence ids and tokenizer.
#[derive(Debug, Clone)]
pub struct ModelFolder {
    /// The folder.
    pub path: PathBuf,
    /// The validated `config.json`.
    pub spec: ModelSpec,
    /// End-of-sequence ids from `config.json` and `generation_config.json`.
    pub eos_token_ids: Vec<u32>,
    /// `tokenizer.json`, when the folder has one.
    pub tokenizer: Option<PathBuf>,
    /// Why a GGUF file's own vocabulary could not be made into a `tokenizer.json` (`None`
    /// when it was, or when the model is a folder).
    pub tokenizer_error: Option<String>,
    /// How its embeddings pool token states.
    pub pooling: pooling::Pooling,
    /// Set for an encoder embedding model (`spec` then holds its shape only).
    pub encoder: Option<encoder::EncoderSpec>,
}

impl ModelFolder {
    /// Reads the folder's configuration (not its weights); `path` may also be a GGUF file, whose
    /// metadata is its configuration (a `tokenizer.json` beside it is its tokenizer).
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        if path.is_file() && gguf::Gguf::is_gguf(path) {
            return Self::open_gguf(path);
        }
        if !path.is_dir() {
            return Err(ModelError::Config(format!(
                "{} is neither a model folder (config.json and safetensors) nor a GGUF file",
                path.display()
            )));
        }
        let config_path = path.join("config.json");
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Config(format!("{}: {e}", config_path.display())))?;
        let (spec, encoder) = specs(&config)?;
        let mut eos = spec.eos_token_ids.clone();
        let generation = path.join("generation_config.json");
        if let Ok(text) = std::fs::read_to_string(&generation) {
            let doc: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ModelError::Config(format!("{}: {e}", generation.display())))?;
            eos.extend(config::token_ids(&doc["eos_token_id"]));
        }
        eos.sort_unstable();
        eos.dedup();
        eos.retain(|&t| (t as usize) < spec.vocab_size);
        let tokenizer = Some(path.join("tokenizer.json")).filter(|p| p.exists());
        Ok(Self {
            path: path.to_path_buf(),
            spec,
            eos_token_ids: eos,
            tokenizer,
            tokenizer_error: None,
            pooling: pooling::Pooling::from_folder(path)?,
            encoder,
        })
    }
}

impl ModelFolder {
    fn open_gguf(path: &Path) -> Result<Self, ModelError> {
        let file = gguf::Gguf::open(path)?;
        let config = gguf::model::config(&file)?;
        let (mut spec, encoder) = specs(&config)?;
        // llama.cpp's converter stores Gemma's norm weights with the 1 of `1 + w` added.
        spec.arch.norm_offset = 0.0;
        let mut eos = spec.eos_token_ids.clone();
        eos.sort_unstable();
        eos.dedup();
        eos.retain(|&t| (t as usize) < spec.vocab_size);
        let beside = path
            .parent()
            .map(|dir| dir.join("tokenizer.json"))
            .filter(|p| p.exists());
        // Else the file's own vocabulary, converted into a cache folder of its own; a tokenizer
        // that cannot be converted leaves the model without one and says why (the device needs
        // none; a server refuses such a model, see `tokenizer_error`).
        let converted = match beside {
            Some(path) => Ok(path),
            None => gguf_cache_folder(path)
                .ok_or_else(|| {
                    "no folder to keep its converted vocabulary in (set TURNPIKE_CACHE_DIR)".into()
                })
                .and_then(|folder| {
                    gguf::tokenizer::write_tokenizer(&file, &folder).map_err(|e| e.to_string())
                }),
        };
        let (tokenizer, tokenizer_error) = match converted {
            Ok(path) => (Some(path), None),
            Err(e) => (None, Some(e)),
        };
        Ok(Self {
            path: path.to_path_buf(),
            spec,
            eos_token_ids: eos,
            tokenizer,
            tokenizer_error,
            pooling: gguf::model::pooling(&file),
            encoder,
        })
    }
}

/// The shape a `config.json` describes, and for an encoder its own spec.
fn specs(
    config: &serde_json::Value,
) -> Result<(ModelSpec, Option<encoder::EncoderSpec>), ModelError> {
    match config["model_type"].as_str() {
        Some(t) if encoder::ENCODER_TYPES.contains(&t) => {
            let encoder = encoder::EncoderSpec::from_config(config)?;
            Ok((ModelSpec::of_encoder(&encoder), Some(encoder)))
        }
        _ => Ok((ModelSpec::from_json(&config.to_string())?, None)),
    }
}

/// The folder a GGUF file's converted tokenizer is kept in: under `TURNPIKE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/turnpike`, else `~/.cache/turnpike`, named by the file's path, size and
/// modification time (a changed file gets a new folder).
fn gguf_cache_folder(path: &Path) -> Option<PathBuf> {
    use sha2::{Digest, Sha256};
    let root = std::env::var_os("TURNPIKE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("turnpike")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/turnpike")))?;
    let absolute = std::fs::canonicalize(path).ok()?;
    let meta = std::fs::metadata(&absolute).ok()?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut hash = Sha256::new();
    hash.update(absolute.as_os_str().as_encoded_bytes());
    hash.update(meta.len().to_le_bytes());
    hash.update(modified.to_le_bytes());
    let digest = hash.finalize();
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Some(root.join("gguf").join(name))
}
