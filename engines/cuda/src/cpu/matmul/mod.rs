//! Matrix products against weights in their own precision: `out = x · wᵀ (+ bias)`, with `w` a
//! [`Packed`] matrix (f32, bf16, f16, or 4- and 8-bit codes).
//!
//! Written here rather than taken from a GEMM crate because no kept crate multiplies by
//! ggml's quantized layouts without converting the whole matrix first, and converting per step
//! is what made the device slow: every weight value here is decoded in registers, once per
//! tile of input rows, and never written back. One loop ([`tile`]) serves every layout
//! ([`rows`]) and is compiled per instruction set ([`super::simd`]). Work is split by output columns
//! over the device's threads, so each thread streams its own weight rows once per step for
//! the whole batch. Products with 4- and 8-bit weights may round their inputs to
//! bytes ([`Activations::Int8`], [`int8`]) to multiply four bytes per lane per instruction.

mod int8;
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

/// What the inputs of a product against 4- and 8-bit weights are (the engine setting
/// `cpu_activations`: `"int8"` or `"exact"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activations {
    /// f32, against every weight decoded to f32: the sums a reference that dequantizes the
    /// weights computes, to rounding order.
    Exact,
    /// Rounded to bytes in groups, as ggml does ([`int8`]), in decoding steps; prompts keep
    /// them f32 (against a refined matrix, the output projection, every row takes two byte
    /// passes), so a prompt's logits are the same whether a prefix-cache hit recomputes only
    /// its last position or not.
    #[default]
    Int8,
}

/// A weight matrix as the CPU multiplies it: its values as shipped, and under
/// [`Activations::Int8`] 4- and 8-bit codes also laid out for the byte kernels.
#[derive(Debug)]
pub struct Matrix {
    /// The values as shipped (what prefill, lookups and norms read).
    pub packed: Packed,
    tiles: Option<int8::Tiles>,
    /// Whether every row's byte product takes a second pass over what rounding left out
    /// ([`Self::refine`]).
    refined: bool,
}

impl Matrix {
    /// `packed`, multiplied with f32 inputs.
    pub fn new(packed: Packed) -> Self {
        Self {
            packed,
            tiles: None,
            refined: false,
        }
    }

    /// Byte products of this matrix run twice: on the rounded inputs, then on what rounding left
    /// out (itself rounded), so the sum is within a byte's step of a byte's step of exact, at
    /// twice a byte product's cost (still under the f32 product's). For the output projection,
    /// whose near-tied logits decide tokens.
    pub fn refine(&mut self) {
        self.refined = true;
    }

    /// For a refined matrix laid out for the byte kernels (whose rows never read the shipped
    /// codes): drops those codes, so the matrix is held once (its shape stays readable).
    /// Nothing changes for any other matrix.
    pub fn tiles_only(&mut self) {
        if self.tiles.is_some() && self.refined {
            self.packed.codes = crate::model::packed::Codes::F32(Vec::new());
        }
    }

    /// Bytes the matrix takes in memory.
    pub fn bytes(&self) -> usize {
        self.packed.bytes() + self.tiles.as_ref().map_or(0, int8::Tiles::bytes)
    }

