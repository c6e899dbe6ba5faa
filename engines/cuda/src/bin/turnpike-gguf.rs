//! `turnpike-gguf`: what the default engine reads in a GGUF file.
//!
//! - `turnpike-gguf info FILE`: the format version, the metadata and the tensor table (name,
//!   shape outermost first, type), as JSON.
//! - `turnpike-gguf dequantize FILE [NAME ...]`: the named tensors (all without names) as f32
//!   values, row-major, as JSON; a tensor of a type the engine does not load is an error that
//!   names the type.
//! - `turnpike-gguf tokenizer FILE FOLDER`: writes the `tokenizer.json` and
//!   `tokenizer_config.json` the file's metadata makes (what the gateway reads as a model folder).
//!
//! The numerics tests hold the engine's reader and dequantizers to ggml's own Python package
//! through this tool; operators can use it to see whether the engine loads a file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Map, Value, json};
use turnpike_cuda::model::gguf::tokenizer::write_tokenizer;
use turnpike_cuda::model::gguf::{Gguf, GgufError, MetaValue};

fn meta(value: &MetaValue) -> Value {
    match value {
        MetaValue::Uint(v) => json!(v),
        MetaValue::Int(v) => json!(v),
        MetaValue::Float(v) => json!(v),
        MetaValue::Bool(v) => json!(v),
        MetaValue::String(v) => json!(v),
        MetaValue::Array(items) => Value::Array(items.iter().map(meta).collect()),
    }
}

fn info(file: &Gguf) -> Value {
    let metadata: Map<String, Value> = file
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), meta(v)))
        .collect();
    let tensors: Vec<Value> = file
        .tensors
        .iter()
        .map(|t| json!({"name": t.name, "shape": t.shape, "type": t.kind.name()}))
        .collect();
    json!({"version": file.version, "metadata": metadata, "tensors": tensors})
}

fn dequantize(file: &Gguf, names: &[String]) -> Result<Value, GgufError> {
    let mut out = Vec::new();
    for tensor in &file.tensors {
        if !names.is_empty() && !names.contains(&tensor.name) {
            continue;
        }
        let values = file.dequantize(tensor)?;
        out.push(json!({"name": tensor.name, "shape": tensor.shape,
                        "type": tensor.kind.name(), "values": values}));
    }
    Ok(json!({"tensors": out}))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(command), Some(path)) = (args.first(), args.get(1)) else {
        let _ = writeln!(
            std::io::stderr(),
            "usage: turnpike-gguf info FILE | dequantize FILE [NAME ...] | tokenizer FILE FOLDER"
        );
        return ExitCode::from(2);
    };
    let result = Gguf::open(Path::new(path)).and_then(|file| match command.as_str() {
        "info" => Ok(info(&file)),
        "tokenizer" => {
            let folder = args.get(2).map_or_else(|| Path::new("."), |f| Path::new(f));
            write_tokenizer(&file, folder)
                .map(|path| json!({"tokenizer": path}))
                .map_err(|e| GgufError::Format {
                    path: PathBuf::from(path),
                    message: e.to_string(),
                })
        }
        _ => dequantize(&file, &args[2..]),
    });
    match result {
        Ok(value) => {
            let mut stdout = std::io::stdout().lock();
            let _ = serde_json::to_writer(&mut stdout, &value);
            let _ = stdout.write_all(b"\n");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "turnpike-gguf: {e}");
            ExitCode::FAILURE
        }
    }
}
