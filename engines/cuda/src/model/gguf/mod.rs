//! GGUF files (llama.cpp's single-file model format, versions 2 and 3), memory-mapped: the
//! metadata (key-value pairs), the tensor table, and each tensor's bytes in place, dequantized
//! to f32 on request ([`quant`]).
//!
//! The layout, all little-endian: `GGUF`, the version (u32), the tensor count and the metadata
//! count (u64 each); the metadata pairs (a string key, a u32 type, the value); the tensor infos
//! (a string name, the number of dimensions (u32), each dimension (u64, innermost first), the
//! type (u32), the offset into the data (u64)); then the data, aligned to `general.alignment`
//! (32 when unset). A string is a u64 length and its UTF-8 bytes.
//!
//! Written here rather than taken from a crate: the format is a page long, the readers on
//! crates.io are young single-maintainer projects, and the engine needs only this much of it.
//! Every length and offset read from the file is checked against the file before use.

pub mod low_bit;
pub mod model;
pub mod quant;
pub mod repack;
pub mod sentencepiece;
pub mod tokenizer;
pub mod wordpiece;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::packed::Packed;

pub use quant::{GgmlType, SUPPORTED};

/// Why a GGUF file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not GGUF, or is cut short or inconsistent.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor is of a type this engine does not load.
    #[error(
        "{path}: tensor `{tensor}` is {kind}, which this engine does not load (it loads {SUPPORTED})"
    )]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its type's name.
        kind: String,
    },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// An unsigned integer (u8, u16, u32, u64).
    Uint(u64),
    /// A signed integer (i8, i16, i32, i64).
    Int(i64),
    /// A float (f32, f64).
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
    /// An array of values.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::Uint(v) => Some(v),
            Self::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::Float(v) => Some(v),
            Self::Uint(v) => Some(v as f64),
            Self::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's entry in the table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its shape, outermost first (GGUF stores it innermost first).
    pub shape: Vec<usize>,
    /// Its type.
    pub kind: GgmlType,
    /// Where its bytes start, from the start of the file.
    start: usize,
    /// How many bytes it has (`None` for a type this engine does not load).
    len: Option<usize>,
}

impl TensorInfo {
    /// How many values it holds.
    pub fn values(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A GGUF file, mapped.
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    map: Mmap,
    /// The format version (2 or 3).
    pub version: u32,
    /// The metadata, by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// The tensors, in file order.
    pub tensors: Vec<TensorInfo>,
}

/// A cursor over the file's bytes that fails, rather than panics, past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| format!("cut short at byte {} (wanted {n} more)", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length or count, bounded by what is left of the file (each item takes a byte at least).
    fn count(&mut self) -> Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len() - self.at)
            .ok_or_else(|| format!("a count of {n} at byte {} is past the file", self.at - 8))
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.count()?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("a string at byte {} is not UTF-8", self.at - n))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<MetaValue, String> {
        Ok(match kind {
            0 => MetaValue::Uint(u64::from(self.array::<1>()?[0])),
            1 => MetaValue::Int(i64::from(self.array::<1>()?[0] as i8)),
            2 => MetaValue::Uint(u64::from(u16::from_le_bytes(self.array()?))),
            3 => MetaValue::Int(i64::from(i16::from_le_bytes(self.array()?))),
            4 => MetaValue::Uint(u64::from(self.u32()?)),
            5 => MetaValue::Int(i64::from(i32::from_le_bytes(self.array()?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.array()?))),
            7 => MetaValue::Bool(self.array::<1>()?[0] != 0),
            8 => MetaValue::String(self.string()?),
            9 if depth < 4 => {
                let item = self.u32()?;
                let n = self.count()?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(item, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::Uint(self.u64()?),
            11 => MetaValue::Int(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(format!(
                    "unknown metadata type {other} at byte {}",
                    self.at - 4
                ));
            }
        })
    }
}

impl Gguf {
    /// Maps and reads the file at `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and the engine never writes model files; a file
        // truncated underneath a running engine is outside what any mmap reader can guard.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (version, metadata, tensors) = parse(&map).map_err(|message| GgufError::Format {
            path: path.to_path_buf(),
            message,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            tensors,
        })
    }

    /// Whether `path` starts like a GGUF file.
    pub fn is_gguf(path: &Path) -> bool {
        use std::io::Read;
        let mut magic = [0u8; 4];
        File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok_and(|()| &magic == b"GGUF")
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of `tensor`, as stored; an error for a type this engine does not load.
    pub fn bytes(&self, tensor: &TensorInfo) -> Result<&[u8], GgufError> {
        let len = tensor.len.ok_or_else(|| GgufError::Unsupported {
            path: self.path.clone(),
            tensor: tensor.name.clone(),
            kind: tensor.kind.name(),
        })?;
        Ok(&self.map[tensor.start..tensor.start + len])
    }

    /// `tensor` as a matrix of its outermost dimension's rows, in its own precision (its
    /// pages of the file are then given back: a loader reads each tensor once).
    pub fn pack(&self, tensor: &TensorInfo) -> Result<Packed, GgufError> {
        let bytes = self.bytes(tensor)?;
        let rows = tensor.shape.first().copied().unwrap_or(1);
        let cols = tensor.values() / rows.max(1);
        let packed = repack::pack(tensor.kind, bytes, rows, cols);
        super::pages::release(&self.map, bytes);
        packed.ok_or_else(|| GgufError::Format {
            path: self.path.clone(),
            message: format!(
                "tensor `{}` ({:?}, {}) does not split into rows of whole blocks",
                tensor.name,
                tensor.shape,
                tensor.kind.name()
            ),
        })
    }

    /// `tensor`'s values as f32, row-major (its pages of the file then given back).
    pub fn dequantize(&self, tensor: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let bytes = self.bytes(tensor)?;
        let mut out = vec![0.0f32; tensor.values()];
        let whole = quant::dequantize(tensor.kind, bytes, &mut out);
        super::pages::release(&self.map, bytes);
        if !whole {
            return Err(GgufError::Format {
                path: self.path.clone(),
                message: format!("tensor `{}` does not hold whole blocks", tensor.name),
            });
        }
        Ok(out)
    }
}

