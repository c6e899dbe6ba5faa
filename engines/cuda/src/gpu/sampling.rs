//! Sampling on the GPU: the host sends each choice's settings, its penalty list, its uniform
//! draw and, under a grammar, the bitmask of the tokens it allows (the kernel bans the rest
//! before anything else, as the host's constraint does); `sample_rows` returns token ids and
//! the requested log-probabilities.

use cudarc::driver::sys::CUstream;

use super::launch::{Kernels, arg, launch};
use super::memory::DeviceBuffer;
use crate::device::{DeviceError, SampleRequest};
use crate::sampler::Sampled;

/// Most top log-probabilities a row returns (the kernel's `SAMPLE_MAX_TOP`).
const MAX_TOP: usize = 20;
/// Threads per sampled row.
const THREADS: u32 = 1024;

/// One row's settings, laid out as the kernel's `SampleRow`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct SampleRow {
    pub logits_row: i32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub uniform: f32,
    pub top_logprobs: i32,
    pub penalty_begin: i32,
    pub penalty_end: i32,
    pub banned_begin: i32,
    pub banned_end: i32,
    /// The row's first word in the grammar masks, or -1 for none.
    pub mask_offset: i32,
}

/// The host-side layout of a sampling launch.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct SampleInputs {
    pub rows: Vec<SampleRow>,
    pub penalty_tokens: Vec<i32>,
    pub penalty_counts: Vec<i32>,
    pub banned: Vec<i32>,
    pub masks: Vec<u32>,
}

impl SampleInputs {
    /// Lays out `requests`.
    pub(super) fn layout(requests: &[SampleRequest<'_>]) -> Self {
        let mut s = Self::default();
        for r in requests {
            let p = r.params;
            let penalty_begin = s.penalty_tokens.len() as i32;
            for &(token, count) in r.penalties {
                s.penalty_tokens.push(token as i32);
                s.penalty_counts.push(count as i32);
            }
            let banned_begin = s.banned.len() as i32;
            s.banned.extend(r.banned.iter().map(|&t| t as i32));
            let mask_offset = match r.allowed {
                Some(words) => {
                    let at = s.masks.len() as i32;
                    s.masks.extend_from_slice(words);
                    at
                }
                None => -1,
            };
            let repetition = if p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0 {
                p.repetition_penalty
            } else {
                1.0
            };
            s.rows.push(SampleRow {
                logits_row: r.logits_row as i32,
                temperature: if p.temperature.is_nan() {
                    0.0
                } else {
                    p.temperature
                },
                top_k: i32::try_from(p.top_k).unwrap_or(i32::MAX),
                top_p: p.top_p,
                min_p: p.min_p,
                repetition_penalty: repetition,
                presence_penalty: p.presence_penalty,
                frequency_penalty: p.frequency_penalty,
                uniform: r.uniform,
                top_logprobs: p.top_logprobs.map_or(-1, |k| k.min(MAX_TOP as u32) as i32),
                penalty_begin,
                penalty_end: s.penalty_tokens.len() as i32,
                banned_begin,
                banned_end: s.banned.len() as i32,
                mask_offset,
            });
        }
        s
    }
}

/// The GPU buffers of sampling.
#[derive(Debug)]
pub(super) struct Sampler {
    capacity: usize,
    vocab: usize,
    params: DeviceBuffer,
    scratch: DeviceBuffer,
    tokens: DeviceBuffer,
    logprobs: DeviceBuffer,
    top_ids: DeviceBuffer,
    top_logprobs: DeviceBuffer,
    /// Grown on demand: penalty lists and banned ids vary with history length.
    lists: DeviceBuffer,
}

impl Sampler {
    /// Buffers for up to `capacity` sampled rows over `vocab` logits.
    pub(super) fn new(capacity: usize, vocab: usize) -> Result<Self, DeviceError> {
        let n = capacity.max(1);
        Ok(Self {
            capacity: n,
            vocab,
            params: DeviceBuffer::alloc(n * size_of::<SampleRow>(), "sampling settings")?,
            scratch: DeviceBuffer::alloc(n * vocab * 4, "sampling scratch")?,
            tokens: DeviceBuffer::alloc(n * 4, "sampled tokens")?,
            logprobs: DeviceBuffer::alloc(n * 4, "sampled logprobs")?,
            top_ids: DeviceBuffer::alloc(n * MAX_TOP * 4, "top logprobs")?,
            top_logprobs: DeviceBuffer::alloc(n * MAX_TOP * 4, "top logprobs")?,
            lists: DeviceBuffer::alloc(64 * 1024, "penalty lists")?,
        })
    }

    /// Bytes held on the GPU.
    pub(super) fn bytes(&self) -> usize {
        self.params.bytes()
            + self.scratch.bytes()
            + self.tokens.bytes()
            + self.logprobs.bytes()
            + self.top_ids.bytes()
            + self.top_logprobs.bytes()
            + self.lists.bytes()
    }

