//! Picking and opening a model's device: the CPU or a GPU, with the KV cache its budget
//! allows.

use turnpike_engine_api::EngineError;
use turnpike_engine_api::plugin::Host;

use super::{DeviceChoice, KvBudget, ModelSettings, available_memory};
use crate::device::Device;
use crate::model::ModelFolder;

/// Blocks the KV budget allows for this model.
fn kv_blocks(settings: &ModelSettings, folder: &ModelFolder) -> u32 {
    let max_context = folder.spec.max_context;
    // The CPU holds the cache in halves unless its inputs are exact (see `cpu::kv`).
    let value = match settings.cpu_activations {
        crate::cpu::Activations::Int8 => 2,
        crate::cpu::Activations::Exact => 4,
    };
    let per_token = (folder.spec.kv_values_per_token() * value) as u64;
    let per_block = per_token * u64::from(settings.block_size);
    let available = available_memory().unwrap_or(8 << 30);
    let bytes = match settings.kv_cache {
        KvBudget::Bytes(b) => b,
        KvBudget::Fraction(f) => (available as f64 * f) as u64,
        KvBudget::Auto => {
            let wanted = (settings.max_running * max_context) as u64 * per_token;
            wanted.min(available / 4)
        }
    };
    (bytes / per_block.max(1)).min(u64::from(u32::MAX)) as u32
}

/// Picks the device and logs why. `auto` takes the GPU when the probe finds one and the CPU
/// otherwise; a GPU that is found but cannot load the model is an error, not a quiet fallback.
pub(super) fn open_device(
    settings: &ModelSettings,
    folder: &ModelFolder,
    host: &Host,
) -> Result<Box<dyn Device>, EngineError> {
    // The folder's spec carries the context served (see `ModelRuntime::start`).
    let max_context = folder.spec.max_context;
    let fail = |e: String| EngineError::invalid_config(format!("model `{}`: {e}", settings.id));
    let gpu = match settings.device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Cuda => {
            crate::gpu::probe::probe().map_err(|e| fail(format!("device `cuda`: {e}")))?;
            true
        }
        DeviceChoice::Auto => match crate::gpu::probe::probe() {
            Ok(_) => true,
            Err(why) => {
                host.info(&format!("model `{}`: using the CPU ({why})", settings.id));
                false
            }
        },
    };
    let threads = settings
        .threads
        .or_else(|| std::thread::available_parallelism().ok().map(Into::into))
        .unwrap_or(1);
    if let Some(encoder) = &folder.encoder {
        // An encoder keeps no cache; it reports the blocks one context needs, so the
        // scheduler (which it never runs) is well formed.
        if settings.device == DeviceChoice::Cuda {
            return Err(fail(
                "encoder embedding models run on the CPU device (device = \"cpu\" or \"auto\")"
                    .into(),
            ));
        }
        let blocks = max_context.div_ceil(settings.block_size as usize) as u32;
        let device = crate::cpu::encoder::EncoderDevice::load(
            &folder.path,
            encoder,
            blocks,
            threads,
            settings.cpu_activations,
            settings.cpu_weights,
        )
        .map_err(|e| fail(e.to_string()))?;
        host.info(&format!(
            "model `{}`: an encoder, serving embeddings on the CPU",
            settings.id
        ));
        return Ok(Box::new(device));
    }
    if settings.cpu_weights != crate::cpu::FloatWeights::Shipped {
        return Err(fail(
            "`cpu_weights` applies to encoder embedding models only; this model generates".into(),
        ));
    }
    if gpu {
        return open_gpu(settings, folder, host).map_err(fail);
    }
    let blocks = kv_blocks(settings, folder);
    let device = crate::cpu::CpuDevice::load(
        folder,
        blocks,
        settings.block_size,
        threads,
        settings.cpu_activations,
    )
    .map_err(|e| fail(e.to_string()))?;
    Ok(Box::new(device))
}

/// Loads the model on the GPU; the KV cache takes the memory left after weights and buffers.
fn open_gpu(
    settings: &ModelSettings,
    folder: &ModelFolder,
    host: &Host,
) -> Result<Box<dyn Device>, String> {
    use crate::gpu::{Capacity, CudaDevice, GpuKvBudget, GpuSettings};
    let max_context = folder.spec.max_context;
    let kv_budget = match settings.kv_cache {
        KvBudget::Bytes(b) => GpuKvBudget::Bytes(b),
        KvBudget::Fraction(f) => GpuKvBudget::Fraction(f),
        KvBudget::Auto => GpuKvBudget::Fraction(0.9),
    };
    let device = CudaDevice::load(
        folder,
        GpuSettings {
            ordinal: settings.gpu,
            capacity: Capacity {
                tokens: settings.max_batch_tokens,
                // Drafting sequences ask for a logits row per draft.
                seqs: (settings.max_running * settings.max_n as usize).max(
                    settings
                        .speculative
                        .as_ref()
                        .map_or(0, |s| s.max_running * (1 + crate::speculative::MAX_DRAFT)),
                ),
                blocks_per_seq: max_context.div_ceil(settings.block_size as usize),
            },
            block_size: settings.block_size as usize,
            kv_budget,
            graphs: settings.cuda_graphs,
        },
    )
    .map_err(|e| e.to_string())?;
    for warning in device.kernel_warnings() {
        host.warn(&format!("kernel compiled with warnings: {warning}"));
    }
    host.info(&format!(
        "model `{}` on {} (GPU {})",
        settings.id,
        device.gpu_name(),
        settings.gpu
    ));
    Ok(Box::new(device))
}
