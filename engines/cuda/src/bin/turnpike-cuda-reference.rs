//! `turnpike-cuda-reference`: runs prompts through the engine's real scheduler, block manager
//! and a device (the CPU, or the GPU with `"device": "cuda"`), greedily, and prints every
//! logit; the numerics tests and `bench/gpu/` compare them with Hugging Face `transformers` on
//! the same weights, and the two devices with each other.
//!
//! Input (JSON on stdin):
//! `{"model": DIR, "device": "cpu", "block_size": 16, "max_batch_tokens": 512,
//! "num_blocks": 1024, "graphs": true, "activations": "exact", "runs": [{"prompts": [[ids]],
//! "generate": 32}]}` (`activations`: the CPU's, `exact` unless `int8` is asked for; an optional
//! `max_context` serves less than the model's context, as the engine's setting does). The runs
//! share one KV cache, so a later run can hit the prefix cache of
//! an earlier one. Output (JSON on stdout), per run and prompt: the logits at the prompt's last
//! position, the greedy tokens after it with each one's lead over the runner-up logit, and the
//! prompt tokens served from the prefix cache.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::ExitCode;

use serde::Deserialize;
use serde_json::json;
use turnpike_cuda::cpu::{Activations, CpuDevice};
use turnpike_cuda::device::{Batch, Device};
use turnpike_cuda::gpu::{Capacity, CudaDevice, GpuKvBudget, GpuSettings, kv_bytes_per_block};
use turnpike_cuda::model::ModelFolder;
use turnpike_cuda::scheduler::{NewSequence, Scheduler, SchedulerConfig};
use turnpike_cuda::step;

#[derive(Deserialize)]
struct Input {
    model: std::path::PathBuf,
    #[serde(default = "default_block")]
    block_size: u32,
    #[serde(default = "default_budget")]
    max_batch_tokens: usize,
    #[serde(default = "default_blocks")]
    num_blocks: u32,
    #[serde(default = "default_device")]
    device: String,
    #[serde(default = "default_graphs")]
    graphs: bool,
    #[serde(default = "default_activations")]
    activations: Activations,
    #[serde(default)]
    max_context: Option<usize>,
    runs: Vec<Run>,
}

#[derive(Deserialize)]
struct Run {
    prompts: Vec<Vec<u32>>,
    #[serde(default)]
    generate: usize,
}

fn default_block() -> u32 {
    16
}
fn default_budget() -> usize {
    512
}
fn default_blocks() -> u32 {
    1024
}
fn default_device() -> String {
    "cpu".into()
}
fn default_graphs() -> bool {
    true
}
fn default_activations() -> Activations {
    Activations::Exact
}

const MAX_RUNNING: usize = 64;

/// Opens the device the input names.
fn open(input: &Input, folder: &ModelFolder) -> Result<Box<dyn Device>, String> {
    match input.device.as_str() {
        "cpu" => {
            let threads = std::thread::available_parallelism().map_or(1, Into::into);
            let device = CpuDevice::load(
                folder,
                input.num_blocks,
                input.block_size,
                threads,
                input.activations,
            )
            .map_err(|e| e.to_string())?;
            Ok(Box::new(device))
        }
        "cuda" => {
            let block_size = input.block_size as usize;
            let per_block = kv_bytes_per_block(&folder.spec, block_size);
            let device = CudaDevice::load(
                folder,
                GpuSettings {
                    ordinal: 0,
                    capacity: Capacity {
                        tokens: input.max_batch_tokens,
                        seqs: MAX_RUNNING,
                        blocks_per_seq: folder.spec.max_context.div_ceil(block_size),
                    },
                    block_size,
                    kv_budget: GpuKvBudget::Bytes((per_block * input.num_blocks as usize) as u64),
                    graphs: input.graphs,
                },
            )
            .map_err(|e| e.to_string())?;
            Ok(Box::new(device))
        }
        other => Err(format!("unknown device `{other}`: cpu or cuda")),
    }
}

