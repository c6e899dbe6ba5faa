//! The one loop every matrix product runs: `R` input rows against one weight row, sixteen
//! values at a time, with `R` × 16 independent sums. It is written once, generic over the
//! layout ([`Rows`]) and the lanes ([`Simd`]), and compiled once per instruction set
//! by [`crate::cpu::simd`], so each build vectorises it for the widest registers it runs on.

use super::rows::Rows;
use crate::cpu::simd::Simd;

/// Dot products of `R` rows of `x` (each `k` wide, one after another) with row `col` of `w`:
/// `R` sums in registers, each weight value decoded once for the `R` rows.
#[inline(always)]
pub(super) fn dots<W: Rows, S: Simd, const R: usize>(
    s: S,
    w: &W,
    x: &[f32],
    k: usize,
    col: usize,
) -> [f32; R] {
    assert!(x.len() >= R * k, "{R} rows of {k}");
    let mut acc = [s.zero(); R];
    let whole = k / 16;
    let xp = x.as_ptr();
    for g in 0..whole {
        let v = w.load16(s, col, g);
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: r < R and 16·g + 16 <= k, so the sixteen floats lie inside the R × k
            // rows asserted above; `[f32; 16]` has f32's alignment.
            let xs = unsafe { &*xp.add(r * k + 16 * g).cast::<[f32; 16]>() };
            *acc = s.mul_add(s.load(xs), v, *acc);
        }
    }
    let mut out = [0f32; R];
    for (r, (o, acc)) in out.iter_mut().zip(acc).enumerate() {
        let mut sum = s.sum(acc);
        for i in 16 * whole..k {
            sum += x[r * k + i] * w.value(col, i);
        }
        *o = sum;
    }
    out
}

/// Where a block's results go: `out` is `m × n`, row-major.
#[derive(Clone, Copy)]
pub(super) struct Out {
    pub ptr: *mut f32,
    pub n: usize,
}

/// Every row of `x` (`m × k`) against weight rows `cols`, writing `out`: rows in tiles of `T`
/// (then 4, 2, 1 for the rest), each weight row read once per tile.
///
/// # Safety
/// `out.ptr` must point at `m × out.n` writable floats, and no other thread may write the
/// columns `cols` of it meanwhile.
#[inline(always)]
pub(super) unsafe fn block<W: Rows, S: Simd, const T: usize>(
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
        unsafe { run::<W, S, T>(s, w, x, k, r0, cols.clone(), out) };
        r0 += T;
    }
    while r0 + 4 <= m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, 4>(s, w, x, k, r0, cols.clone(), out) };
        r0 += 4;
    }
    while r0 + 2 <= m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, 2>(s, w, x, k, r0, cols.clone(), out) };
        r0 += 2;
    }
    if r0 < m {
        // SAFETY: the rows lie below m and the columns are the caller's block of `out`.
        unsafe { run::<W, S, 1>(s, w, x, k, r0, cols, out) };
    }
}

/// # Safety
/// As [`block`], for rows `r0..r0 + R`.
#[inline(always)]
unsafe fn run<W: Rows, S: Simd, const R: usize>(
    s: S,
    w: &W,
    x: &[f32],
    k: usize,
    r0: usize,
    cols: std::ops::Range<usize>,
    out: Out,
) {
    let rows = &x[r0 * k..(r0 + R) * k];
    for col in cols {
        let d = dots::<W, S, R>(s, w, rows, k, col);
        for (r, v) in d.into_iter().enumerate() {
            // SAFETY: the caller owns column `col` of rows r0..r0+R of `out`.
            unsafe { *out.ptr.add((r0 + r) * out.n + col) = v };
        }
    }
}
