//! Models the project makes itself: complete Llama-family folders with deterministic random
//! weights, so tests, demos and benchmarks never download anything.
//!
//! This lives here, not in the default engine, so the gateway's `turnpike make-model` and its
//! built-in default model do not link the engine (and its CUDA bindings): a made folder is a
//! plain Hugging Face folder, which the engine's own tests load to check every preset.
//!
//! A folder holds `config.json`, `generation_config.json`, safetensors weights (sharded when
//! asked), and the project's byte-level BPE tokenizer with its special tokens and chat template
//! (`examples/models/sim-small`, trained offline from `tools/corpus.txt` by `make-sim-model`).
//! The same preset and seed always give the same bytes. Weights are drawn so that logits spread
//! over a few units: greedy decoding is then decisive, which the numerics tests rely on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

/// Why a model could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MakeError {
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The preset or the destination cannot be made.
    #[error("{0}")]
    Invalid(String),
}

impl MakeError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

const TOKENIZER_FILES: [(&str, &str); 3] = [
    (
        "tokenizer.json",
        include_str!("../../examples/models/sim-small/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_str!("../../examples/models/sim-small/tokenizer_config.json"),
    ),
    (
        "generation_config.json",
        include_str!("../../examples/models/sim-small/generation_config.json"),
    ),
];

/// Ids the project tokenizer gives: 663 merges-and-bytes plus 5 special tokens.
pub const TOKENIZER_VOCAB: usize = 668;

/// Weight element types a made model can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightType {
    /// 32-bit floats.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl WeightType {
    /// Parses `f32`, `f16` or `bf16`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "f32" | "float32" => Some(Self::F32),
            "f16" | "float16" => Some(Self::F16),
            "bf16" | "bfloat16" => Some(Self::Bf16),
            _ => None,
        }
    }

    fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F16 => "float16",
            Self::Bf16 => "bfloat16",
        }
    }

    fn width(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// The shape of a preset.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// The name `--preset` takes.
    pub name: &'static str,
    /// What it is for.
    pub purpose: &'static str,
    /// The `config.json` the preset writes (without dtype).
    config: Value,
    /// Default weight type.
    pub dtype: WeightType,
}

impl Preset {
    /// The `config.json` the preset writes (without dtype).
    pub fn config(&self) -> &Value {
        &self.config
    }
}

/// Every preset, smallest first.
pub fn presets() -> Vec<Preset> {
    let llama3_rope = |factor: f32, original: u32| {
        json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": original})
    };
    let llama = |hidden: u32, inter: u32, layers: u32, heads: u32, kv: u32, vocab: usize| {
        json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
               "hidden_act": "silu", "rms_norm_eps": 1e-5, "attention_bias": false,
               "mlp_bias": false, "bos_token_id": 0, "eos_token_id": [1, 4]})
    };
    let with = |mut base: Value, extra: Value| {
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        base
    };
    vec![
        Preset {
            name: "tiny",
            purpose: "tests: loads in milliseconds (Llama 3 shape: GQA, tied, llama3 RoPE)",
            config: with(
                llama(64, 128, 2, 4, 2, TOKENIZER_VOCAB),
                json!({"max_position_embeddings": 2048, "rope_theta": 10000.0,
                       "rope_scaling": llama3_rope(8.0, 256), "tie_word_embeddings": true}),
            ),
            dtype: WeightType::F32,
        },
        Preset {
            name: "tiny-qwen2",
            purpose: "tests: the Qwen2 shape (attention biases, untied output, 4:1 GQA)",
            config: json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 1,
                "vocab_size": TOKENIZER_VOCAB, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                "max_position_embeddings": 2048, "rope_theta": 1_000_000.0,
                "tie_word_embeddings": false, "use_sliding_window": false,
                "bos_token_id": 0, "eos_token_id": [1, 4]}),
            dtype: WeightType::F32,
        },
        Preset {
            name: "small",
            purpose: "benchmarks on the CPU: about 24M parameters",
            config: with(
                llama(512, 1408, 8, 8, 4, TOKENIZER_VOCAB),
                json!({"max_position_embeddings": 4096, "rope_theta": 500000.0,
                       "tie_word_embeddings": false}),
            ),
            dtype: WeightType::F32,
        },
        Preset {
            name: "llama-3.2-1b",
            purpose: "GPU benchmarks: the shapes of Llama-3.2-1B, random weights",
            config: with(
                llama(2048, 8192, 16, 32, 8, 128_256),
                json!({"max_position_embeddings": 131072, "rope_theta": 500000.0,
                       "rope_scaling": llama3_rope(32.0, 8192), "tie_word_embeddings": true,
                       "head_dim": 64}),
            ),
            dtype: WeightType::Bf16,
        },
        Preset {
            name: "llama-3.1-8b",
            purpose: "GPU benchmarks: the shapes of Llama-3.1-8B, random weights",
            config: with(
                llama(4096, 14336, 32, 32, 8, 128_256),
                json!({"max_position_embeddings": 131072, "rope_theta": 500000.0,
                       "rope_scaling": llama3_rope(8.0, 8192), "tie_word_embeddings": false,
                       "head_dim": 128}),
            ),
            dtype: WeightType::Bf16,
        },
    ]
}

