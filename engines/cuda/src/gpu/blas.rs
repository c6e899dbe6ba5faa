//! Matrix products through cuBLAS: bf16 operands, f32 accumulation and f32 results (the
//! kernels after each product round to bf16 where the model does).
//!
//! Every weight product is `out[t, n] = x[t, k] · w[n, k]ᵀ` ([`Blas::linear`]) with row-major
//! `x` and the weight as stored by Hugging Face (`[out, in]`). In cuBLAS's column-major terms
//! that is `outᵀ = w · xᵀ`: `w` transposed, `x` as is. Dense attention's scores and weighted
//! sums are strided batched products over heads ([`Blas::strided`], plain column-major
//! operands). The handle gets a fixed workspace so products can be captured into CUDA graphs.

use std::ffi::c_void;

use cudarc::cublas::{result as cublas, sys};
use cudarc::driver::sys::{CUdeviceptr, CUstream};

use super::memory::DeviceBuffer;
use crate::device::DeviceError;

/// The workspace cuBLAS may use (its documented recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to the device's stream.
#[derive(Debug)]
pub(super) struct Blas {
    handle: sys::cublasHandle_t,
    _workspace: DeviceBuffer,
}

// SAFETY: the handle is used only by the thread that owns the device at a time (the device is
// moved to the engine thread, never shared).
unsafe impl Send for Blas {}

impl Blas {
    /// A handle on `stream` with its own workspace.
    pub(super) fn new(stream: CUstream) -> Result<Self, DeviceError> {
        let fail = |e: cublas::CublasError| DeviceError::Unavailable(format!("cuBLAS: {e:?}"));
        let handle = cublas::create_handle().map_err(fail)?;
        let workspace = DeviceBuffer::alloc(WORKSPACE_BYTES, "the cuBLAS workspace")?;
        // SAFETY: a live handle, the device's stream and a workspace that outlives the handle.
        unsafe {
            cublas::set_stream(handle, stream as _).map_err(fail)?;
            sys::cublasSetWorkspace_v2(handle, workspace.ptr() as *mut c_void, WORKSPACE_BYTES)
                .result()
                .map_err(fail)?;
        }
        Ok(Self {
            handle,
            _workspace: workspace,
        })
    }

    /// `out[rows, n] = x[rows, k] · w[n, k]ᵀ`, with `x` and `w` in bf16 and `out` in f32.
    pub(super) fn linear(
        &self,
        x: CUdeviceptr,
        w: CUdeviceptr,
        out: CUdeviceptr,
        rows: usize,
        n: usize,
        k: usize,
    ) -> Result<(), DeviceError> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let dim = |v: usize| {
            i32::try_from(v)
                .map_err(|_| DeviceError::InvalidBatch(format!("matrix size {v} is too large")))
        };
        // SAFETY: the pointers are device allocations of at least rows×k, n×k and rows×n
        // elements (the callers size them from the model), and alpha/beta live through the call.
        unsafe {
            cublas::gemm_ex(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                dim(n)?,
                dim(rows)?,
                dim(k)?,
                (&alpha as *const f32).cast(),
                w as *const c_void,
                sys::cudaDataType::CUDA_R_16BF,
                dim(k)?,
                x as *const c_void,
                sys::cudaDataType::CUDA_R_16BF,
                dim(k)?,
                (&beta as *const f32).cast(),
                out as *mut c_void,
                sys::cudaDataType::CUDA_R_32F,
                dim(n)?,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| DeviceError::Unavailable(format!("cuBLAS product failed: {e:?}")))
    }
}

/// One operand of a strided batched product: its address, leading dimension (column-major,
/// in elements) and the elements between consecutive batch entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Operand {
    pub ptr: CUdeviceptr,
    pub ld: usize,
    pub stride: usize,
}

impl Operand {
    pub(super) fn new(ptr: CUdeviceptr, ld: usize, stride: usize) -> Self {
        Self { ptr, ld, stride }
    }
}

/// `c[i] = alpha · op(a[i]) · b[i]` for `batch` entries, column-major: op(a) is `m × k` (`a`
/// stored `k × m` when `transpose_a`), `b` is `k × n`, `c` is `m × n`. `a` and `b` are bf16;
/// `c` is f32, or bf16 when `c_bf16`; accumulation is f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Strided {
    pub transpose_a: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub c_bf16: bool,
    pub batch: usize,
}

impl Blas {
    /// Runs one strided batched product (attention's scores and weighted sums).
    pub(super) fn strided(&self, p: &Strided) -> Result<(), DeviceError> {
        let beta = 0.0f32;
        let dim = |v: usize| {
            i32::try_from(v)
                .map_err(|_| DeviceError::InvalidBatch(format!("matrix size {v} is too large")))
        };
        let stride = |v: usize| {
            i64::try_from(v)
                .map_err(|_| DeviceError::InvalidBatch(format!("matrix stride {v} is too large")))
        };
        let op_a = if p.transpose_a {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        };
        let c_type = if p.c_bf16 {
            sys::cudaDataType::CUDA_R_16BF
        } else {
            sys::cudaDataType::CUDA_R_32F
        };
        // SAFETY: the callers (dense attention) address workspace buffers sized for every
        // batch entry at these strides and leading dimensions, and alpha/beta live through
        // the call.
        unsafe {
            cublas::gemm_strided_batched_ex(
                self.handle,
                op_a,
                sys::cublasOperation_t::CUBLAS_OP_N,
                dim(p.m)?,
                dim(p.n)?,
                dim(p.k)?,
                (&p.alpha as *const f32).cast(),
                p.a.ptr as *const c_void,
                sys::cudaDataType::CUDA_R_16BF,
                dim(p.a.ld)?,
                stride(p.a.stride)?,
                p.b.ptr as *const c_void,
                sys::cudaDataType::CUDA_R_16BF,
                dim(p.b.ld)?,
                stride(p.b.stride)?,
                (&beta as *const f32).cast(),
                p.c.ptr as *mut c_void,
                c_type,
                dim(p.c.ld)?,
                stride(p.c.stride)?,
                dim(p.batch)?,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| DeviceError::Unavailable(format!("cuBLAS batched product failed: {e:?}")))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `new` and is destroyed once.
        let _ = unsafe { cublas::destroy_handle(self.handle) };
    }
}
