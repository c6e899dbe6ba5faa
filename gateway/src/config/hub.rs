//! Naming a model the way users do: a Hugging Face Hub id, resolved through the standard Hub
//! cache (`HF_HOME`, else `~/.cache/huggingface`) with the `hf-hub` crate. What the cache lacks
//! is downloaded into it first, from `HF_ENDPOINT` (else huggingface.co) with `HF_TOKEN` (else
//! the cache's token file) where one is set, as `huggingface-cli download` would; with
//! `HF_HUB_OFFLINE` set the cache is all there is, and a model that is not there is an error
//! saying how to download it.
//!
//! - `org/name` or `org/name@revision`: the repository's snapshot folder (its `config.json`,
//!   weights and tokenizer), at `main` or the revision (a branch, tag or commit);
//! - `org/name/FILE.gguf` or `org/name@revision/FILE.gguf`: one GGUF file of the repository.

use std::path::PathBuf;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

/// Whether `spec` reads as a Hub id rather than a path: `org/name`, with an optional
/// `@revision` and an optional `/FILE.gguf`, and nothing that only paths have.
pub(crate) fn is_hub_id(spec: &str) -> bool {
    let parts: Vec<&str> = spec.split('/').collect();
    let valid = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    };
    match parts.as_slice() {
        [org, name] => valid(org) && valid(name),
        [org, name, file] => valid(org) && valid(name) && file.ends_with(".gguf") && valid(file),
        _ => false,
    }
}

/// The name a Hub id serves as by default: the repository's (`org/name@v1` is `name`), or the
/// file's (`org/name/model.gguf` is `model.gguf`).
pub(crate) fn model_name(spec: &str) -> Option<String> {
    let last = spec.rsplit('/').next()?;
    let name = if last.ends_with(".gguf") {
        last
    } else {
        last.split('@').next()?
    };
    Some(name.to_string())
}

/// A Hub id taken apart.
struct HubId<'a> {
    /// `org/name`.
    repo: String,
    /// A branch, tag or commit (`main` when not given).
    revision: String,
    /// One file of the repository, or `None` for the model folder.
    file: Option<&'a str>,
}

impl<'a> HubId<'a> {
    fn parse(spec: &'a str) -> Result<Self, String> {
        let (repo, file) = match spec.split('/').collect::<Vec<_>>().as_slice() {
            [org, name] => (format!("{org}/{name}"), None),
            [org, name, file] => (format!("{org}/{name}"), Some(*file)),
            _ => return Err(format!("`{spec}` is not a Hub id like org/name")),
        };
        let (repo, revision) = match repo.split_once('@') {
            Some((id, revision)) => (id.to_string(), revision.to_string()),
            None => (repo.clone(), "main".to_string()),
        };
        Ok(Self {
            repo,
            revision,
            file,
        })
    }

    fn repo(&self) -> Repo {
        Repo::with_revision(self.repo.clone(), RepoType::Model, self.revision.clone())
    }
}

/// The model `spec` names in `cache` (see the module's doc).
pub(crate) fn resolve_in(cache: &Cache, spec: &str) -> Result<PathBuf, String> {
    let HubId {
        repo: id,
        revision,
        file,
    } = HubId::parse(spec)?;
    let cached = cache.repo(Repo::with_revision(
        id.clone(),
        RepoType::Model,
        revision.clone(),
    ));
    let missing = |what: &str| {
        format!(
            "{what} of `{id}` at `{revision}` is not in the Hugging Face cache ({}); download it with `huggingface-cli download {id}{}`",
            cache.path().display(),
            if revision == "main" {
                String::new()
            } else {
                format!(" --revision {revision}")
            }
        )
    };
    // A branch or tag is a ref naming a commit; a commit names its snapshot directly.
    let find = |name: &str| {
        cached.get(name).or_else(|| {
            let direct = cached.pointer_path(&revision).join(name);
            direct.is_file().then_some(direct)
        })
    };
    match file {
        Some(file) => find(file).ok_or_else(|| missing(&format!("`{file}`"))),
        None => find("config.json")
            .and_then(|config| config.parent().map(PathBuf::from))
            .ok_or_else(|| missing("the model folder")),
    }
}