    /// Lays 4- and 8-bit codes out for the byte kernels where `inputs` asks for it, so
    /// decoding steps' products round their inputs to bytes.
    pub fn round_inputs(&mut self, inputs: Activations) {
        if inputs == Activations::Int8 {
            self.tiles = int8::Tiles::new(&self.packed);
        }
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`, on the current rayon pool. Where `w` is laid
/// out for the byte kernels, the first `rounded` rows (decoding steps) round their inputs to
/// bytes once and the others (prompts) keep f32 inputs; a refined `w` ([`Matrix::refine`])
/// takes two byte passes for every row instead, which is within a byte's step of a byte's step
/// of f32.
///
/// # Panics
/// When the shapes do not agree (a bug in the caller, never input-dependent).
pub fn linear(x: &[f32], rounded: usize, w: &Matrix, bias: Option<&[f32]>, out: &mut [f32]) {
    linear_with(Isa::detected(), x, rounded, w, bias, out);
}

/// [`linear`] compiled for `isa` (the portable loop where this CPU does not run it).
pub fn linear_with(
    isa: Isa,
    x: &[f32],
    rounded: usize,
    w: &Matrix,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (n, k) = (w.packed.rows, w.packed.cols);
    let m = x.len().checked_div(k).unwrap_or(0);
    assert_eq!(x.len(), m * k, "input shape");
    assert_eq!(out.len(), m * n, "output shape");
    let (once, twice) = match &w.tiles {
        Some(_) if w.refined => (0, m),
        Some(_) => (rounded.min(m), rounded.min(m)),
        None => (0, 0),
    };
    let (bytes, rest) = x.split_at(once * k);
    let (refined, exact) = rest.split_at((twice - once) * k);
    let (bytes_out, rest_out) = out.split_at_mut(once * n);
    let (refined_out, exact_out) = rest_out.split_at_mut((twice - once) * n);
    if let Some(tiles) = &w.tiles {
        split_int8(isa, tiles, bytes, bytes_out);
        if !refined.is_empty() {
            // Each row beside what its rounding left out, so one read of the weights serves
            // both passes (the kernel shares a tile's codes among the rows it holds); the
            // sums are the same as two separate products'.
            let residual = tiles.residual(refined);
            let mut both = Vec::with_capacity(2 * refined.len());
            for (row, rest) in refined.chunks_exact(k).zip(residual.chunks_exact(k)) {
                both.extend_from_slice(row);
                both.extend_from_slice(rest);
            }
            let mut sums = vec![0.0f32; 2 * refined_out.len()];
            split_int8(isa, tiles, &both, &mut sums);
            for (o, pair) in refined_out
                .chunks_exact_mut(n)
                .zip(sums.chunks_exact(2 * n))
            {
                let (first, second) = pair.split_at(n);
                o.iter_mut()
                    .zip(first.iter().zip(second))
                    .for_each(|(o, (a, b))| *o = a + b);
            }
        }
    }
    match View::of(&w.packed) {
        View::F32(r) => split(isa, &r, exact, k, n, exact_out),
        View::Bf16(r) => split(isa, &r, exact, k, n, exact_out),
        View::F16(r) => split(isa, &r, exact, k, n, exact_out),
        View::Q4(r) => split(isa, &r, exact, k, n, exact_out),
        View::Q8(r) => split(isa, &r, exact, k, n, exact_out),
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

/// [`split`] for inputs rounded to bytes: tasks of whole tiles.
fn split_int8(isa: Isa, w: &int8::Tiles, x: &[f32], out: &mut [f32]) {
    let n = w.rows();
    if n == 0 || out.is_empty() {
        return;
    }
    let x = w.inputs(x);
    let threads = rayon::current_num_threads().max(1);
    let dst = SendOut(Out {
        ptr: out.as_mut_ptr(),
        n,
    });
    let tiles = n.div_ceil(16);
    let chunk = tiles.div_ceil(threads * 4);
    (0..tiles.div_ceil(chunk)).into_par_iter().for_each(|c| {
        isa.run(Int8Block {
            w,
            x: &x,
            tiles: c * chunk..((c + 1) * chunk).min(tiles),
            out: dst,
        });
    });
}

/// One task's tiles with inputs rounded to bytes, as a [`Kernel`].
struct Int8Block<'a> {
    w: &'a int8::Tiles,
    x: &'a int8::Inputs,
    tiles: std::ops::Range<usize>,
    out: SendOut,
}

impl Kernel for Int8Block<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, s: S) {
        // SAFETY: `out` is m × n (checked in `linear_with`) and each task writes only its own
        // tiles' columns.
        unsafe { int8::block::<S, T>(s, self.w, self.x, self.tiles, self.out.get()) }
    }
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