/// The preset of this name.
pub fn preset(name: &str) -> Option<Preset> {
    presets().into_iter().find(|p| p.name == name)
}

/// How to write a preset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MakeOptions {
    /// Seed of the weights.
    pub seed: u64,
    /// Element type; the preset's default when `None`.
    pub dtype: Option<WeightType>,
    /// Largest shard in bytes; one file when `None`.
    pub shard_bytes: Option<usize>,
}

/// Writes the preset's folder at `out`, which must not exist or be empty. The folder is written
/// beside `out` and renamed into place, so a reader never sees half a model.
pub fn write_model(preset: &Preset, out: &Path, options: MakeOptions) -> Result<(), MakeError> {
    if out.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        return Err(MakeError::Invalid(format!(
            "{} already exists and is not empty",
            out.display()
        )));
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = parent.unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| MakeError::io(parent, e))?;
    let tmp = parent.join(format!(
        ".{}.{}.partial",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("model"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| MakeError::io(&tmp, e))?;
    let written = write_files(preset, &tmp, options);
    let renamed = written.and_then(|()| {
        let _ = std::fs::remove_dir(out);
        std::fs::rename(&tmp, out).map_err(|e| MakeError::io(out, e))
    });
    if renamed.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    renamed
}

fn write_files(preset: &Preset, dir: &Path, options: MakeOptions) -> Result<(), MakeError> {
    let dtype = options.dtype.unwrap_or(preset.dtype);
    let mut config = preset.config.clone();
    config["torch_dtype"] = json!(dtype.torch_name());
    write(&dir.join("config.json"), &pretty(&config))?;
    for (name, text) in TOKENIZER_FILES {
        write(&dir.join(name), text)?;
    }
    let tensors = tensor_shapes(&Shape::of(&config)?, &config);
    let shards = split(&tensors, dtype, options.shard_bytes);
    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = shard
            .par_iter()
            .map(|(name, shape, scale)| {
                let bytes = random_tensor(options.seed, name, shape, *scale, dtype);
                (name.clone(), shape.clone(), bytes)
            })
            .collect();
        let views = data
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(st_dtype(dtype), shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| MakeError::Invalid(format!("tensor `{name}`: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let path = dir.join(&file);
        let metadata = Some(std::collections::HashMap::from([(
            "format".to_string(),
            "pt".to_string(),
        )]));
        safetensors::serialize_to_file(views, metadata, &path)
            .map_err(|e| MakeError::Invalid(format!("{}: {e}", path.display())))?;
        for (name, _, _) in shard {
            weight_map.insert(name.clone(), file.clone());
        }
    }
    if count > 1 {
        let index = json!({"metadata": {}, "weight_map": weight_map});
        write(&dir.join("model.safetensors.index.json"), &pretty(&index))?;
    }
    Ok(())
}

/// (name, shape, scale): values are uniform in [-scale, scale], or 1 ± scale for norms.
type Planned = (String, Vec<usize>, f32);

/// What the tensor shapes depend on, read from a preset's `config.json`.
struct Shape {
    hidden_size: usize,
    intermediate_size: usize,
    vocab_size: usize,
    num_layers: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    tie_word_embeddings: bool,
    model_type: String,
}

impl Shape {
    fn of(config: &Value) -> Result<Self, MakeError> {
        let size = |key: &str| {
            config[key]
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| MakeError::Invalid(format!("config.json: `{key}` is missing")))
        };
        let num_heads = size("num_attention_heads")?;
        let hidden_size = size("hidden_size")?;
        Ok(Self {
            hidden_size,
            intermediate_size: size("intermediate_size")?,
            vocab_size: size("vocab_size")?,
            num_layers: size("num_hidden_layers")?,
            num_heads,
            num_kv_heads: size("num_key_value_heads").unwrap_or(num_heads),
            head_dim: size("head_dim").unwrap_or(hidden_size / num_heads),
            tie_word_embeddings: config["tie_word_embeddings"].as_bool().unwrap_or(false),
            model_type: config["model_type"].as_str().unwrap_or("llama").to_string(),
        })
    }
}

fn tensor_shapes(spec: &Shape, config: &Value) -> Vec<Planned> {
    let (d, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let (q, kv) = (
        spec.num_heads * spec.head_dim,
        spec.num_kv_heads * spec.head_dim,
    );
    let biased = spec.model_type == "qwen2" || config["attention_bias"] == json!(true);
    // Uniform on [-a, a] has standard deviation a / sqrt(3).
    let uniform = |std: f32| std * 3f32.sqrt();
    let linear = |fan_in: usize| uniform(1.0 / (fan_in as f32).sqrt());
    // Output rows with std 2/sqrt(d) give logits with a standard deviation of about 2.
    let output = uniform(2.0 / (d as f32).sqrt());
    let mut t: Vec<Planned> = vec![(
        "model.embed_tokens.weight".into(),
        vec![v, d],
        if spec.tie_word_embeddings {
            output
        } else {
            uniform(1.0)
        },
    )];
    for l in 0..spec.num_layers {
        let p = format!("model.layers.{l}");
        t.push((format!("{p}.input_layernorm.weight"), vec![d], 0.1));
        for (name, rows) in [("q", q), ("k", kv), ("v", kv)] {
            t.push((
                format!("{p}.self_attn.{name}_proj.weight"),
                vec![rows, d],
                linear(d),
            ));
            if biased {
                t.push((format!("{p}.self_attn.{name}_proj.bias"), vec![rows], 0.1));
            }
        }
        t.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![d, q],
            linear(q),
        ));
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![d], 0.1));
        t.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d], linear(d)));
        t.push((format!("{p}.mlp.up_proj.weight"), vec![f, d], linear(d)));
        t.push((format!("{p}.mlp.down_proj.weight"), vec![d, f], linear(f)));
    }
    t.push(("model.norm.weight".into(), vec![d], 0.1));
    if !spec.tie_word_embeddings {
        t.push(("lm_head.weight".into(), vec![v, d], output));
    }
    t
}

