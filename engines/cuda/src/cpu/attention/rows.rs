//! Decoding rows' attention: one task per key/value head and block of consecutive rows of
//! one sequence (a decoding step's token, and the drafts it checks after it). Each key and
//! value is read from the cache and widened once for the whole block, which a step checking
//! drafts reads far more of than its one-row arithmetic needs: with one task per row, every
//! draft read the sequence's keys and values again, and that read, not the arithmetic, was
//! most of a drafted step's attention.
//!
//! Every row's sums are taken in the same order as for a row alone (each score key by key,
//! over the key's sixteen-value chunks in turn; each output chunk over the visible positions
//! in turn), so a draft's row is exactly what a decoding step of that token alone computes.

use std::ops::Range;

use super::super::kv::{Cache, KvValue};
use super::super::simd::{Kernel, Simd};
use super::{Heads, axpy, dot, lanes, lanes_mut, softmax};

/// Query heads sharing one key/value head that [`Rows`] scores together.
pub(super) const MAX_SHARED: usize = 8;

/// Rows a task takes at most: their sums, one register per row and query head of the group,
/// stay in registers.
pub(super) const ROWS_PER_TASK: usize = 4;

/// Values per head that [`Rows`] holds a key of in registers; larger heads go
/// [`Rows::one_head_at_a_time`].
const MAX_DIM: usize = 256;

/// One decoding row of a [`Rows`] task.
pub(super) struct Row<'a> {
    /// Its query heads of the task's key/value head.
    pub q: &'a [f32],
    /// The positions it sees.
    pub span: Range<usize>,
    /// Its output for those heads.
    pub out: &'a mut [f32],
}

/// Consecutive decoding rows of one sequence against one key/value head, as a [`Kernel`].
pub(super) struct Rows<'a, V> {
    pub cache: Cache<'a, V>,
    pub heads: Heads,
    /// At most [`ROWS_PER_TASK`] rows.
    pub rows: Vec<Row<'a>>,
    /// Cache offsets of the sequence's positions, up to the last row's.
    pub offsets: &'a [usize],
    pub group: usize,
    pub scores: &'a mut Vec<f32>,
}

impl<V: KvValue> Kernel for Rows<'_, V> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(mut self, s: S) {
        let Heads { query, kv, dim, .. } = self.heads;
        let (shared, hd, g) = (query / kv, dim, self.group);
        let first = self.rows.iter().map(|r| r.span.start).min().unwrap_or(0);
        let end = self.rows.iter().map(|r| r.span.end).max().unwrap_or(0);
        let n = end - first;
        self.scores.clear();
        self.scores.resize(self.rows.len() * shared * n, 0.0);
        if shared > MAX_SHARED || hd % 16 != 0 || hd > MAX_DIM || self.rows.len() > ROWS_PER_TASK {
            self.one_head_at_a_time(s);
            return;
        }
        let chunks = hd / 16;
        // Scores, key by key: the key widened once, then every row that sees it.
        for j in first..end {
            let o = self.offsets[j] + g * hd;
            let mut key = [s.zero(); MAX_DIM / 16];
            for (c, k) in key.iter_mut().enumerate().take(chunks) {
                *k = V::load16(s, lanes(self.cache.keys, o + 16 * c));
            }
            for (r, row) in self.rows.iter().enumerate() {
                if !row.span.contains(&j) {
                    continue;
                }
                let mut acc = [s.zero(); MAX_SHARED];
                for (c, k) in key.iter().enumerate().take(chunks) {
                    for (h, acc) in acc.iter_mut().enumerate().take(shared) {
                        *acc = s.mul_add(s.load(lanes(row.q, h * hd + 16 * c)), *k, *acc);
                    }
                }
                for (h, acc) in acc.iter().enumerate().take(shared) {
                    self.scores[(r * shared + h) * n + j - first] = self.heads.score(s.sum(*acc));
                }
            }
        }
        for (r, row) in self.rows.iter().enumerate() {
            for h in 0..shared {
                let at = (r * shared + h) * n;
                softmax(&mut self.scores[at + row.span.start - first..at + row.span.end - first]);
            }
        }
        // Sixteen values of every row and head at a time, summed in registers over the
        // positions each row sees.
        for c in 0..chunks {
            let mut acc = [[s.zero(); MAX_SHARED]; ROWS_PER_TASK];
            for j in first..end {
                let v = V::load16(
                    s,
                    lanes(self.cache.values, self.offsets[j] + g * hd + 16 * c),
                );
                for (r, (row, acc)) in self.rows.iter().zip(acc.iter_mut()).enumerate() {
                    if !row.span.contains(&j) {
                        continue;
                    }
                    for (h, acc) in acc.iter_mut().enumerate().take(shared) {
                        let p = self.scores[(r * shared + h) * n + j - first];
                        *acc = s.mul_add(s.splat(p), v, *acc);
                    }
                }
            }
            for (row, acc) in self.rows.iter_mut().zip(&acc) {
                for (h, acc) in acc.iter().enumerate().take(shared) {
                    s.store(*acc, lanes_mut(row.out, h * hd + 16 * c));
                }
            }
        }
    }
}

impl<V: KvValue> Rows<'_, V> {
    /// [`Rows`] for other shapes: one row, head and key at a time.
    #[inline(always)]
    fn one_head_at_a_time<S: Simd>(self, s: S) {
        let Heads { query, kv, dim, .. } = self.heads;
        let (shared, hd, g) = (query / kv, dim, self.group);
        for row in self.rows {
            let n = row.span.len();
            self.scores.clear();
            self.scores.resize(shared * n, 0.0);
            for (j, &o) in self.offsets[row.span.clone()].iter().enumerate() {
                let key = &self.cache.keys[o + g * hd..o + (g + 1) * hd];
                for h in 0..shared {
                    let q = &row.q[h * hd..(h + 1) * hd];
                    self.scores[h * n + j] = self.heads.score(dot(s, q, key));
                }
            }
            for h in 0..shared {
                softmax(&mut self.scores[h * n..(h + 1) * n]);
            }
            row.out.fill(0.0);
            for (j, &o) in self.offsets[row.span.clone()].iter().enumerate() {
                let value = &self.cache.values[o + g * hd..o + (g + 1) * hd];
                for h in 0..shared {
                    let p = self.scores[h * n + j];
                    axpy(s, p, value, &mut row.out[h * hd..(h + 1) * hd]);
                }
            }
        }
    }
}
