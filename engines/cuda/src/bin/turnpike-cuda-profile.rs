//! `turnpike-cuda-profile MODEL_DIR [CONTEXT]`: where a decode step's time goes on the GPU,
//! at 1, 8, 64 and 256 sequences of `CONTEXT` (256) tokens each, as JSON on stdout (see
//! `turnpike_cuda::gpu::profile_decode`). `bench/gpu/speed.py` records it beside the speed run.

use std::io::Write;
use std::process::ExitCode;

use serde_json::json;
use turnpike_cuda::gpu::{Capacity, CudaDevice, GpuKvBudget, GpuSettings, kv_bytes_per_block};
use turnpike_cuda::model::ModelFolder;

const BATCHES: &[usize] = &[1, 8, 64, 256];
/// The context window graphs are sized for, as `bench/src/engine_gpu.rs` serves it.
const WINDOW: usize = 8192;
const BLOCK: usize = 16;

fn main() -> ExitCode {
    match run() {
        Ok(out) => {
            let _ = writeln!(std::io::stdout(), "{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "turnpike-cuda-profile: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, String> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .ok_or("usage: turnpike-cuda-profile MODEL_DIR [CONTEXT]")?;
    let context: usize = match args.next() {
        Some(c) => c.parse().map_err(|_| format!("bad context `{c}`"))?,
        None => 256,
    };
    let mut folder = ModelFolder::open(std::path::Path::new(&model)).map_err(|e| e.to_string())?;
    folder.spec.max_context = folder.spec.max_context.min(WINDOW);
    let max_batch = BATCHES.iter().copied().max().unwrap_or(1);
    let blocks = max_batch * context.div_ceil(BLOCK);
    let per_block = kv_bytes_per_block(&folder.spec, BLOCK);
    let mut device = CudaDevice::load(
        &folder,
        GpuSettings {
            ordinal: 0,
            capacity: Capacity {
                tokens: WINDOW,
                seqs: max_batch,
                blocks_per_seq: folder.spec.max_context.div_ceil(BLOCK),
            },
            block_size: BLOCK,
            kv_budget: GpuKvBudget::Bytes((per_block * blocks) as u64),
            graphs: true,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut profiles = Vec::new();
    for &batch in BATCHES {
        let lines = device
            .profile_decode(batch, context)
            .map_err(|e| e.to_string())?;
        let lines: Vec<_> = lines
            .iter()
            .map(|l| json!({"part": l.part, "micros": l.micros, "weight_bytes": l.weight_bytes}))
            .collect();
        profiles.push(json!({"batch": batch, "context": context, "lines": lines}));
    }
    Ok(json!({"gpu": device.gpu_name(), "profiles": profiles}).to_string())
}
