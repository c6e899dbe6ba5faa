//! Causal attention on the paged cache, one key/value head of a tile of a sequence's consecutive
//! rows per task (so a prompt of one tile, a prefix hit's last position, uses every thread).
//! Prefill tiles transpose each block of sixteen keys once and score every query of the tile
//! against it sixteen keys at a time (no horizontal sums), then take one softmax per query and
//! one pass over the values with the sums in registers. Decoding rows (a step's token and the
//! drafts it checks) score key by key instead ([`rows`]), every query head that shares a
//! key/value head (grouped-query attention) and every row of a small block against the key
//! as it is read. The loops run on [`super::simd`]'s lanes, compiled per instruction set;
//! each task keeps its buffers across tiles.

use rayon::prelude::*;

use super::kv::{Cache, KvValue};
use super::linalg::exp;
use super::simd::{Isa, Kernel, Simd};

mod rows;

/// The attention shape of a model.
#[derive(Clone, Copy, Debug)]
pub(super) struct Heads {
    /// Query heads.
    pub query: usize,
    /// Key/value heads.
    pub kv: usize,
    /// Values per head.
    pub dim: usize,
    /// Scores are dot products times this (`1 / sqrt(dim)` unless the family says).
    pub scale: f32,
    /// Scores become `cap · tanh(score / cap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// A query sees itself and the `window - 1` positions before it (a sliding layer).
    pub window: Option<usize>,
}

impl Heads {
    /// The score of a dot product.
    #[inline(always)]
    fn score(&self, dot: f32) -> f32 {
        let x = dot * self.scale;
        match self.softcap {
            Some(cap) => crate::model::architecture::softcap(x, cap),
            None => x,
        }
    }

    /// The first position a query at `pos` sees.
    #[inline(always)]
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// Consecutive rows of one sequence: rows `row..row + len` of the batch, at positions
/// `pos..pos + len`; `offsets` are the cache offsets of positions `0..pos + len`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tile<'a> {
    /// The first row.
    pub row: usize,
    /// Rows.
    pub len: usize,
    /// The first row's position.
    pub pos: usize,
    /// Cache offsets of the sequence's positions so far.
    pub offsets: &'a [usize],
    /// The rows are a prompt's: scored by the tile kernel however few they are, so a prompt
    /// row's output does not depend on the rows beside it (a prefix-cache hit recomputes a
    /// prompt's last position alone and gets what the whole prompt got).
    pub prompt: bool,
}

/// Rows per tile: enough query vectors to pay for transposing each block of keys once.
pub(super) const TILE_ROWS: usize = 16;

/// Attention of every tile (prefill chunks): `queries` holds each row's query heads at
/// `stride` floats per row; writes `out` (rows × query heads × dim). Each block of sixteen
/// keys is transposed once and scored against every query of the tile with no horizontal
/// sums; then one softmax per query and one pass over the values per query with its sums in
/// registers.
pub(super) fn attend_tiles<V: KvValue>(
    cache: Cache<'_, V>,
    heads: Heads,
    tiles: &[Tile<'_>],
    queries: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    let isa = Isa::detected();
    let width = heads.query * heads.dim;
    let per_group = width / heads.kv.max(1);
    let mut work = Vec::with_capacity(tiles.len());
    let mut rest = out;
    for tile in tiles {
        let (part, tail) = rest.split_at_mut(tile.len * width);
        rest = tail;
        if tile.prompt {
            // One task per key/value head: a tile's groups are independent, and a prompt of
            // one tile (a prefix hit's last position) would otherwise run on one thread.
            for (group, out) in by_kv_head(part, width, heads.kv).into_iter().enumerate() {
                work.push(Work::Tile {
                    tile: *tile,
                    group,
                    out,
                });
            }
            continue;
        }
        // Decoding rows: one task per key/value head and block of at most `ROWS_PER_TASK`
        // rows (blocks of even size), each scored key by key however many rows its chunk has
        // (transposing keys for a few queries costs more than it saves): a step that checks
        // drafts, or appends a grammar's forced tokens, then gives each row what a decoding
        // step of that token alone would, and reads the keys and values once per block.
        let count = tile.len.div_ceil(rows::ROWS_PER_TASK);
        let size = tile.len.div_ceil(count.max(1)).max(1);
        for (b, block) in part.chunks_mut(size * width).enumerate() {
            for (group, outs) in by_kv_head(block, width, heads.kv).into_iter().enumerate() {
                let rows: Vec<rows::Row<'_>> = outs
                    .into_iter()
                    .enumerate()
                    .map(|(j, out)| {
                        let i = b * size + j;
                        let at = (tile.row + i) * stride + group * per_group;
                        rows::Row {
                            q: &queries[at..at + per_group],
                            span: heads.first_visible(tile.pos + i)..tile.pos + i + 1,
                            out,
                        }
                    })
                    .collect();
                let last = rows.last().map_or(0, |r| r.span.end);
                work.push(Work::Rows {
                    rows,
                    offsets: &tile.offsets[..last],
                    group,
                });
            }
        }
    }
    work.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(scores, keys), work| match work {
            Work::Tile { tile, group, out } => isa.run(TileKernel {
                cache,
                heads,
                tile,
                group,
                queries: &queries[tile.row * stride..],
                stride,
                out,
                scores,
                keys,
            }),
            Work::Rows {
                rows,
                offsets,
                group,
            } => isa.run(rows::Rows {
                cache,
                heads,
                rows,
                offsets,
                group,
                scores,
            }),
        },
    );
}