/// The metadata and tensor table of a file's bytes, every tensor checked to lie inside it.
type Parsed = (u32, BTreeMap<String, MetaValue>, Vec<TensorInfo>);

fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4)? != b"GGUF" {
        return Err("not a GGUF file (no `GGUF` magic)".into());
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (2 and 3 are)"
        ));
    }
    let tensor_count = r.count()?;
    let kv_count = r.count()?;
    let mut metadata = BTreeMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r.value(kind, 0)?;
        metadata.insert(key, value);
    }
    let mut infos = Vec::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let name = r.string()?;
        let dims = r.u32()?;
        if dims > 8 {
            return Err(format!("tensor `{name}` has {dims} dimensions"));
        }
        let mut shape = Vec::with_capacity(dims as usize);
        for _ in 0..dims {
            let d = r.u64()?;
            shape.push(usize::try_from(d).map_err(|_| format!("tensor `{name}` is too large"))?);
        }
        shape.reverse();
        let kind = GgmlType::from_id(r.u32()?);
        let offset = r.u64()?;
        infos.push((name, shape, kind, offset));
    }
    let alignment = metadata
        .get("general.alignment")
        .and_then(MetaValue::as_u64)
        .unwrap_or(32);
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(format!(
            "general.alignment is {alignment}, not a power of two"
        ));
    }
    let alignment = alignment as usize;
    let data = r.at.div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, shape, kind, offset) in infos {
        let values = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| format!("tensor `{name}` is too large"))?;
        let len = match kind.block() {
            Some((per_block, size)) => {
                if !values.is_multiple_of(per_block) {
                    return Err(format!(
                        "tensor `{name}` holds {values} values, not whole blocks of {per_block}"
                    ));
                }
                Some(values / per_block * size)
            }
            None => None,
        };
        let start = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(data))
            .ok_or_else(|| format!("tensor `{name}` starts past the file"))?;
        if start > bytes.len() || len.is_some_and(|len| len > bytes.len() - start) {
            return Err(format!("tensor `{name}` runs past the end of the file"));
        }
        tensors.push(TensorInfo {
            name,
            shape,
            kind,
            start,
            len,
        });
    }
    Ok((version, metadata, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file with one `general.alignment` entry and the given tensors (name, shape
    /// innermost first, type id, data), laid out as ggml writes it.
    fn file(tensors: &[(&str, &[u64], u32, &[u8])]) -> Vec<u8> {
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        };
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend(1u64.to_le_bytes());
        string(&mut out, "general.alignment");
        out.extend(4u32.to_le_bytes());
        out.extend(32u32.to_le_bytes());
        let mut offset = 0u64;
        for (name, dims, kind, data) in tensors {
            string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(kind.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, _, data) in tensors {
            out.extend(*data);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }

    #[test]
    fn tensors_are_found_with_their_shape_outermost_first() {
        let values: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes = file(&[("w", &[3, 2], 0, &values), ("q", &[256], 16, &[0; 66])]);
        let (version, metadata, tensors) = parse(&bytes).expect("parses");
        assert_eq!(version, 3);
        assert_eq!(metadata["general.alignment"], MetaValue::Uint(32));
        assert_eq!(tensors[0].shape, vec![2, 3]);
        assert_eq!(tensors[0].kind, GgmlType::F32);
        assert_eq!(tensors[1].kind.name(), "IQ2_XXS");
        assert_eq!(tensors[1].len, None);
    }

    #[test]
    fn cut_or_lying_files_are_errors_not_panics() {
        let values = [0u8; 24];
        let whole = file(&[("w", &[3, 2], 0, &values)]);
        for cut in [0, 3, 10, 30, whole.len() - 30] {
            assert!(parse(&whole[..cut]).is_err(), "cut at {cut}");
        }
        assert!(parse(b"GGML\x03\0\0\0").is_err());
        // A dimension that overflows the value count.
        let huge = file(&[("w", &[u64::MAX, 3], 0, &values)]);
        assert!(parse(&huge).is_err());
    }
}
