//! A model's weights, memory-mapped: safetensors (single file or sharded,
//! `model.safetensors.index.json`) in a model folder, or one GGUF file.
//!
//! Tensors are read by their Hugging Face name and converted to f32 on demand (a GGUF tensor is
//! dequantized, and its rotary layout restored; see [`super::gguf::model`]); the mapped files stay
//! open only while the device copies what it needs.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::ModelError;
use super::gguf::Gguf;
use super::gguf::model::{self, Layout};
use super::packed::{Codes, Packed};

/// The weight files of a model, mapped.
#[derive(Debug)]
pub struct Weights {
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name -> index into `files` and the name the file stores it under.
    index: HashMap<String, (usize, String)>,
    /// The model's GGUF file, when it is one.
    gguf: Option<Gguf>,
}

/// One tensor, converted to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<f32>,
}

impl Weights {
    /// Maps `model.safetensors`, or every shard named by `model.safetensors.index.json`; or,
    /// when `folder` is a GGUF file, that file.
    pub fn open(folder: &Path) -> Result<Self, ModelError> {
        if folder.is_file() && Gguf::is_gguf(folder) {
            let gguf = Gguf::open(folder).map_err(ModelError::from)?;
            return Ok(Self {
                files: Vec::new(),
                index: HashMap::new(),
                gguf: Some(gguf),
            });
        }
        let index_path = folder.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if index_path.exists() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| ModelError::io(&index_path, e))?;
            let doc: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ModelError::Config(format!("{}: {e}", index_path.display())))?;
            let Some(map) = doc["weight_map"].as_object() else {
                return Err(ModelError::Config(format!(
                    "{}: no `weight_map`",
                    index_path.display()
                )));
            };
            let mut shards: Vec<PathBuf> = map
                .values()
                .filter_map(|v| v.as_str())
                .map(|s| folder.join(s))
                .collect();
            shards.sort();
            shards.dedup();
            shards
        } else {
            vec![folder.join("model.safetensors")]
        };
        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for path in names {
            let file = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the mapping is read-only and the engine never writes model files; a file
            // truncated underneath a running engine is outside what any mmap reader can guard.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
            let tensors = SafeTensors::deserialize(&map)
                .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
            for name in tensors.names() {
                let at = (files.len(), name.to_string());
                if let Some(alias) = decoder_name(name) {
                    index.insert(alias, at.clone());
                }
                index.insert(name.to_string(), at);
            }
            files.push((path, map));
        }
        Ok(Self {
            files,
            index,
            gguf: None,
        })
    }

    /// Whether the model has a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        match &self.gguf {
            Some(file) => {
                model::file_name(file, name).is_some_and(|(n, _)| file.tensor(&n).is_some())
            }
            None => self.index.contains_key(name),
        }
    }

    /// Reads a tensor as f32, checking its shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let tensor = self.read(name)?;
        if tensor.shape != shape {
            return Err(ModelError::Config(format!(
                "tensor `{name}` has shape {:?}, expected {shape:?}",
                tensor.shape
            )));
        }
        Ok(tensor)
    }

    /// Reads a matrix (`shape` is `[rows, cols]`) in its own precision, checking its shape.
    pub fn packed(&self, name: &str, shape: &[usize]) -> Result<Packed, ModelError> {
        let wrong = |got: &[usize]| {
            ModelError::Config(format!(
                "tensor `{name}` has shape {got:?}, expected {shape:?}"
            ))
        };
        let &[rows, cols] = shape else {
            return Err(wrong(&[]));
        };
        if let Some(file) = &self.gguf {
            let missing = || ModelError::Config(format!("tensor `{name}` is missing"));
            let (file_name, layout) = model::file_name(file, name).ok_or_else(missing)?;
            let info = file.tensor(&file_name).ok_or_else(missing)?;
            if info.shape != shape {
                return Err(wrong(&info.shape));
            }
            let matrix = file.pack(info).map_err(ModelError::from)?;
            return Ok(match layout {
                Layout::Same => matrix,
                Layout::Interleaved(heads) => {
                    let order = model::unpermuted_rows(rows, heads).ok_or_else(|| {
                        ModelError::Config(format!(
                            "tensor `{file_name}` ({shape:?}) does not split into {heads} heads"
                        ))
                    })?;
                    matrix.with_rows(&order)
                }
            });
        }
        let (path, tensors, map, stored) = self.safetensors(name)?;
        let view = tensors
            .tensor(stored)
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        if view.shape() != shape {
            return Err(wrong(view.shape()));
        }
        let halves = |bytes: &[u8]| {
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect()
        };
        let codes = match view.dtype() {
            Dtype::BF16 => Codes::Bf16(halves(view.data())),
            Dtype::F16 => Codes::F16(halves(view.data())),
            _ => return Ok(Packed::f32(rows, cols, self.read(name)?.data)),
        };
        super::pages::release(map, view.data());
        Ok(Packed { rows, cols, codes })
    }

    /// The safetensors file holding `name`, parsed, its map, and the name it stores it under.
    fn safetensors(&self, name: &str) -> Result<(&Path, SafeTensors<'_>, &Mmap, &str), ModelError> {
        let (file, stored) = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::Config(format!("tensor `{name}` is missing")))?;
        let file = *file;
        let (path, map) = &self.files[file];
        let tensors = SafeTensors::deserialize(map)
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        Ok((path, tensors, map, stored))
    }

    /// Reads a tensor as f32 whatever its shape.
    pub fn read(&self, name: &str) -> Result<Tensor, ModelError> {
        if let Some(file) = &self.gguf {
            return read_gguf(file, name);
        }
        let (path, tensors, map, stored) = self.safetensors(name)?;
        let view = tensors
            .tensor(stored)
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        let bytes = view.data();
        let data = match view.dtype() {
            Dtype::F32 => convert(bytes, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::F16 => convert(bytes, 2, |b| {
                half::f16::from_le_bytes([b[0], b[1]]).to_f32()
            }),
            Dtype::BF16 => convert(bytes, 2, |b| {
                half::bf16::from_le_bytes([b[0], b[1]]).to_f32()
            }),
            other => {
                return Err(ModelError::Unsupported(format!(
                    "tensor `{name}` has dtype {other:?} (supported: F32, F16, BF16)"
                )));
            }
        };
        super::pages::release(map, bytes);
        Ok(Tensor {
            shape: view.shape().to_vec(),
            data,
        })
    }
}