fn split(tensors: &[Planned], dtype: WeightType, limit: Option<usize>) -> Vec<Vec<Planned>> {
    let limit = limit.unwrap_or(usize::MAX).max(1);
    let mut shards: Vec<Vec<Planned>> = vec![Vec::new()];
    let mut size = 0;
    for t in tensors {
        let bytes = t.1.iter().product::<usize>() * dtype.width();
        if size > 0 && size + bytes > limit {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        if let Some(last) = shards.last_mut() {
            last.push(t.clone());
        }
    }
    shards
}

/// SplitMix64: a small, fast, well-mixed generator; each block of values has its own stream so
/// tensors are made in parallel and still identical for a seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

const BLOCK: usize = 1 << 16;

fn random_tensor(seed: u64, name: &str, shape: &[usize], scale: f32, dtype: WeightType) -> Vec<u8> {
    let len: usize = shape.iter().product();
    let norm = name.ends_with("norm.weight");
    let base = seed ^ name_hash(name);
    let width = dtype.width();
    let mut out = vec![0u8; len * width];
    out.par_chunks_mut(BLOCK * width)
        .enumerate()
        .for_each(|(block, bytes)| {
            let mut state = base.wrapping_add((block as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            for cell in bytes.chunks_exact_mut(width) {
                let unit = (splitmix(&mut state) >> 40) as f32 / (1u64 << 24) as f32;
                let x = (2.0 * unit - 1.0) * scale + if norm { 1.0 } else { 0.0 };
                match dtype {
                    WeightType::F32 => cell.copy_from_slice(&x.to_le_bytes()),
                    WeightType::F16 => cell.copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                    WeightType::Bf16 => {
                        cell.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes());
                    }
                }
            }
        });
    out
}

fn st_dtype(dtype: WeightType) -> Dtype {
    match dtype {
        WeightType::F32 => Dtype::F32,
        WeightType::F16 => Dtype::F16,
        WeightType::Bf16 => Dtype::BF16,
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

fn write(path: &Path, text: &str) -> Result<(), MakeError> {
    std::fs::write(path, text).map_err(|e| MakeError::io(path, e))
}

/// Where presets are made on first use: the user's cache (`$XDG_CACHE_HOME`, else
/// `~/.cache`), then the temporary folder.
pub(crate) fn cache_bases() -> Vec<PathBuf> {
    let user = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    user.into_iter()
        .chain(std::iter::once(std::env::temp_dir()))
        .map(|base| base.join("turnpike").join("models"))
        .collect()
}

/// The preset's folder, made first if it is not there yet: in the user's cache, or in the
/// temporary folder when the cache cannot be written (a read-only home in a container).
pub fn cached_model(preset: &Preset, seed: u64) -> Result<PathBuf, MakeError> {
    let name = format!("{}-seed{seed}-v{}", preset.name, env!("CARGO_PKG_VERSION"));
    let options = MakeOptions {
        seed,
        ..MakeOptions::default()
    };
    let mut last = None;
    for base in cache_bases() {
        let dir = base.join(&name);
        if dir.join("config.json").exists() {
            return Ok(dir);
        }
        match write_model(preset, &dir, options) {
            Ok(()) => return Ok(dir),
            // Another process made it first.
            Err(_) if dir.join("config.json").exists() => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| MakeError::Invalid("no folder to make the model in".into())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn tensor(dir: &Path, file: &str, name: &str) -> Vec<u8> {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensor(name).unwrap().data().to_vec()
    }

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_shards_split() {
        let dir = tempfile::tempdir().unwrap();
        let tiny = preset("tiny").unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write_model(&tiny, &a, MakeOptions::default()).unwrap();
        let sharded = MakeOptions {
            shard_bytes: Some(64 * 1024),
            ..MakeOptions::default()
        };
        write_model(&tiny, &b, sharded).unwrap();
        let index: Value = serde_json::from_str(
            &std::fs::read_to_string(b.join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let name = "model.layers.1.mlp.down_proj.weight";
        let shard = index["weight_map"][name].as_str().unwrap();
        assert_eq!(
            tensor(&a, "model.safetensors", name),
            tensor(&b, shard, name)
        );
        assert!(write_model(&tiny, &a, MakeOptions::default()).is_err());
    }
}
