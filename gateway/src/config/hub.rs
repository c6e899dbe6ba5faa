//! Naming a model the way users do: a Hugging Face Hub id, resolved through the standard Hub
//! cache (`HF_HOME`, else `~/.cache/huggingface`) with the `hf-hub` crate's cache reader. The
//! gateway only reads the cache, so offline use is the only use: a model that is not there is
//! an error saying how to download it.
//!
//! - `org/name` or `org/name@revision`: the repository's snapshot folder (its `config.json`,
//!   weights and tokenizer), at `main` or the revision (a branch, tag or commit);
//! - `org/name/FILE.gguf` or `org/name@revision/FILE.gguf`: one GGUF file of the repository.

use std::path::PathBuf;

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

/// The model `spec` names in `cache` (see the module's doc).
pub(crate) fn resolve_in(cache: &Cache, spec: &str) -> Result<PathBuf, String> {
    let (repo, file) = match spec.split('/').collect::<Vec<_>>().as_slice() {
        [org, name] => (format!("{org}/{name}"), None),
        [org, name, file] => (format!("{org}/{name}"), Some(*file)),
        _ => return Err(format!("`{spec}` is not a Hub id like org/name")),
    };
    let (id, revision) = match repo.split_once('@') {
        Some((id, revision)) => (id.to_string(), revision.to_string()),
        None => (repo.clone(), "main".to_string()),
    };
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

/// The model `spec` names in the Hub cache the environment points at.
pub(crate) fn resolve(spec: &str) -> Result<PathBuf, String> {
    resolve_in(&Cache::from_env(), spec)
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
