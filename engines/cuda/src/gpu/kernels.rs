//! The CUDA C kernels (`engines/cuda/kernels/`), compiled with NVRTC at first use for the
//! GPU's architecture and cached on disk.
//!
//! Each `.cu` file is compiled on its own, after the shared prelude, into PTX for
//! `compute_XY`; the driver turns the PTX into machine code when it loads it. The cache key
//! is a hash of the source, the architecture, the options and the NVRTC version, so a changed
//! kernel or compiler never loads stale code. [`check_all`] is what CI runs without a GPU:
//! every file for every architecture the engine supports, where a warning fails like an error.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};

/// The text every kernel file is compiled after.
pub const PRELUDE: &str = include_str!("../../kernels/prelude.cuh");

/// Every kernel file: its name and its source.
pub const SOURCES: &[(&str, &str)] = &[
    ("embedding", include_str!("../../kernels/embedding.cu")),
    ("norm", include_str!("../../kernels/norm.cu")),
    ("rotary", include_str!("../../kernels/rotary.cu")),
    ("activation", include_str!("../../kernels/activation.cu")),
    ("attention", include_str!("../../kernels/attention.cu")),
    (
        "dense_attention",
        include_str!("../../kernels/dense_attention.cu"),
    ),
    ("sampling", include_str!("../../kernels/sampling.cu")),
];

/// The architectures the engine is built and checked for (Ampere and Hopper data-centre GPUs).
pub const CHECKED_ARCHITECTURES: &[(u32, u32)] = &[(8, 0), (9, 0)];

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// NVRTC is missing or failed outside the compilation itself.
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// The source did not compile.
    #[error("kernel `{name}` for {arch} did not compile:\n{log}")]
    Compile {
        /// The kernel file.
        name: String,
        /// `compute_XY`.
        arch: String,
        /// The compiler's messages.
        log: String,
    },
}

/// What NVRTC produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// PTX for `compute_XY`, which the driver compiles at load (what the engine runs).
    Ptx,
    /// Machine code for `sm_XY` (runs the assembler too; CI uses it to catch what only the
    /// assembler sees, such as resource limits).
    Cubin,
}

/// The NVRTC options for an architecture.
pub fn options(major: u32, minor: u32, target: Target) -> Vec<String> {
    let arch = match target {
        Target::Ptx => format!("compute_{major}{minor}"),
        Target::Cubin => format!("sm_{major}{minor}"),
    };
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
        "--extra-device-vectorization".to_owned(),
    ];
    if target == Target::Cubin {
        // A register spill is a warning, and so fails the check.
        options.push("--ptxas-options=--warn-on-spills".to_owned());
    }
    options
}

/// Compiles one kernel file; returns its PTX (empty for [`Target::Cubin`]) and the
/// compiler's log (warnings; empty when clean).
pub fn compile(
    name: &str,
    source: &str,
    major: u32,
    minor: u32,
    target: Target,
) -> Result<(String, String), KernelError> {
    let opts = options(major, minor, target);
    let arch = opts[0].trim_start_matches("--gpu-architecture=").to_owned();
    let text = CString::new(format!("{PRELUDE}\n{source}"))
        .map_err(|_| KernelError::Nvrtc(format!("kernel `{name}` contains a NUL byte")))?;
    let file = CString::new(format!("{name}.cu"))
        .map_err(|_| KernelError::Nvrtc(format!("kernel name `{name}` contains a NUL byte")))?;
    let program =
        nvrtc::create_program(&text, Some(&file)).map_err(|e| KernelError::Nvrtc(e.to_string()))?;
    // SAFETY: `program` was just created and is destroyed only below.
    let compiled = unsafe { nvrtc::compile_program(program, &opts) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::get_program_log(program) }
        .map(|raw| c_text(&raw))
        .unwrap_or_default();
    let ptx = match (compiled, target) {
        (Ok(()), Target::Cubin) => Ok(String::new()),
        // SAFETY: as above; the program compiled.
        (Ok(()), Target::Ptx) => unsafe { nvrtc::get_ptx(program) }
            .map(|raw| c_text(&raw))
            .map_err(|e| KernelError::Nvrtc(e.to_string())),
        (Err(_), _) => Err(KernelError::Compile {
            name: name.to_owned(),
            arch,
            log: log.clone(),
        }),
    };
    // SAFETY: `program` is not used after this.
    let _ = unsafe { nvrtc::destroy_program(program) };
    Ok((ptx?, log.trim().to_owned()))
}

