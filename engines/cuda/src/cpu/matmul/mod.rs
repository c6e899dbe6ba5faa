//! Matrix products against weights in their own precision: `out = x · wᵀ (+ bias)`, with `w` a
//! [`Packed`] matrix (f32, bf16, f16, or 4- and 8-bit codes).
//!
//! Written here rather than taken from a GEMM crate because no kept crate multiplies by
//! ggml's quantized layouts without converting the whole matrix first, and converting per step
//! is what made the device slow: every weight value here is decoded in registers, once per
//! tile of input rows, and never written back. One loop ([`tile`]) serves every layout
//! ([`rows`]) and is compiled per instruction set ([`super::simd`]). Work is split by output columns
//! over the device's threads, so each thread streams its own weight rows once per step for
//! the whole batch.

mod panel;
mod rows;
mod tile;

use rayon::prelude::*;

use super::simd::{Isa, Kernel, Simd};
use crate::model::Packed;
use rows::{Rows, View};
use tile::Out;

/// A pointer that may cross threads; every user writes its own columns of what it points to.
#[derive(Clone, Copy)]
struct SendOut(Out);
// SAFETY: tasks write disjoint column ranges of one buffer that outlives the parallel loop.
unsafe impl Send for SendOut {}
// SAFETY: as above; the pointer itself is only copied.
unsafe impl Sync for SendOut {}

impl SendOut {
    fn get(self) -> Out {
        self.0
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`, on the current rayon pool.
///
/// # Panics
/// When the shapes do not agree (a bug in the caller, never input-dependent).
pub fn linear(x: &[f32], w: &Packed, bias: Option<&[f32]>, out: &mut [f32]) {
    linear_with(Isa::detected(), x, w, bias, out);
}

/// [`linear`] compiled for `isa` (the portable loop where this CPU does not run it).
pub fn linear_with(isa: Isa, x: &[f32], w: &Packed, bias: Option<&[f32]>, out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    let m = x.len().checked_div(k).unwrap_or(0);
    assert_eq!(x.len(), m * k, "input shape");
    assert_eq!(out.len(), m * n, "output shape");
    match View::of(w) {
        View::F32(r) => split(isa, &r, x, k, n, out),
        View::Bf16(r) => split(isa, &r, x, k, n, out),
        View::F16(r) => split(isa, &r, x, k, n, out),
        View::Q4(r) => split(isa, &r, x, k, n, out),
        View::Q8(r) => split(isa, &r, x, k, n, out),
    }
    if let Some(bias) = bias {
        for o in out.chunks_exact_mut(n) {
            for (v, b) in o.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

/// Splits the output columns into tasks for the pool.
fn split<W: Rows>(isa: Isa, w: &W, x: &[f32], k: usize, n: usize, out: &mut [f32]) {
    if n == 0 || x.is_empty() {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let dst = SendOut(Out {
        ptr: out.as_mut_ptr(),
        n,
    });
    if x.len() / k.max(1) >= panel::MIN_ROWS {
        let chunk = n.div_ceil(threads * 4).next_multiple_of(panel::WIDTH);
        (0..n.div_ceil(chunk))
            .into_par_iter()
            .for_each_init(Vec::new, |scratch, c| {
                let cols = c * chunk..((c + 1) * chunk).min(n);
                isa.run(Panel {
                    w,
                    x,
                    k,
                    cols,
                    out: dst,
                    scratch,
                });
            });
        return;
    }
    let chunk = n.div_ceil(threads * 4).next_multiple_of(8).max(8);
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let cols = c * chunk..((c + 1) * chunk).min(n);
        isa.run(Block {
            w,
            x,
            k,
            cols,
            out: dst,
        });
    });
}

/// One task's columns for many rows, through decoded panels, as a [`Kernel`].
struct Panel<'a, W> {
    w: &'a W,
    x: &'a [f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: SendOut,
    scratch: &'a mut Vec<f32>,
}

impl<W: Rows> Kernel for Panel<'_, W> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, s: S) {
        // SAFETY: `out` is m × n (checked in `linear_with`) and each task writes only its own
        // columns.
        unsafe {
            panel::block::<W, S>(
                s,
                self.w,
                self.x,
                self.k,
                self.cols,
                self.out.get(),
                self.scratch,
            )
        }
    }
}

/// One task's columns, as a [`Kernel`].
struct Block<'a, W> {
    w: &'a W,
    x: &'a [f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: SendOut,
}

impl<W: Rows> Kernel for Block<'_, W> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, s: S) {
        // SAFETY: `out` is m × n (checked in `linear_with`) and each task writes only its own
        // columns.
        unsafe { tile::block::<W, S, T>(s, self.w, self.x, self.k, self.cols, self.out.get()) }
    }
}

#[cfg(test)]
mod tests;
