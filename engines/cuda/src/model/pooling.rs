//! How an embedding model turns a text's last hidden states into one vector, as its
//! sentence-transformers configuration says: `modules.json` lists a `Pooling` module (its
//! folder's `config.json` names the mode, in the old `pooling_mode_*_tokens` flags or the newer
//! `pooling_mode`) and perhaps a `Normalize` module. A folder without one pools by the mean and
//! normalises (the engine's choice for decoders that were not trained for embeddings).

use std::path::Path;

use serde_json::Value;

use super::ModelError;

/// Which token states make the vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The mean of every token's state.
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
    /// The last token's (decoder embedding models such as Qwen3-Embedding).
    LastToken,
}

/// A model's pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    /// The mode.
    pub mode: PoolingMode,
    /// Whether vectors are L2-normalised.
    pub normalize: bool,
}

impl Default for Pooling {
    fn default() -> Self {
        Self {
            mode: PoolingMode::Mean,
            normalize: true,
        }
    }
}

impl Pooling {
    /// The folder's sentence-transformers pooling, or the default without one.
    pub fn from_folder(folder: &Path) -> Result<Self, ModelError> {
        let read = |path: &Path| -> Result<Option<Value>, ModelError> {
            match std::fs::read_to_string(path) {
                Ok(text) => serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| ModelError::Config(format!("{}: {e}", path.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(ModelError::io(path, e)),
            }
        };
        let Some(Value::Array(modules)) = read(&folder.join("modules.json"))? else {
            return Ok(Self::default());
        };
        let kind = |m: &Value, name: &str| m["type"].as_str().is_some_and(|t| t.ends_with(name));
        let normalize = modules.iter().any(|m| kind(m, ".Normalize"));
        let Some(pooling) = modules.iter().find(|m| kind(m, ".Pooling")) else {
            return Ok(Self {
                mode: PoolingMode::Mean,
                normalize,
            });
        };
        let path = folder
            .join(pooling["path"].as_str().unwrap_or("1_Pooling"))
            .join("config.json");
        let config = read(&path)?.unwrap_or(Value::Null);
        Ok(Self {
            mode: mode(&config)
                .map_err(|e| ModelError::Unsupported(format!("{}: {e}", path.display())))?,
            normalize,
        })
    }
}

fn mode(config: &Value) -> Result<PoolingMode, String> {
    let named = match config["pooling_mode"].as_str() {
        Some("mean") | None => None,
        Some("cls") => Some(PoolingMode::Cls),
        Some("lasttoken") => Some(PoolingMode::LastToken),
        Some(other) => return Err(format!("pooling mode `{other}` (mean, cls or lasttoken)")),
    };
    let flag = |key: &str| config[key].as_bool() == Some(true);
    Ok(named.unwrap_or(if flag("pooling_mode_cls_token") {
        PoolingMode::Cls
    } else if flag("pooling_mode_lasttoken") {
        PoolingMode::LastToken
    } else if flag("pooling_mode_max_tokens") || flag("pooling_mode_weightedmean_tokens") {
        return Err("max and weighted-mean pooling".into());
    } else {
        PoolingMode::Mean
    }))
}

/// `states` (rows of `width`, one per token) pooled as `mode` says.
pub fn pool(states: &[f32], width: usize, mode: PoolingMode) -> Vec<f32> {
    let rows = states.len() / width.max(1);
    match mode {
        PoolingMode::Cls => states[..width].to_vec(),
        PoolingMode::LastToken => states[(rows - 1) * width..rows * width].to_vec(),
        PoolingMode::Mean => {
            let mut mean = vec![0.0f32; width];
            for row in states.chunks_exact(width) {
                mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
            }
            mean.iter_mut().for_each(|m| *m /= rows as f32);
            mean
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_spellings_of_the_mode_are_read() {
        assert_eq!(mode(&json!({"pooling_mode": "cls"})), Ok(PoolingMode::Cls));
        assert_eq!(
            mode(&json!({"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false})),
            Ok(PoolingMode::LastToken)
        );
        assert_eq!(
            mode(&json!({"pooling_mode_mean_tokens": true})),
            Ok(PoolingMode::Mean)
        );
        assert!(mode(&json!({"pooling_mode_max_tokens": true})).is_err());
        let states = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(pool(&states, 2, PoolingMode::Mean), vec![2.0, 3.0]);
        assert_eq!(pool(&states, 2, PoolingMode::LastToken), vec![3.0, 4.0]);
    }
}
