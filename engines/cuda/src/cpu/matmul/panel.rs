//! The product for many input rows (prefill): each task decodes 32 weight rows at a time into
//! an f32 panel laid out `[k][32]`, once, and multiplies every tile of input rows against it
//! with one broadcast input value and two panel vectors per step, so the inner loop is nothing
//! but multiply-adds. Decoding costs the same as in [`super::tile`], but here it is shared by
//! all the rows of the batch instead of a tile of them.

use super::rows::Rows;
use super::tile::Out;
use crate::cpu::simd::Simd;

/// Output columns per panel: two vectors of sixteen.
pub(super) const WIDTH: usize = 32;

/// Batches at least this many rows take the panel path.
pub(super) const MIN_ROWS: usize = 32;

/// Every row of `x` (`m × k`) against weight rows `cols`, through panels of [`WIDTH`]
/// columns held in `panel` (resized as needed).
///
/// # Safety
/// `out.ptr` must point at `m × out.n` writable floats, and no other thread may write the
/// columns `cols` of it meanwhile.
#[inline(always)]
pub(super) unsafe fn block<W: Rows, S: Simd>(
    s: S,
    w: &W,
    x: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: Out,
    panel: &mut Vec<f32>,
) {
    let m = x.len().checked_div(k).unwrap_or(0);
    panel.clear();
    panel.resize(k * WIDTH, 0.0);
    let mut first = cols.start;
    while first < cols.end {
        let width = WIDTH.min(cols.end - first);
        decode::<W, S>(s, w, first..first + width, k, panel);
        let mut r0 = 0;
        while r0 + 8 <= m {
            // SAFETY: rows r0..r0+8 lie below m, the columns are the caller's.
            unsafe { multiply::<S, 8>(s, x, k, r0, panel, out, first, width) };
            r0 += 8;
        }
        while r0 < m {
            // SAFETY: as above, for one row.
            unsafe { multiply::<S, 1>(s, x, k, r0, panel, out, first, width) };
            r0 += 1;
        }
        first += width;
    }
}

/// Weight rows `cols` (at most [`WIDTH`]) into `panel[i * WIDTH + c]`; columns past them zero.
#[inline(always)]
fn decode<W: Rows, S: Simd>(
    s: S,
    w: &W,
    cols: std::ops::Range<usize>,
    k: usize,
    panel: &mut [f32],
) {
    let whole = k / 16;
    let mut lanes = [0f32; 16];
    for c in cols.len()..WIDTH {
        for i in 0..k {
            panel[i * WIDTH + c] = 0.0;
        }
    }
    for (c, col) in cols.enumerate() {
        for g in 0..whole {
            s.store(w.load16(s, col, g), &mut lanes);
            for (j, &v) in lanes.iter().enumerate() {
                panel[(16 * g + j) * WIDTH + c] = v;
            }
        }
        for i in 16 * whole..k {
            panel[i * WIDTH + c] = w.value(col, i);
        }
    }
}

/// Rows `r0..r0 + R` of `x` times the panel, into columns `first..first + width` of `out`.
///
/// # Safety
/// Those rows and columns must be inside `out` and the caller's to write.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // indices keep sums in registers
unsafe fn multiply<S: Simd, const R: usize>(
    s: S,
    x: &[f32],
    k: usize,
    r0: usize,
    panel: &[f32],
    out: Out,
    first: usize,
    width: usize,
) {
    assert!(
        x.len() >= (r0 + R) * k && panel.len() >= k * WIDTH,
        "shapes"
    );
    let xp = x.as_ptr();
    let pp = panel.as_ptr();
    let mut acc = [[s.zero(); 2]; R];
    for i in 0..k {
        // SAFETY: i < k, so both sixteen-float halves of panel row i lie inside the panel
        // asserted above; `[f32; 16]` has f32's alignment.
        let (p0, p1) = unsafe {
            let row = pp.add(i * WIDTH);
            (
                s.load(&*row.cast::<[f32; 16]>()),
                s.load(&*row.add(16).cast::<[f32; 16]>()),
            )
        };
        for r in 0..R {
            // SAFETY: row r0 + r < m and i < k: inside `x`, asserted above.
            let xv = s.splat(unsafe { *xp.add((r0 + r) * k + i) });
            acc[r][0] = s.mul_add(xv, p0, acc[r][0]);
            acc[r][1] = s.mul_add(xv, p1, acc[r][1]);
        }
    }
    let mut sums = [0f32; 16];
    for r in 0..R {
        for (half, v) in acc[r].iter().enumerate() {
            s.store(*v, &mut sums);
            for (j, &value) in sums.iter().enumerate() {
                let c = 16 * half + j;
                if c < width {
                    // SAFETY: the caller's contract.
                    unsafe { *out.ptr.add((r0 + r) * out.n + first + c) = value };
                }
            }
        }
    }
}