/// The model `spec` names: from the Hub cache the environment points at, downloaded into it
/// first where it is missing, unless `HF_HUB_OFFLINE` is set.
pub(crate) fn resolve(spec: &str) -> Result<PathBuf, String> {
    match resolve_in(&Cache::from_env(), spec) {
        Ok(path) => Ok(path),
        Err(missing) if offline() => Err(format!("{missing} (HF_HUB_OFFLINE is set)")),
        Err(_) => download(spec),
    }
}

/// Whether `HF_HUB_OFFLINE` asks for the cache alone (as `huggingface_hub` reads it).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The files of a model folder the engines read: configuration, tokenizer and safetensors
/// weights (not other formats' copies of the same weights).
fn is_model_file(name: &str) -> bool {
    !name.contains('/')
        && (name.ends_with(".safetensors")
            || matches!(
                name,
                "config.json"
                    | "generation_config.json"
                    | "tokenizer.json"
                    | "tokenizer_config.json"
                    | "special_tokens_map.json"
                    | "model.safetensors.index.json"
            ))
}

/// Downloads what `spec` names into the Hub cache and returns it as [`resolve_in`] would.
fn download(spec: &str) -> Result<PathBuf, String> {
    let id = HubId::parse(spec)?;
    let mut builder = ApiBuilder::from_env().with_progress(false);
    if let Ok(token) = std::env::var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let api = builder
        .build()
        .map_err(|e| format!("cannot reach the Hub: {e}"))?;
    let repo = api.repo(id.repo());
    let fetch = |file: &str| {
        tracing::info!(repo = %id.repo, revision = %id.revision, file, "downloading from the Hub");
        repo.download(file).map_err(|e| {
            format!(
                "cannot download `{file}` of `{}` at `{}`: {e}",
                id.repo, id.revision
            )
        })
    };
    if let Some(file) = id.file {
        return fetch(file);
    }
    let info = repo
        .info()
        .map_err(|e| format!("cannot list `{}` at `{}`: {e}", id.repo, id.revision))?;
    let files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|name| is_model_file(name))
        .collect();
    if !files.contains(&"config.json") {
        return Err(format!(
            "`{}` has no config.json: name one of its .gguf files as {}/FILE.gguf",
            id.repo, id.repo
        ));
    }
    let mut folder = None;
    for file in files {
        let path = fetch(file)?;
        if file == "config.json" {
            folder = path.parent().map(PathBuf::from);
        }
    }
    folder.ok_or_else(|| format!("`{}` downloaded without a folder", id.repo))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Hub cache holding `org/name` at commit `abc` (branch `main`), with a folder and a file.
    fn cache() -> (tempfile::TempDir, Cache) {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("models--org--name");
        let snapshot = repo.join("snapshots/abc");
        std::fs::create_dir_all(&snapshot).expect("snapshot");
        std::fs::create_dir_all(repo.join("refs")).expect("refs");
        std::fs::write(repo.join("refs/main"), "abc").expect("ref");
        std::fs::write(snapshot.join("config.json"), "{}").expect("config");
        std::fs::write(snapshot.join("model-Q4_1.gguf"), "GGUF").expect("gguf");
        let cache = Cache::new(dir.path().to_path_buf());
        (dir, cache)
    }

    #[test]
    fn hub_ids_resolve_offline_through_the_cache_layout() {
        let (dir, cache) = cache();
        let snapshot = dir.path().join("models--org--name/snapshots/abc");
        assert_eq!(resolve_in(&cache, "org/name"), Ok(snapshot.clone()));
        assert_eq!(resolve_in(&cache, "org/name@abc"), Ok(snapshot.clone()));
        assert_eq!(
            resolve_in(&cache, "org/name/model-Q4_1.gguf"),
            Ok(snapshot.join("model-Q4_1.gguf"))
        );
        let missing = resolve_in(&cache, "org/other").expect_err("missing");
        assert!(
            missing.contains("huggingface-cli download org/other"),
            "{missing}"
        );
        let revision = resolve_in(&cache, "org/name@v2").expect_err("missing");
        assert!(revision.contains("--revision v2"), "{revision}");
    }

    #[test]
    fn paths_are_not_hub_ids() {
        assert!(is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(is_hub_id("org/name@v1.0"));
        assert!(is_hub_id("org/name/model.Q4_1.gguf"));
        for path in [
            "model.gguf",
            "./org/name",
            "/abs/path",
            "a/b/c",
            "org/../x",
            "org//x",
        ] {
            assert!(!is_hub_id(path), "{path}");
        }
    }
}
