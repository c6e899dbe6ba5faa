//! Finding a usable GPU without ever calling into a library that is not there.
//!
//! `cudarc` loads the driver, NVRTC and cuBLAS at run time and panics on the first call into
//! a library it cannot find, so each is probed with `dlopen` first. A machine without them
//! gets an error that says which library is missing (or the CPU under `device = "auto"`).

use cudarc::driver::result as driver;

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPresent {
    /// CUDA devices the driver reports.
    pub devices: usize,
}

/// Checks the three libraries and the driver; says what is missing.
pub fn probe() -> Result<GpuPresent, String> {
    // SAFETY: each probe only tries to `dlopen` the library's candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver (libcuda.so) was not found".into());
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(
            "NVRTC (libnvrtc.so or libnvrtc.so.12) was not found; install the CUDA toolkit \
             or the `nvidia-cuda-nvrtc-cu12` package and put its lib folder on LD_LIBRARY_PATH"
                .into(),
        );
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(
            "cuBLAS (libcublas.so or libcublas.so.12) was not found; install the CUDA \
             toolkit or the `nvidia-cublas-cu12` package and put its lib folder on \
             LD_LIBRARY_PATH"
                .into(),
        );
    }
    driver::init().map_err(|e| format!("the CUDA driver did not start: {e}"))?;
    let devices = driver::device::get_count()
        .map_err(|e| format!("the CUDA driver cannot count devices: {e}"))?;
    if devices < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    Ok(GpuPresent {
        devices: devices as usize,
    })
}

/// Whether NVRTC alone can be loaded (enough to compile kernels, as CI does without a GPU).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to `dlopen` the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}