    /// Samples `requests` from `logits` (rows of `vocab`) and waits for the result.
    pub(super) fn sample(
        &mut self,
        kernels: &Kernels,
        logits: &DeviceBuffer,
        requests: &[SampleRequest<'_>],
        stream: CUstream,
    ) -> Result<Vec<Sampled>, DeviceError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        if requests.len() > self.capacity {
            return Err(DeviceError::InvalidBatch(format!(
                "{} choices to sample exceed the device's {}",
                requests.len(),
                self.capacity
            )));
        }
        let words = self.vocab.div_ceil(32);
        if let Some(short) = requests
            .iter()
            .find_map(|r| r.allowed.filter(|m| m.len() < words))
        {
            return Err(DeviceError::InvalidBatch(format!(
                "a grammar mask of {} words is short of the vocabulary's {words}",
                short.len()
            )));
        }
        let inputs = SampleInputs::layout(requests);
        let list_bytes =
            (inputs.penalty_tokens.len() * 2 + inputs.banned.len() + inputs.masks.len()) * 4;
        if list_bytes > self.lists.bytes() {
            // Wait for earlier launches that read the old lists before freeing them.
            super::sync(stream)?;
            self.lists = DeviceBuffer::alloc(list_bytes.next_power_of_two(), "penalty lists")?;
        }
        let tokens_at = 0;
        let counts_at = inputs.penalty_tokens.len() * 4;
        let banned_at = counts_at * 2;
        let masks_at = banned_at + inputs.banned.len() * 4;
        self.params.write(&inputs.rows, stream)?;
        self.lists
            .write_at(tokens_at, &inputs.penalty_tokens, stream)?;
        self.lists
            .write_at(counts_at, &inputs.penalty_counts, stream)?;
        self.lists.write_at(banned_at, &inputs.banned, stream)?;
        self.lists.write_at(masks_at, &inputs.masks, stream)?;
        let vocab = self.vocab as i32;
        launch(
            &kernels.sample_rows,
            (requests.len() as u32, 1, 1),
            THREADS,
            stream,
            &mut [
                arg(&logits.ptr()),
                arg(&vocab),
                arg(&self.params.ptr()),
                arg(&self.lists.at(tokens_at)),
                arg(&self.lists.at(counts_at)),
                arg(&self.lists.at(banned_at)),
                arg(&self.scratch.ptr()),
                arg(&self.tokens.ptr()),
                arg(&self.logprobs.ptr()),
                arg(&self.top_ids.ptr()),
                arg(&self.top_logprobs.ptr()),
                arg(&self.lists.at(masks_at)),
            ],
        )?;
        let n = requests.len();
        let mut tokens = vec![0i32; n];
        let mut logprobs = vec![0f32; n];
        let mut top_ids = vec![0i32; n * MAX_TOP];
        let mut top_logprobs = vec![0f32; n * MAX_TOP];
        self.tokens.read(&mut tokens, stream)?;
        // Each copy into pageable memory costs a round trip: read only what a row asked for.
        if inputs.rows.iter().any(|row| row.top_logprobs >= 0) {
            self.logprobs.read(&mut logprobs, stream)?;
        }
        if inputs.rows.iter().any(|row| row.top_logprobs > 0) {
            self.top_ids.read(&mut top_ids, stream)?;
            self.top_logprobs.read(&mut top_logprobs, stream)?;
        }
        super::sync(stream)?;
        Ok(inputs
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let k = row.top_logprobs.max(0) as usize;
                Sampled {
                    token: tokens[i].max(0) as u32,
                    logprob: (row.top_logprobs >= 0).then_some(logprobs[i]),
                    top_logprobs: (0..k.min(self.vocab))
                        .map(|j| {
                            let at = i * MAX_TOP + j;
                            (top_ids[at].max(0) as u32, top_logprobs[at])
                        })
                        .collect(),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingParams;

    #[test]
    fn rows_match_the_kernel_struct_and_lists_are_ranges() {
        assert_eq!(size_of::<SampleRow>(), 15 * 4);
        let greedy = SamplingParams {
            temperature: 0.0,
            top_logprobs: Some(50),
            ..SamplingParams::default()
        };
        let warm = SamplingParams {
            repetition_penalty: f32::NAN,
            ..SamplingParams::default()
        };
        let requests = [
            SampleRequest {
                logits_row: 0,
                params: &greedy,
                uniform: 0.0,
                penalties: &[(3, 0), (7, 2)],
                banned: &[1],
                allowed: None,
            },
            SampleRequest {
                logits_row: 0,
                params: &warm,
                uniform: 0.25,
                penalties: &[(5, 1)],
                banned: &[],
                allowed: Some(&[0b1010, 0]),
            },
        ];
        let s = SampleInputs::layout(&requests);
        assert_eq!(s.penalty_tokens, vec![3, 7, 5]);
        assert_eq!(s.penalty_counts, vec![0, 2, 1]);
        assert_eq!((s.rows[0].penalty_begin, s.rows[0].penalty_end), (0, 2));
        assert_eq!((s.rows[1].penalty_begin, s.rows[1].penalty_end), (2, 3));
        assert_eq!((s.rows[1].banned_begin, s.rows[1].banned_end), (1, 1));
        assert_eq!(s.rows[0].top_logprobs, 20);
        assert_eq!(s.rows[1].top_logprobs, -1);
        assert_eq!(s.rows[1].repetition_penalty, 1.0);
        assert_eq!((s.rows[0].mask_offset, s.rows[1].mask_offset), (-1, 0));
        assert_eq!(s.masks, vec![0b1010, 0]);
    }
}
