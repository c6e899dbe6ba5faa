//! The one loop every matrix product runs: `R` input rows against one weight row, sixteen
//! values at a time, with `R` × 16 independent sums. It is written once, generic over the
//! layout ([`Rows`]) and the lanes ([`Simd`]), and compiled once per instruction set
//! by [`crate::cpu::simd`], so each build vectorises it for the widest registers it runs on.

use super::rows::Rows;
use crate::cpu::simd::Simd;

/// Dot products of `R` rows of `x` (each `k` wide, one after another) with rows
/// `col..col + C` of `w`: `R × C` sums in registers, each weight value decoded once for the `R`
/// rows and each input value loaded once for the `C` columns.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indices keep the R × C sums in registers
pub fn dots<W: Rows, S: Simd, const R: usize, const C: usize>(
    s: S,
    w: &W,
    x: &[f32],
    k: usize,
    col: usize,
) -> [[f32; R]; C] {
    assert!(x.len() >= R * k, "{R} rows of {k}");
    let mut acc = [[s.zero(); R]; C];
    let whole = k / 16;
    let xp = x.as_ptr();
    for g in 0..whole {
        let mut v = [s.zero(); C];
        for (c, v) in v.iter_mut().enumerate() {
            *v = w.load16(s, col + c, g);
        }
        for r in 0..R {
            // SAFETY: r < R and 16·g + 16 <= k, so the sixteen floats lie inside the R × k
            // rows asserted above; `[f32; 16]` has f32's alignment.
            let xs = s.load(unsafe { &*xp.add(r * k + 16 * g).cast::<[f32; 16]>() });
            for c in 0..C {
                acc[c][r] = s.mul_add(xs, v[c], acc[c][r]);
            }
        }
    }
    let mut out = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            let mut sum = s.sum(acc[c][r]);
            for i in 16 * whole..k {
                sum += x[r * k + i] * w.value(col + c, i);
            }
            out[c][r] = sum;
        }
    }
    out
}

/// Where a block's results go: `out` is `m × n`, row-major.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    pub n: usize,
}

/// Every row of `x` (`m × k`) against weight rows `cols`, writing `out`: rows in tiles of `T`
/// (then 4, 2, 1 for the rest) and weight rows `C` at a time, each weight row read once per
/// tile.
///
/// # Safety
/// `out.ptr` must point at `m × out.n` writable floats, and no other thread may write the
/// columns `cols` of it meanwhile.
#[inline(always)]
pub unsafe fn block<W: Rows, S: Simd, const T: usize, const C: usize>(
    s: S,
    w: &W,
    x: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: Out,
) {
    let m = x.len().checked_div(k).unwrap_or(0);
    let mut r0 = 0;
    while r0 + T <= m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, T, C>(s, w, x, k, r0, cols.clone(), out) };
        r0 += T;
    }
    while r0 + 4 <= m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, 4, C>(s, w, x, k, r0, cols.clone(), out) };
        r0 += 4;
    }
    while r0 + 2 <= m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, 2, 1>(s, w, x, k, r0, cols.clone(), out) };
        r0 += 2;
    }
    if r0 < m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, 1, 1>(s, w, x, k, r0, cols, out) };
    }
}

/// # Safety
/// As [`block`], for rows `r0..r0 + R`.
#[inline(always)]
unsafe fn run<W: Rows, S: Simd, const R: usize, const C: usize>(
    s: S,
    w: &W,
    x: &[f32],
    k: usize,
    r0: usize,
    cols: std::ops::Range<usize>,
    out: Out,
) {
    let rows = &x[r0 * k..(r0 + R) * k];
    let mut col = cols.start;
    while col < cols.end {
        if col + C <= cols.end {
            let d = dots::<W, S, R, C>(s, w, rows, k, col);
            // SAFETY: the caller owns columns col..col+C of rows r0..r0+R of `out`.
            unsafe { write(out, r0, col, &d) };
            col += C;
        } else {
            let d = dots::<W, S, R, 1>(s, w, rows, k, col);
            // SAFETY: as above, for one column.
            unsafe { write(out, r0, col, &d) };
            col += 1;
        }
    }
}

/// Writes `d[c][r]` to row `r0 + r`, column `col + c` of `out`.
///
/// # Safety
/// Those cells must be inside `out` and the caller's to write.
#[inline(always)]
unsafe fn write<const R: usize, const C: usize>(
    out: Out,
    r0: usize,
    col: usize,
    d: &[[f32; R]; C],
) {
    for (c, column) in d.iter().enumerate() {
        for (r, &v) in column.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { *out.ptr.add((r0 + r) * out.n + col + c) = v };
        }
    }
}