/// Compiles every kernel file for every checked architecture, to PTX and to machine code;
/// any warning is an error. Returns the number of compilations.
pub fn check_all() -> Result<usize, KernelError> {
    let mut compiled = 0;
    for &(major, minor) in CHECKED_ARCHITECTURES {
        for target in [Target::Ptx, Target::Cubin] {
            for &(name, source) in SOURCES {
                let (_, log) = compile(name, source, major, minor, target)?;
                if !log.is_empty() {
                    return Err(KernelError::Compile {
                        name: name.to_owned(),
                        arch: options(major, minor, target)[0].clone(),
                        log,
                    });
                }
                compiled += 1;
            }
        }
    }
    Ok(compiled)
}

/// The PTX of one kernel file for `major.minor`, from the disk cache when it holds it, with
/// the compiler's warnings when it had to compile (empty otherwise).
pub fn ptx_cached(
    name: &str,
    source: &str,
    major: u32,
    minor: u32,
    dir: Option<&Path>,
) -> Result<(String, String), KernelError> {
    let key = cache_key(source, major, minor);
    let path = dir.map(|d| d.join(format!("{name}-sm{major}{minor}-{key}.ptx")));
    if let Some(path) = &path
        && let Ok(ptx) = std::fs::read_to_string(path)
    {
        return Ok((ptx, String::new()));
    }
    let (ptx, log) = compile(name, source, major, minor, Target::Ptx)?;
    if let Some(path) = &path {
        store(path, &ptx);
    }
    Ok((ptx, log))
}

/// Where compiled kernels are kept: `$XDG_CACHE_HOME/turnpike/kernels` or
/// `~/.cache/turnpike/kernels`, else the temporary folder; `None` when none can be written.
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    base.map(|b| b.join("turnpike").join("kernels"))
        .into_iter()
        .chain(std::iter::once(
            std::env::temp_dir().join("turnpike-kernels"),
        ))
        .find(|dir| std::fs::create_dir_all(dir).is_ok())
}

fn cache_key(source: &str, major: u32, minor: u32) -> String {
    let mut hash = Sha256::new();
    hash.update(PRELUDE.as_bytes());
    hash.update(source.as_bytes());
    for option in options(major, minor, Target::Ptx) {
        hash.update(option.as_bytes());
        hash.update([0u8]);
    }
    hash.update(nvrtc_version().as_bytes());
    hash.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `major.minor` of the loaded NVRTC.
pub fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; the library was probed before any kernel is compiled.
    let status = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if status == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        "unknown".to_owned()
    }
}

/// Writes `ptx` to `path` through a temporary file, so a reader never sees half of it.
fn store(path: &Path, ptx: &str) {
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&temp, ptx).is_ok() && std::fs::rename(&temp, path).is_err() {
        let _ = std::fs::remove_file(&temp);
    }
}

fn c_text(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How many parameters kernel `function` of `source` takes (`None` if it is not there); the
/// device checks every launch against it, so an argument list that drifts from its kernel is
/// an error instead of undefined behaviour.
pub fn parameter_count(source: &str, function: &str) -> Option<usize> {
    let opening = format!("{function}(");
    let start = source.match_indices(&opening).find_map(|(at, _)| {
        let line = source[..at].rsplit('\n').next().unwrap_or("");
        line.contains("__global__").then_some(at + opening.len())
    })?;
    let end = start + source.get(start..)?.find(')')?;
    let params = source.get(start..end)?.trim();
    Some(if params.is_empty() {
        0
    } else {
        params.split(',').count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_found_with_its_parameters() {
        let expected = [
            ("embedding", "embedding_gather", 5),
            ("norm", "rms_norm_residual", 8),
            ("norm", "rms_norm_rows", 4),
            ("rotary", "rotary_kv_store", 16),
            ("activation", "silu_and_mul", 4),
            ("activation", "logit_softcap", 3),
            ("attention", "paged_attention", 19),
            ("attention", "attention_combine", 7),
            ("dense_attention", "gather_kv", 10),
            ("dense_attention", "pack_queries", 4),
            ("dense_attention", "masked_softmax", 6),
            ("sampling", "sample_rows", 12),
        ];
        for (file, function, count) in expected {
            let source = SOURCES.iter().find(|(n, _)| *n == file).map(|(_, s)| *s);
            assert_eq!(
                source.and_then(|s| parameter_count(s, function)),
                Some(count),
                "{function}"
            );
        }
        assert_eq!(parameter_count("__global__ void k() {}", "k"), Some(0));
        assert_eq!(
            parameter_count(
                "// k(a) calls\n__global__ void __launch_bounds__(64) k(int a, int b) {}",
                "k"
            ),
            Some(2)
        );
        assert_eq!(
            parameter_count("__global__ void k(int a) {}", "missing"),
            None
        );
    }
}
