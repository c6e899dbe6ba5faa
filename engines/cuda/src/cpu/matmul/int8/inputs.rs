//! Input rows rounded to signed bytes in the weights' groups ([`Inputs`]), once per product.

use rayon::prelude::*;

use super::super::rows::array;
use crate::cpu::simd::{Isa, Kernel, Simd};

/// Input rows rounded to bytes in groups.
pub(in crate::cpu::matmul) struct Inputs {
    pub(super) rows: usize,
    /// `rows × k` codes, going on with zeros to [`Inputs::stride`] rows, which AMX takes
    /// sixteen at a time.
    pub(super) codes: Vec<i8>,
    /// Each group's step, group by group: entry `g · stride + row` ([`Inputs::slot`]). A
    /// pass over a tile reads its rows' entries of one group side by side, at fixed offsets
    /// from one address, where row by row each was an index to work out and check.
    pub(super) scale: Vec<f32>,
    /// As `scale`: `-offset ×` the group's codes summed; empty for no offset.
    pub(super) start: Vec<i32>,
    /// As `scale`: the group's rounded inputs summed (step × codes summed, for the weights'
    /// minimum); empty unless asked for.
    pub(super) sum: Vec<f32>,
}

impl Inputs {
    /// `x` (rows of `k`, a multiple of `group`) for weights whose codes stand for
    /// `code - offset`, with the sums a weight minimum needs when `sums`. The minimum meets
    /// the rounded inputs, like the rest of the weight: the weight's rounding errors then
    /// cancel around its centre, where against exact sums the codes (all of one sign) would
    /// add them up.
    pub(super) fn quantize(x: &[f32], k: usize, group: usize, offset: i32, sums: bool) -> Self {
        let rows = x.len().checked_div(k).unwrap_or(0);
        let count = k / group;
        let stride = rows.next_multiple_of(16);
        let mut codes = vec![0; stride * k];
        // Row by row first, where each row is one task's, then group by group.
        let (mut scale, mut start, mut sum) = (
            vec![0.0; rows * count],
            vec![0; rows * count],
            vec![0.0; rows * count],
        );
        // Rows are rounded on the pool, each compiled for the CPU's instruction set: a
        // prompt's rows are many, and one core rounding them left the others waiting.
        let isa = Isa::detected();
        x.par_chunks(k)
            .zip(codes[..rows * k].par_chunks_mut(k))
            .zip(scale.par_chunks_mut(count))
            .zip(start.par_chunks_mut(count))
            .zip(sum.par_chunks_mut(count))
            .with_min_len(4)
            .for_each(|((((values, codes), scale), start), sum)| {
                isa.run(RoundRow {
                    values,
                    group,
                    offset,
                    codes,
                    scale,
                    start,
                    sum,
                })
            });
        Self {
            rows,
            codes,
            scale: by_group(&scale, count, stride),
            start: if offset == 0 {
                Vec::new()
            } else {
                by_group(&start, count, stride)
            },
            sum: if sums {
                by_group(&sum, count, stride)
            } else {
                Vec::new()
            },
        }
    }

    /// Rows in each group's entries of `scale`, `start` and `sum`: `rows` to a multiple of 16.
    pub(super) fn stride(&self) -> usize {
        self.rows.next_multiple_of(16)
    }

    /// Where row `row`'s entry of group `g` lies in `scale`, `start` and `sum`.
    pub(super) fn slot(&self, row: usize, g: usize) -> usize {
        g * self.stride() + row
    }

    /// Group `g`'s entries in `v` (`scale`, `start` or `sum`) of rows `r0..r0 + R`.
    #[inline(always)]
    pub(super) fn group<'a, T, const R: usize>(
        &self,
        v: &'a [T],
        g: usize,
        r0: usize,
    ) -> &'a [T; R] {
        array(v, self.slot(r0, g))
    }
}

/// `values` (`count` a row) group by group, `stride` rows each (zeros past the last row).
fn by_group<T: Copy + Default>(values: &[T], count: usize, stride: usize) -> Vec<T> {
    let mut out = vec![T::default(); count * stride];
    for (row, entries) in values.chunks_exact(count).enumerate() {
        for (g, &v) in entries.iter().enumerate() {
            out[g * stride + row] = v;
        }
    }
    out
}

/// One row's groups rounded to bytes, as a [`Kernel`]: each group's codes, step,
/// `-offset ×` its codes summed, and its rounded inputs summed.
struct RoundRow<'a> {
    values: &'a [f32],
    group: usize,
    offset: i32,
    codes: &'a mut [i8],
    scale: &'a mut [f32],
    start: &'a mut [i32],
    sum: &'a mut [f32],
}

impl Kernel for RoundRow<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, _: S) {
        // Plain loops the compiler widens to the lanes (a closure would be compiled without
        // the instruction set); the largest magnitude is kept per lane of sixteen, then
        // folded, so the order of the maxima does not matter.
        let group = self.group;
        let groups = self
            .values
            .chunks_exact(group)
            .zip(self.codes.chunks_exact_mut(group));
        for (g, (values, codes)) in groups.enumerate() {
            let mut lanes = [0f32; 16];
            for c in 0..group / 16 {
                let sixteen: &[f32; 16] = array(values, 16 * c);
                for i in 0..16 {
                    lanes[i] = larger(lanes[i], sixteen[i].abs());
                }
            }
            for v in values.chunks_exact(16).remainder() {
                lanes[0] = larger(lanes[0], v.abs());
            }
            let mut width = 16;
            while width > 1 {
                width /= 2;
                for i in 0..width {
                    lanes[i] = larger(lanes[i], lanes[i + width]);
                }
            }
            let largest = lanes[0];
            let (step, inverse) = if largest > 0.0 {
                (largest / 127.0, 127.0 / largest)
            } else {
                (0.0, 0.0)
            };
            let mut total = 0i32;
            for (c, &v) in codes.iter_mut().zip(values) {
                // Half away from zero, as ggml rounds; |v · inverse| <= 127 (+ rounding). Through
                // i32, whose conversion runs in lanes (a float's straight to a byte does not).
                let code = larger(-127.0, v * inverse + 0.5f32.copysign(v));
                // SAFETY: `larger` and `smaller` put NaN at -127 and every value in
                // -127..=127, where an i32 holds it exactly.
                let code: i32 = unsafe { smaller(127.0, code).to_int_unchecked() };
                *c = code as i8;
                total += code;
            }
            self.scale[g] = step;
            self.start[g] = -self.offset * total;
            self.sum[g] = step * total as f32;
        }
    }
}

/// The larger of `a` and `b` by one comparison (a NaN in `b` gives `a`), which runs in
/// lanes where `f32::max`'s NaN rules did not.
#[inline(always)]
fn larger(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

/// The smaller of `a` and `b` by one comparison (a NaN in `b` gives `a`).
#[inline(always)]
fn smaller(a: f32, b: f32) -> f32 {
    if b < a { b } else { a }
}