fn convert(bytes: &[u8], width: usize, one: impl Fn(&[u8]) -> f32) -> Vec<f32> {
    bytes.chunks_exact(width).map(one).collect()
}

/// The GGUF tensor that is the checkpoint's `name`, dequantized, in the checkpoint's layout.
fn read_gguf(file: &Gguf, name: &str) -> Result<Tensor, ModelError> {
    let missing = || ModelError::Config(format!("tensor `{name}` is missing"));
    let (file_name, layout) = model::file_name(file, name).ok_or_else(missing)?;
    let info = file.tensor(&file_name).ok_or_else(missing)?;
    let mut data = file.dequantize(info).map_err(ModelError::from)?;
    if let Layout::Interleaved(heads) = layout {
        let rows = info.shape.first().copied().unwrap_or(0);
        data = model::unpermute(&data, rows, heads).ok_or_else(|| {
            ModelError::Config(format!(
                "tensor `{file_name}` ({:?}) does not split into {heads} heads",
                info.shape
            ))
        })?;
    }
    Ok(Tensor {
        shape: info.shape.clone(),
        data,
    })
}

/// The decoder's name for a tensor saved under another: a base model saved without its head
/// (`Qwen3Model`, as embedding models are) names its tensors without the `model.` prefix; a
/// multimodal checkpoint (Gemma 3) nests its language model as `language_model.model.` (older
/// `transformers`) or `model.language_model.` (newer). The other towers keep their names and are
/// never read.
fn decoder_name(name: &str) -> Option<String> {
    if name.starts_with("layers.") || matches!(name, "embed_tokens.weight" | "norm.weight") {
        return Some(format!("model.{name}"));
    }
    if let Some(rest) = name.strip_prefix("model.language_model.") {
        return Some(format!("model.{rest}"));
    }
    name.strip_prefix("language_model.")
        .filter(|rest| rest.starts_with("model.") || rest.starts_with("lm_head."))
        .map(str::to_string)
}
