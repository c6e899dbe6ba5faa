//! CUDA graphs for decode steps, one per batch-size bucket.
//!
//! A decode step (every sequence computes one token and samples) is padded to the next
//! bucket and replayed from a graph, which removes the launch cost of several hundred kernels
//! and products per step. A bucket runs eagerly the first time it is seen (cuBLAS settles its
//! choices outside a capture), is captured the second time, and is replayed from then on.
//! Everything a graph reads lives at fixed addresses in the workspace, and attention uses a
//! fixed split count per bucket that covers the whole context window.

use std::collections::HashMap;

use cudarc::driver::result as driver;
use cudarc::driver::sys::{self, CUgraph, CUgraphExec, CUstream};

use crate::device::DeviceError;

/// The batch sizes decode graphs are captured for.
pub(super) const BUCKETS: &[usize] = &[1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256];

/// The smallest bucket that holds `n` sequences.
pub(super) fn bucket_for(n: usize) -> Option<usize> {
    BUCKETS.iter().copied().find(|&b| b >= n)
}

/// An instantiated graph.
#[derive(Debug)]
pub(super) struct Graph {
    graph: CUgraph,
    pub(super) exec: CUgraphExec,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles came from a successful capture and instantiation, and are
        // destroyed once, here.
        unsafe {
            let _ = driver::graph::exec_destroy(self.exec);
            let _ = driver::graph::destroy(self.graph);
        }
    }
}

#[derive(Debug)]
enum Bucket {
    /// Ran once without a graph.
    Seen,
    /// Captured.
    Ready(Graph),
    /// Capture failed; runs eagerly.
    Failed,
}

/// Counters of graph use, for `stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct GraphCounters {
    pub replays: u64,
    pub captures: u64,
    pub eager_steps: u64,
    pub failures: u64,
}

/// The captured graphs, by bucket.
#[derive(Debug, Default)]
pub(super) struct Graphs {
    buckets: HashMap<usize, Bucket>,
    pub counters: GraphCounters,
}

// SAFETY: graph handles are plain driver handles used only by the thread that owns the device.
unsafe impl Send for Graphs {}

impl Graphs {
    /// Runs a decode step of `bucket` sequences whose inputs are uploaded: replays its graph,
    /// or captures `launches` into one, or runs `launches` directly.
    pub(super) fn run(
        &mut self,
        bucket: usize,
        stream: CUstream,
        mut launches: impl FnMut() -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        match self.buckets.get(&bucket) {
            Some(Bucket::Ready(graph)) => {
                self.counters.replays += 1;
                // SAFETY: an instantiated graph on the stream it was captured from.
                return unsafe { driver::graph::launch(graph.exec, stream) }
                    .map_err(|e| DeviceError::Unavailable(format!("graph launch failed: {e}")));
            }
            Some(Bucket::Seen) => match capture(stream, &mut launches) {
                Ok(graph) => {
                    self.counters.captures += 1;
                    self.counters.replays += 1;
                    // SAFETY: as above.
                    let launched = unsafe { driver::graph::launch(graph.exec, stream) };
                    self.buckets.insert(bucket, Bucket::Ready(graph));
                    return launched.map_err(|e| {
                        DeviceError::Unavailable(format!("graph launch failed: {e}"))
                    });
                }
                Err(_) => {
                    self.counters.failures += 1;
                    self.buckets.insert(bucket, Bucket::Failed);
                }
            },
            Some(Bucket::Failed) => {}
            None => {
                self.buckets.insert(bucket, Bucket::Seen);
            }
        }
        self.counters.eager_steps += 1;
        launches()
    }
}

/// Captures `launches` on `stream` into an instantiated graph. A failure ends the capture,
/// so the stream is usable again.
pub(super) fn capture(
    stream: CUstream,
    launches: &mut impl FnMut() -> Result<(), DeviceError>,
) -> Result<Graph, DeviceError> {
    let fail =
        |what: &str, e: driver::DriverError| DeviceError::Unavailable(format!("{what}: {e}"));
    // SAFETY: the stream is the device's own non-default stream, idle of other captures.
    unsafe {
        driver::stream::begin_capture(
            stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
    .map_err(|e| fail("cannot start a graph capture", e))?;
    let launched = launches();
    // SAFETY: ends the capture begun above whatever happened in between.
    let graph = unsafe { driver::stream::end_capture(stream) };
    let graph = match (launched, graph) {
        (Ok(()), Ok(graph)) if !graph.is_null() => graph,
        (launched, graph) => {
            if let Ok(graph) = graph
                && !graph.is_null()
            {
                // SAFETY: a graph the capture produced and nothing else holds.
                let _ = unsafe { driver::graph::destroy(graph) };
            }
            launched?;
            return Err(DeviceError::Unavailable(
                "the graph capture produced nothing".into(),
            ));
        }
    };
    // SAFETY: a complete captured graph.
    match unsafe { driver::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
        Ok(exec) => Ok(Graph { graph, exec }),
        Err(e) => {
            // SAFETY: as above.
            let _ = unsafe { driver::graph::destroy(graph) };
            Err(fail("cannot instantiate a graph", e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_every_batch_up_to_the_largest() {
        for n in 1..=256 {
            let b = bucket_for(n).unwrap_or(0);
            assert!(b >= n && BUCKETS.contains(&b), "{n} -> {b}");
        }
        assert_eq!(bucket_for(257), None);
        assert_eq!(bucket_for(3), Some(4));
    }
}
