//! GPU memory the device owns: plain allocations that live as long as the device and never
//! move, so a captured CUDA graph can keep their addresses.
//!
//! The device uses one stream and raw device pointers rather than `cudarc`'s tracked slices:
//! ordering on one stream is all the engine needs, and kernels captured into graphs take
//! addresses by value.

use cudarc::driver::result as driver;
use cudarc::driver::sys::{CUdeviceptr, CUstream};

use crate::device::DeviceError;

/// Turns a driver error into the device's.
pub(super) fn gpu_error(what: &str) -> impl FnOnce(driver::DriverError) -> DeviceError + '_ {
    move |e| DeviceError::Unavailable(format!("{what}: {e}"))
}

/// One allocation of GPU memory.
#[derive(Debug)]
pub(super) struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least one) of uninitialised GPU memory. The device's context must
    /// be current on this thread.
    pub(super) fn alloc(bytes: usize, what: &str) -> Result<Self, DeviceError> {
        // SAFETY: a plain allocation; the pointer is freed once, in `drop`.
        let ptr = unsafe { driver::malloc_sync(bytes.max(1)) }.map_err(|e| {
            DeviceError::Unavailable(format!(
                "cannot allocate {bytes} bytes of GPU memory for {what}: {e}"
            ))
        })?;
        Ok(Self { ptr, bytes })
    }

    /// Allocates and fills from `data`.
    pub(super) fn from_host<T: Copy>(data: &[T], what: &str) -> Result<Self, DeviceError> {
        let buffer = Self::alloc(std::mem::size_of_val(data), what)?;
        // SAFETY: the buffer holds exactly `data`'s bytes; the copy is synchronous.
        unsafe { driver::memcpy_htod_sync(buffer.ptr, data) }.map_err(gpu_error(what))?;
        Ok(buffer)
    }

    /// The device address.
    pub(super) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The address `offset` bytes in.
    pub(super) fn at(&self, offset: usize) -> CUdeviceptr {
        self.ptr + offset as u64
    }

    /// Its size in bytes.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies `data` to the start of the buffer on `stream` (ordered after earlier work).
    pub(super) fn write<T: Copy>(&self, data: &[T], stream: CUstream) -> Result<(), DeviceError> {
        self.write_at(0, data, stream)
    }

    /// Copies `data` to `offset` bytes into the buffer on `stream`.
    pub(super) fn write_at<T: Copy>(
        &self,
        offset: usize,
        data: &[T],
        stream: CUstream,
    ) -> Result<(), DeviceError> {
        let bytes = std::mem::size_of_val(data);
        if offset + bytes > self.bytes {
            return Err(DeviceError::InvalidBatch(format!(
                "{bytes} bytes at {offset} do not fit a buffer of {}",
                self.bytes
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the range was checked above; the host data is pageable, so the driver copies
        // it before returning and `data` may be dropped afterwards.
        unsafe { driver::memcpy_htod_async(self.at(offset), data, stream) }
            .map_err(gpu_error("copy to the GPU"))
    }

    /// Copies the start of the buffer into `out` on `stream`; the caller synchronises.
    pub(super) fn read<T: Copy>(&self, out: &mut [T], stream: CUstream) -> Result<(), DeviceError> {
        if std::mem::size_of_val(out) > self.bytes {
            return Err(DeviceError::InvalidBatch("read past a GPU buffer".into()));
        }
        // SAFETY: the range was checked above; the caller synchronises the stream before using
        // `out` (pageable memory makes the copy synchronous anyway).
        unsafe { driver::memcpy_dtoh_async(out, self.ptr, stream) }
            .map_err(gpu_error("copy from the GPU"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_sync` and is freed only here. The owner keeps the
        // context alive and current while its buffers drop.
        let _ = unsafe { driver::free_sync(self.ptr) };
    }
}

/// Rounds f32 to bf16 bits, nearest even (NaN stays NaN), as PyTorch does.
pub(super) fn to_bf16(values: &[f32]) -> Vec<u16> {
    values
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}