/// `rows` (consecutive rows of `width` floats) split by key/value head: for each of the `kv`
/// heads, its part of every row, in row order.
fn by_kv_head(rows: &mut [f32], width: usize, kv: usize) -> Vec<Vec<&mut [f32]>> {
    let per_head = width / kv.max(1);
    let mut heads: Vec<Vec<&mut [f32]>> = (0..kv)
        .map(|_| Vec::with_capacity(rows.len() / width.max(1)))
        .collect();
    for row in rows.chunks_exact_mut(width) {
        for (out, head) in row.chunks_exact_mut(per_head).zip(&mut heads) {
            head.push(out);
        }
    }
    heads
}

/// A task of [`attend_tiles`].
enum Work<'a> {
    /// One key/value head of a prefill tile, and that head's part of each of the tile's
    /// rows of the output.
    Tile {
        tile: Tile<'a>,
        group: usize,
        out: Vec<&'a mut [f32]>,
    },
    /// One key/value head of a block of consecutive decoding rows of one sequence.
    Rows {
        rows: Vec<rows::Row<'a>>,
        offsets: &'a [usize],
        group: usize,
    },
}

/// One tile as a [`Kernel`].
struct TileKernel<'a, V> {
    cache: Cache<'a, V>,
    heads: Heads,
    tile: Tile<'a>,
    /// The key/value head.
    group: usize,
    queries: &'a [f32],
    stride: usize,
    /// Per row, the outputs of the query heads that share that key/value head.
    out: Vec<&'a mut [f32]>,
    scores: &'a mut Vec<f32>,
    keys: &'a mut Vec<f32>,
}