/// The logits rows of a step: returned by a device that does not sample, read back from one
/// that does.
fn step_logits(
    device: &mut dyn Device,
    returned: Vec<f32>,
    rows: usize,
) -> Result<Vec<f32>, String> {
    match device.sampler() {
        None => Ok(returned),
        Some(sampler) => sampler.read_logits(rows).map_err(|e| e.to_string()),
    }
}

#[derive(Default)]
struct Seq {
    logits: Vec<f32>,
    tokens: Vec<u32>,
    /// Per greedy token, its logit's lead over the runner-up (how near a tie the choice was).
    margins: Vec<f32>,
    cached: usize,
    done: bool,
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// How far the best logit leads the runner-up.
fn margin(row: &[f32], best: u32) -> f32 {
    let top = row.get(best as usize).copied().unwrap_or(0.0);
    let second = row
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best as usize)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    top - second
}

fn main() -> ExitCode {
    match run() {
        Ok(out) => {
            let _ = std::io::stdout().write_all(out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "turnpike-cuda-reference: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let input: Input = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let mut folder = ModelFolder::open(&input.model).map_err(|e| e.to_string())?;
    if let Some(context) = input.max_context {
        folder.spec.max_context = context.min(folder.spec.max_context);
    }
    let mut device = open(&input, &folder)?;
    let mut scheduler = Scheduler::new(SchedulerConfig {
        max_batch_tokens: input.max_batch_tokens,
        max_running: MAX_RUNNING,
        max_waiting: 1024,
        block_size: input.block_size,
        num_blocks: input.num_blocks,
    });
    let mut next_id = 0;
    let mut runs = Vec::new();
    for run in &input.runs {
        let mut seqs: HashMap<u64, Seq> = HashMap::new();
        let mut order = Vec::new();
        for prompt in &run.prompts {
            scheduler
                .add(NewSequence {
                    id: next_id,
                    tokens: prompt.clone(),
                    priority: 0,
                    tenant: String::new(),
                    weight: 1,
                })
                .map_err(|e| e.to_string())?;
            seqs.insert(next_id, Seq::default());
            order.push(next_id);
            next_id += 1;
        }
        while seqs.values().any(|s| !s.done) {
            let plan = scheduler.schedule();
            if plan.chunks.is_empty() {
                return Err("the scheduler planned nothing".into());
            }
            let copies = step::copies(&plan);
            let chunks = step::chunks(&plan);
            let logits = device
                .forward(&Batch {
                    copies: &copies,
                    chunks: &chunks,
                })
                .map_err(|e| e.to_string())?;
            let vocab = folder.spec.vocab_size;
            let wanted = plan.chunks.iter().filter(|c| c.sample).count();
            let logits = step_logits(device.as_mut(), logits, wanted)?;
            scheduler.complete(&plan);
            let mut rows = logits.chunks_exact(vocab);
            for chunk in &plan.chunks {
                let Some(seq) = seqs.get_mut(&chunk.seq) else {
                    continue;
                };
                seq.cached = seq.cached.max(chunk.cached_tokens);
                if !chunk.sample {
                    continue;
                }
                let row = rows.next().ok_or("missing logits")?;
                if seq.logits.is_empty() {
                    seq.logits = row.to_vec();
                }
                if seq.tokens.len() == run.generate {
                    seq.done = true;
                    scheduler.remove(chunk.seq);
                    continue;
                }
                let token = argmax(row);
                seq.tokens.push(token);
                seq.margins.push(margin(row, token));
                scheduler.append(chunk.seq, token);
            }
        }
        let results: Vec<_> = order
            .iter()
            .filter_map(|id| seqs.get(id))
            .map(|s| json!({"logits": s.logits, "tokens": s.tokens, "margins": s.margins, "cached_tokens": s.cached}))
            .collect();
        runs.push(json!({"results": results}));
    }
    Ok(json!({"runs": runs}).to_string())
}
