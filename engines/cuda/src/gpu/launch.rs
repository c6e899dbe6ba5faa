//! The loaded kernels and the one way they are launched.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result as driver;
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::kernels::{SOURCES, cache_dir, parameter_count, ptx_cached};
use crate::device::DeviceError;

/// A loaded kernel function and the number of parameters its source declares.
#[derive(Debug)]
pub(super) struct Kernel {
    function: CudaFunction,
    name: &'static str,
    parameters: usize,
}

/// Every kernel function the device launches.
#[derive(Debug)]
pub(super) struct Kernels {
    pub embedding_gather: Kernel,
    pub rms_norm_residual: Kernel,
    pub rms_norm_rows: Kernel,
    pub rotary_kv_store: Kernel,
    pub silu_and_mul: Kernel,
    pub logit_softcap: Kernel,
    pub paged_attention: Kernel,
    pub attention_combine: Kernel,
    pub gather_kv: Kernel,
    pub pack_queries: Kernel,
    pub masked_softmax: Kernel,
    pub sample_rows: Kernel,
    /// Compiler warnings met while compiling (logged by the caller).
    pub warnings: Vec<String>,
}

impl Kernels {
    /// Compiles (or reads from the disk cache) and loads every kernel file for `ctx`'s GPU.
    pub(super) fn load(ctx: &Arc<CudaContext>) -> Result<Self, DeviceError> {
        let (major, minor) = ctx.compute_capability().map_err(|e| {
            DeviceError::Unavailable(format!("cannot read the GPU's architecture: {e}"))
        })?;
        let (major, minor) = (major.max(0) as u32, minor.max(0) as u32);
        let dir = cache_dir();
        let mut warnings = Vec::new();
        let mut modules = Vec::new();
        for &(name, source) in SOURCES {
            let (ptx, log) = ptx_cached(name, source, major, minor, dir.as_deref())
                .map_err(|e| DeviceError::Unavailable(e.to_string()))?;
            if !log.is_empty() {
                warnings.push(format!("{name}: {log}"));
            }
            let module = ctx.load_module(Ptx::from_src(ptx)).map_err(|e| {
                DeviceError::Unavailable(format!("cannot load kernel `{name}`: {e}"))
            })?;
            modules.push((name, source, module));
        }
        let function = |file: &str, name: &'static str| -> Result<Kernel, DeviceError> {
            let (_, source, module) = modules
                .iter()
                .find(|(n, _, _)| *n == file)
                .ok_or_else(|| DeviceError::Unavailable(format!("no kernel file `{file}`")))?;
            let missing = || DeviceError::Unavailable(format!("kernel `{name}` is missing"));
            let parameters = parameter_count(source, name).ok_or_else(missing)?;
            let function = module.load_function(name).map_err(|e| {
                DeviceError::Unavailable(format!("kernel `{name}` is missing: {e}"))
            })?;
            Ok(Kernel {
                function,
                name,
                parameters,
            })
        };
        Ok(Self {
            embedding_gather: function("embedding", "embedding_gather")?,
            rms_norm_residual: function("norm", "rms_norm_residual")?,
            rms_norm_rows: function("norm", "rms_norm_rows")?,
            rotary_kv_store: function("rotary", "rotary_kv_store")?,
            silu_and_mul: function("activation", "silu_and_mul")?,
            logit_softcap: function("activation", "logit_softcap")?,
            paged_attention: function("attention", "paged_attention")?,
            attention_combine: function("attention", "attention_combine")?,
            gather_kv: function("dense_attention", "gather_kv")?,
            pack_queries: function("dense_attention", "pack_queries")?,
            masked_softmax: function("dense_attention", "masked_softmax")?,
            sample_rows: function("sampling", "sample_rows")?,
            warnings,
        })
    }
}

/// One kernel argument: the address of a value the kernel copies at launch.
pub(super) fn arg<T>(value: &T) -> *mut c_void {
    (value as *const T).cast_mut().cast()
}

/// Launches `kernel` on `stream`. `args` point at the kernel's parameters, in order.
pub(super) fn launch(
    kernel: &Kernel,
    grid: (u32, u32, u32),
    block: u32,
    stream: CUstream,
    args: &mut [*mut c_void],
) -> Result<(), DeviceError> {
    if args.len() != kernel.parameters {
        return Err(DeviceError::InvalidBatch(format!(
            "kernel `{}` takes {} parameters, given {}",
            kernel.name,
            kernel.parameters,
            args.len()
        )));
    }
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        return Ok(());
    }
    // SAFETY: every caller passes pointers to live values whose types match the kernel's
    // parameters in order (each call site mirrors the kernel's signature in `kernels/`, and
    // the count was checked above against the source), and
    // every device pointer among them addresses a buffer sized for the launch's grid.
    unsafe {
        driver::launch_kernel(
            kernel.function.cu_function(),
            grid,
            (block, 1, 1),
            0,
            stream,
            args,
        )
    }
    .map_err(|e| DeviceError::Unavailable(format!("kernel launch failed: {e}")))
}