impl<V: KvValue> Kernel for TileKernel<'_, V> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(mut self, s: S) {
        let Heads {
            query: nh,
            kv: nkv,
            dim: hd,
            ..
        } = self.heads;
        let Tile {
            len, pos, offsets, ..
        } = self.tile;
        let group = nh / nkv;
        let n = pos + len;
        let vectors = len * group;
        self.scores.clear();
        self.scores.resize(vectors * n, 0.0);
        self.keys.clear();
        self.keys.resize(hd * 16, 0.0);
        let g = self.group;
        for kb in (0..n).step_by(16) {
            let count = 16.min(n - kb);
            let block = &offsets[kb..kb + count];
            for c in 0..hd / 16 {
                let mut rows = [s.zero(); 16];
                for (row, &o) in rows.iter_mut().zip(block) {
                    *row = V::load16(s, lanes(self.cache.keys, o + g * hd + 16 * c));
                }
                for (i, column) in s.transpose16(rows).into_iter().enumerate() {
                    s.store(column, lanes_mut(self.keys, (16 * c + i) * 16));
                }
            }
            for (j, &o) in block.iter().enumerate() {
                let key = &self.cache.keys[o + g * hd..o + (g + 1) * hd];
                for (d, v) in key.iter().enumerate().skip(hd / 16 * 16) {
                    self.keys[d * 16 + j] = v.get();
                }
            }
            for v in 0..vectors {
                let (i, h) = (v / group, v % group);
                let at = i * self.stride + (g * group + h) * hd;
                let q = &self.queries[at..at + hd];
                let mut acc = [s.zero(); 4];
                for (d, &qd) in q.iter().enumerate() {
                    let kt = lanes(self.keys, d * 16);
                    acc[d % 4] = s.mul_add(s.splat(qd), s.load(kt), acc[d % 4]);
                }
                let mut sums = [0f32; 16];
                let total = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
                s.store(total, &mut sums);
                let row = &mut self.scores[v * n + kb..v * n + kb + count];
                for (r, v) in row.iter_mut().zip(sums) {
                    *r = self.heads.score(v);
                }
            }
        }
        for v in 0..vectors {
            let (i, h) = (v / group, v % group);
            let visible = pos + i + 1;
            let first = self.heads.first_visible(pos + i);
            let p = &mut self.scores[v * n + first..v * n + visible];
            let offsets = &offsets[first..];
            softmax(p);
            let o = &mut self.out[i][h * hd..(h + 1) * hd];
            let whole = hd / 16;
            for c0 in (0..whole).step_by(4) {
                let w = 4.min(whole - c0);
                let mut acc = [s.zero(); 4];
                for (&pj, &off) in p.iter().zip(offsets) {
                    let pv = s.splat(pj);
                    let base = off + g * hd + c0 * 16;
                    for (c, acc) in acc.iter_mut().enumerate().take(w) {
                        *acc = s.mul_add(
                            pv,
                            V::load16(s, lanes(self.cache.values, base + c * 16)),
                            *acc,
                        );
                    }
                }
                for (c, acc) in acc.iter().enumerate().take(w) {
                    s.store(*acc, lanes_mut(o, (c0 + c) * 16));
                }
            }
            for (d, o) in o.iter_mut().enumerate().skip(16 * whole) {
                *o = p
                    .iter()
                    .zip(offsets)
                    .map(|(&pj, &off)| pj * self.cache.values[off + g * hd + d].get())
                    .sum();
            }
        }
    }
}

/// Softmax in place: the powers in lanes ([`exp`]), then their sum in order.
#[inline(always)]
fn softmax(p: &mut [f32]) {
    let max = p.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for v in p.iter_mut() {
        *v = exp(*v - max);
    }
    let sum: f32 = p.iter().sum();
    let inv = 1.0 / sum;
    p.iter_mut().for_each(|v| *v *= inv);
}

/// Sixteen items of `v` from `at` as an array.
#[inline(always)]
pub(super) fn lanes<T>(v: &[T], at: usize) -> &[T; 16] {
    match v[at..at + 16].try_into() {
        Ok(a) => a,
        Err(_) => unreachable!("sixteen items are an array of sixteen"),
    }
}

/// Sixteen floats of `v` from `at` as an array to write.
#[inline(always)]
pub(super) fn lanes_mut(v: &mut [f32], at: usize) -> &mut [f32; 16] {
    match (&mut v[at..at + 16]).try_into() {
        Ok(a) => a,
        Err(_) => unreachable!("sixteen items are an array of sixteen"),
    }
}

/// `a · b`.
#[inline(always)]
pub(super) fn dot<S: Simd, V: KvValue>(s: S, a: &[f32], b: &[V]) -> f32 {
    let n = a.len().min(b.len());
    let whole = n / 16 * 16;
    let mut acc = s.zero();
    for i in (0..whole).step_by(16) {
        acc = s.mul_add(s.load(lanes(a, i)), V::load16(s, lanes(b, i)), acc);
    }
    let tail: f32 = a[whole..n]
        .iter()
        .zip(&b[whole..n])
        .map(|(x, y)| x * y.get())
        .sum();
    s.sum(acc) + tail
}

/// `out += p · v`.
#[inline(always)]
pub(super) fn axpy<S: Simd, V: KvValue>(s: S, p: f32, v: &[V], out: &mut [f32]) {
    let n = v.len().min(out.len());
    let whole = n / 16 * 16;
    let ps = s.splat(p);
    for i in (0..whole).step_by(16) {
        let o = lanes_mut(out, i);
        let acc = s.mul_add(ps, V::load16(s, lanes(v, i)), s.load(o));
        s.store(acc, o);
    }
    for (o, &v) in out[whole..n].iter_mut().zip(&v[whole..n]) {
        *o += p * v.get();
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
