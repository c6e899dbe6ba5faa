//! Where a decode step's time goes on the GPU, for `bench/gpu/`: each stage of the layers
//! timed on its own over every layer (captured into a graph and replayed, timed by CUDA
//! events), the output head, the whole step as the engine replays it, and the host's own
//! parts (uploading inputs, sampling and reading the tokens back). The stages' sum against
//! the whole step shows the gaps between launches; each product's bytes over its time show
//! how close it runs to the memory bandwidth.
//!
//! The KV cache holds whatever the GPU's memory held: timings do not depend on the values.

use std::time::Instant;

use cudarc::driver::result as driver;
use cudarc::driver::sys::{self, CUevent, CUstream};

use super::dense_attention::AttentionPlan;
use super::forward::Stage;
use super::graphs::{bucket_for, capture};
use super::inputs::StepInputs;
use super::workspace::graph_splits;
use super::{CudaDevice, sync};
use crate::device::{Chunk, DeviceError, SampleRequest};
use crate::sampler::SamplingParams;

/// Replays timed per measurement (after as many untimed).
const REPLAYS: usize = 20;

/// One timed part of a decode step.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileLine {
    /// What was timed (`head`, `host: upload inputs`, a layer's product), as the report names it.
    pub part: String,
    /// Microseconds per decode step.
    pub micros: f64,
    /// Weight bytes the part reads per step (products only; 0 otherwise).
    pub weight_bytes: u64,
}

/// A CUDA event, destroyed when dropped.
struct Event(CUevent);

impl Event {
    fn new() -> Result<Self, DeviceError> {
        driver::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Self)
            .map_err(|e| DeviceError::Unavailable(format!("cannot create an event: {e}")))
    }

    fn record(&self, stream: CUstream) -> Result<(), DeviceError> {
        // SAFETY: a live event on the device's stream.
        unsafe { driver::event::record(self.0, stream) }
            .map_err(|e| DeviceError::Unavailable(format!("cannot record an event: {e}")))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `Event::new`, destroyed once, here.
        let _ = unsafe { driver::event::destroy(self.0) };
    }
}

/// Captures `launches` into a graph and returns the microseconds one replay takes.
fn time_graph(
    stream: CUstream,
    mut launches: impl FnMut() -> Result<(), DeviceError>,
) -> Result<f64, DeviceError> {
    let graph = capture(stream, &mut launches)?;
    let (start, end) = (Event::new()?, Event::new()?);
    let replay = || {
        // SAFETY: an instantiated graph on the stream it was captured from.
        unsafe { driver::graph::launch(graph.exec, stream) }
            .map_err(|e| DeviceError::Unavailable(format!("graph launch failed: {e}")))
    };
    for _ in 0..REPLAYS {
        replay()?;
    }
    start.record(stream)?;
    for _ in 0..REPLAYS {
        replay()?;
    }
    end.record(stream)?;
    sync(stream)?;
    // SAFETY: both events were recorded on this stream and have completed.
    let ms = unsafe { driver::event::elapsed(start.0, end.0) }
        .map_err(|e| DeviceError::Unavailable(format!("cannot read an event: {e}")))?;
    Ok(f64::from(ms) * 1000.0 / REPLAYS as f64)
}

/// Microseconds `work` takes on the host, averaged over the replays (it waits for the GPU).
fn time_host(mut work: impl FnMut() -> Result<(), DeviceError>) -> Result<f64, DeviceError> {
    for _ in 0..REPLAYS {
        work()?;
    }
    let started = Instant::now();
    for _ in 0..REPLAYS {
        work()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / REPLAYS as f64)
}

impl CudaDevice {
    /// Times the parts of a decode step of `batch` sequences whose contexts hold `context`
    /// tokens each, as the engine runs it (padded to its graph bucket).
    pub fn profile_decode(
        &mut self,
        batch: usize,
        context: usize,
    ) -> Result<Vec<ProfileLine>, DeviceError> {
        self.bind()?;
        let capacity = self.workspace.capacity;
        let block = self.kv.block_size;
        let per_seq = context.div_ceil(block);
        let bucket = bucket_for(batch)
            .filter(|&b| b <= capacity.seqs)
            .ok_or_else(|| DeviceError::InvalidBatch(format!("no graph holds {batch} rows")))?;
        if context == 0 || per_seq > capacity.blocks_per_seq || per_seq * batch > self.kv.num_blocks
        {
            return Err(DeviceError::InvalidBatch(format!(
                "{batch} contexts of {context} tokens do not fit the cache"
            )));
        }
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
            .collect();
        let token = [1u32];
        let chunks: Vec<Chunk<'_>> = tables
            .iter()
            .map(|table| Chunk {
                tokens: &token,
                start: context - 1,
                block_table: table,
                logits: true,
                generated: true,
                drafts: 0,
            })
            .collect();
        let mut inputs =
            StepInputs::layout(&chunks, block, self.kv.num_blocks, capacity.blocks_per_seq)?;
        inputs.pad_to(bucket);
        let stream = self.stream.cu_stream();
        let window = capacity.blocks_per_seq * block;
        let plan = AttentionPlan::paged(bucket, graph_splits(bucket, self.spec.num_heads, window));
        let (ws, kv) = (&self.workspace, &self.kv);
        let model = self.model();
        let mut lines = Vec::new();
        let upload = time_host(|| {
            inputs.upload(ws, stream)?;
            sync(stream)
        })?;
        lines.push(line("host: upload inputs", upload, 0));
        let layers = self.weights.layers.len();
        let first = &self.weights.layers[0];
        let weight_bytes = |stage: Stage| -> u64 {
            let bytes = match stage {
                Stage::Qkv => first.qkv.bytes(),
                Stage::OutProj => first.o.bytes(),
                Stage::GateUp => first.gate_up.bytes(),
                Stage::Down => first.down.bytes(),
                _ => 0,
            };
            (bytes * layers) as u64
        };
        for stage in Stage::ALL {
            let micros = time_graph(stream, || {
                (0..layers).try_for_each(|l| model.stage(stage, ws, kv, l, bucket, &plan))
            })?;
            lines.push(line(stage.name(), micros, weight_bytes(stage)));
        }
        let head = time_graph(stream, || model.head(ws, bucket))?;
        let output = self.weights.output().bytes() as u64;
        lines.push(line("head", head, output));
        let step = time_graph(stream, || {
            model.layers(ws, kv, bucket, &plan)?;
            model.head(ws, bucket)
        })?;
        let total = lines[1..].iter().map(|l| l.micros).sum::<f64>();
        lines.push(line("gaps: step minus its parts", step - total, 0));
        lines.push(line("step (one graph)", step, 0));
        for (name, temperature) in [("host: sample greedy", 0.0), ("host: sample t=1", 1.0)] {
            let params = SamplingParams {
                temperature,
                ..SamplingParams::default()
            };
            let requests: Vec<SampleRequest<'_>> = (0..batch)
                .map(|row| SampleRequest {
                    logits_row: row,
                    params: &params,
                    uniform: 0.5,
                    penalties: &[],
                    banned: &[],
                    allowed: None,
                })
                .collect();
            let (sampler, kernels, logits) =
                (&mut self.sampler, &self.kernels, &self.workspace.logits);
            let micros = time_host(|| {
                sampler
                    .sample(kernels, logits, &requests, stream)
                    .map(|_| ())
            })?;
            lines.push(line(name, micros, 0));
        }
        Ok(lines)
    }
}

fn line(part: &str, micros: f64, weight_bytes: u64) -> ProfileLine {
    ProfileLine {
        part: part.into(),
        micros,
        weight_bytes,
    }
}
