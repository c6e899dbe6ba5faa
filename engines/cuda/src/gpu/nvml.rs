//! GPU utilisation from NVML (`libnvidia-ml.so.1`, which ships with the NVIDIA driver), loaded at
//! run time like the CUDA libraries: where the library or the device is missing, there is simply
//! no figure. Read on each stats call (a few microseconds), never on the decode path.

use std::ffi::{c_int, c_uint, c_void};

/// `nvmlReturn_t`: 0 is success.
type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

type Init = unsafe extern "C" fn() -> NvmlReturn;
type HandleByIndex = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
type UtilizationRates = unsafe extern "C" fn(NvmlDevice, *mut Utilization) -> NvmlReturn;

/// An NVML handle on one GPU.
#[derive(Debug)]
pub(crate) struct Nvml {
    device: NvmlDevice,
    utilization: UtilizationRates,
    _library: libloading::Library,
}

// SAFETY: NVML is thread-safe (its documentation says every call may come from any thread); the
// device handle is an opaque token NVML owns for the process's life.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// NVML for GPU `index` (NVML's numbering, which follows the PCI bus order as
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` does), or why there is none.
    pub(crate) fn open(index: usize) -> Result<Self, String> {
        // SAFETY: loading runs the library's initialisers; libnvidia-ml is the driver's own
        // library, trusted like libcuda.
        let library = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("no NVML: {e}"))?;
        // SAFETY: the symbols have NVML's documented C signatures.
        let (init, by_index, utilization) = unsafe {
            let init: Init = *library.get(b"nvmlInit_v2\0").map_err(|e| e.to_string())?;
            let by_index: HandleByIndex = *library
                .get(b"nvmlDeviceGetHandleByIndex_v2\0")
                .map_err(|e| e.to_string())?;
            let utilization: UtilizationRates = *library
                .get(b"nvmlDeviceGetUtilizationRates\0")
                .map_err(|e| e.to_string())?;
            (init, by_index, utilization)
        };
        // SAFETY: `nvmlInit_v2` takes no arguments and may be called more than once.
        let status = unsafe { init() };
        if status != 0 {
            return Err(format!("nvmlInit failed ({status})"));
        }
        let mut device: NvmlDevice = std::ptr::null_mut();
        let index = c_uint::try_from(index).map_err(|e| e.to_string())?;
        // SAFETY: `device` is a valid place for the handle.
        let status = unsafe { by_index(index, &mut device) };
        if status != 0 || device.is_null() {
            return Err(format!("NVML has no GPU {index} ({status})"));
        }
        Ok(Self {
            device,
            utilization,
            _library: library,
        })
    }

    /// The share of the last sample period in which a kernel ran, 0 to 100.
    pub(crate) fn utilization_percent(&self) -> Option<f64> {
        let mut rates = Utilization::default();
        // SAFETY: the device handle came from NVML; `rates` is a valid place for the answer.
        let status = unsafe { (self.utilization)(self.device, &mut rates) };
        (status == 0).then_some(f64::from(rates.gpu))
    }
}

#[cfg(test)]
mod tests {
    use super::Nvml;

    #[test]
    fn a_gpu_answers_a_percentage_and_a_machine_without_one_says_why() {
        match Nvml::open(0) {
            Ok(nvml) => {
                let percent = nvml.utilization_percent().expect("a utilisation figure");
                assert!((0.0..=100.0).contains(&percent), "{percent}");
            }
            Err(why) => assert!(!why.is_empty()),
        }
        assert!(Nvml::open(usize::MAX).is_err());
    }
}
