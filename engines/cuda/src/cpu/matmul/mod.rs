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
    /// Rounded to bytes in groups, as ggml does ([`int8`]), with a second byte pass over
    /// what rounding left out where a matrix asks for one ([`SecondPass`]). A row's sums do
    /// not depend on the rows beside it, so a prompt's logits are the same whether a
    /// prefix-cache hit recomputes only its last position or not, and one layout of the
    /// weights serves prompts and decoding steps.
    #[default]
    Int8,
}

/// What the CPU does with an encoder embedding model's float weights (the engine setting
/// `cpu_weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FloatWeights {
    /// Kept as shipped (f32, f16 or bf16): the reference's results to rounding.
    #[default]
    Shipped,
    /// Rounded at load to bytes in groups of 32, as Q8_0 rounds, so that under
    /// [`Activations::Int8`] products take the byte kernels: faster, a quarter of f32's
    /// memory, and further from the reference (see `cpu::encoder`).
    Int8,
}

/// Which rows of a byte product take a second pass over what rounding their inputs left out
/// (itself rounded): a row in two passes is within a byte's step of a byte's step of f32, at
/// twice a byte pass's arithmetic and the same read of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SecondPass {
    /// No row: one byte pass each.
    Never,
    /// Prompt rows, not decoding steps' ([`linear`]'s `rounded` rows).
    Prompts,
}

/// A weight matrix as the CPU multiplies it: its values as shipped, or under
/// [`Activations::Int8`] 4- and 8-bit codes laid out for the byte kernels (the shipped codes
/// kept beside them only where lookups read them, [`Self::tiles_only`]).
#[derive(Debug)]
pub(super) struct Matrix {
    /// The values as shipped (what float products, lookups and norms read).
    pub packed: Packed,
    tiles: Option<int8::Tiles>,
    /// Which rows' byte products take a second pass ([`Self::second_pass`]).
    second_pass: SecondPass,
    /// Where the matrix is stacked from parts in different layouts ([`Self::stacked`]): the
    /// parts, each multiplied in its own, and `packed` holds the shape only.
    parts: Vec<Matrix>,
}

impl Matrix {
    /// `packed`, multiplied with f32 inputs.
    pub(super) fn new(packed: Packed) -> Self {
        Self {
            packed,
            tiles: None,
            second_pass: SecondPass::Never,
            parts: Vec::new(),
        }
    }

    /// The parts of a stacked matrix (q, k and v), one under another, each kept in its own
    /// layout ([`crate::model::PackedReader`]): a product multiplies each and places its
    /// columns, so no part is widened to another's layout.
    pub(super) fn stacked(mut parts: Vec<Packed>) -> Self {
        if parts.len() < 2 {
            return Self::new(parts.pop().unwrap_or_else(|| Packed::f32(0, 0, Vec::new())));
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let cols = parts.first().map_or(0, |p| p.cols);
        let mut whole = Self::new(Packed::f32(rows, cols, Vec::new()));
        whole.parts = parts.into_iter().map(Self::new).collect();
        whole
    }

    /// Which rows of this matrix's byte products take a second pass.
    pub(super) fn second_pass(&mut self, rows: SecondPass) {
        self.second_pass = rows;
        self.parts.iter_mut().for_each(|p| p.second_pass(rows));
    }

    /// For a matrix laid out for the byte kernels (whose products never read the shipped
    /// codes): drops those codes, so the matrix is held once (its shape stays readable).
    /// Nothing changes for a matrix with float inputs.
    pub(super) fn tiles_only(&mut self) {
        self.parts.iter_mut().for_each(Self::tiles_only);
        if self.tiles.is_some() {
            self.packed.codes = crate::model::packed::Codes::F32(Vec::new());
        }
    }

    /// Bytes the matrix takes in memory.
    pub(super) fn bytes(&self) -> usize {
        self.packed.bytes()
            + self.tiles.as_ref().map_or(0, int8::Tiles::bytes)
            + self.parts.iter().map(Self::bytes).sum::<usize>()
    }

    /// Lays 4- and 8-bit codes out for the byte kernels where `inputs` asks for it, so
    /// products round their inputs to bytes.
    pub(super) fn round_inputs(&mut self, inputs: Activations) {
        self.parts.iter_mut().for_each(|p| p.round_inputs(inputs));
        if inputs == Activations::Int8 && self.parts.is_empty() {
            self.tiles = int8::Tiles::new(&self.packed);
        }
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`, on the current rayon pool, where the first
/// `rounded` rows are decoding steps' and the others prompts'. Where `w` is laid out for the
/// byte kernels each row rounds its inputs to bytes, in one pass or two as the matrix's
/// [`SecondPass`] asks; other matrices multiply f32 inputs.
///
/// # Panics
/// When the shapes do not agree (a bug in the caller, never input-dependent).
pub(super) fn linear(x: &[f32], rounded: usize, w: &Matrix, bias: Option<&[f32]>, out: &mut [f32]) {
    linear_with(Isa::detected(), x, rounded, w, bias, out);
}

/// [`linear`] compiled for `isa` (the portable loop where this CPU does not run it); a
/// matrix stacked from parts takes each part's product in turn.
pub(super) fn linear_with(
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
    if !w.parts.is_empty() {
        parts(isa, x, rounded, &w.parts, out);
    } else {
        whole(isa, x, rounded, w, out);
    }
    if let Some(bias) = bias {
        out.par_chunks_mut(n).for_each(|o| {
            for (v, b) in o.iter_mut().zip(bias) {
                *v += b;
            }
        });
    }
}

/// Each part's product, its columns placed beside the others'.
fn parts(isa: Isa, x: &[f32], rounded: usize, parts: &[Matrix], out: &mut [f32]) {
    let n: usize = parts.iter().map(|p| p.packed.rows).sum();
    let mut first = 0;
    for part in parts {
        let width = part.packed.rows;
        let mut sums = vec![0.0f32; out.len() / n.max(1) * width];
        linear_with(isa, x, rounded, part, None, &mut sums);
        out.par_chunks_mut(n)
            .zip(sums.par_chunks(width.max(1)))
            .for_each(|(row, sums)| row[first..first + width].copy_from_slice(sums));
        first += width;
    }
}

/// The product of a matrix held whole.
fn whole(isa: Isa, x: &[f32], rounded: usize, w: &Matrix, out: &mut [f32]) {
    let (n, k) = (w.packed.rows, w.packed.cols);
    let m = x.len().checked_div(k).unwrap_or(0);
    match &w.tiles {
        Some(tiles) => {
            let once = match w.second_pass {
                SecondPass::Never => m,
                SecondPass::Prompts => rounded.min(m),
            };
            bytes(isa, tiles, x, once, k, out);
        }
        None => match View::of(&w.packed) {
            View::F32(r) => split(isa, &r, x, k, n, out),
            View::Bf16(r) => split(isa, &r, x, k, n, out),
            View::F16(r) => split(isa, &r, x, k, n, out),
            View::Q4(r) => split(isa, &r, x, k, n, out),
            View::Q8(r) => split(isa, &r, x, k, n, out),
        },
    }
}

/// Byte products: the first `once` rows of `x` round their inputs once, the others take two
/// passes, the rounded inputs and then what rounding left out, in one read of the weights.
fn bytes(isa: Isa, tiles: &int8::Tiles, x: &[f32], once: usize, k: usize, out: &mut [f32]) {
    let n = tiles.rows();
    if once * k == x.len() {
        return split_int8(isa, tiles, x, out);
    }
    // Each row in two passes beside what its rounding left out, so one read of the weights
    // serves both passes (the kernel shares a tile's codes among the rows it holds); the sums
    // are the same as separate products'.
    let (single, double) = x.split_at(once * k);
    let residual = tiles.residual(double);
    let mut rows = Vec::with_capacity(single.len() + 2 * double.len());
    rows.extend_from_slice(single);
    for (row, rest) in double.chunks_exact(k).zip(residual.chunks_exact(k)) {
        rows.extend_from_slice(row);
        rows.extend_from_slice(rest);
    }
    let mut sums = vec![0.0f32; rows.len() / k * n];
    split_int8(isa, tiles, &rows, &mut sums);
    let (single_out, double_out) = out.split_at_mut(once * n);
    let (single_sums, double_sums) = sums.split_at(once * n);
    single_out.copy_from_slice(single_sums);
    for (o, pair) in double_out
        .chunks_exact_mut(n)
        .zip(double_sums.chunks_exact(2 * n))
    {
        let (first, second) = pair.split_at(n);
        o.iter_mut()
            .zip(first.iter().zip(second))
            .for_each(|(o, (a, b))| *o = a + b);
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
    let amx = isa == Isa::Amx && isa.supported();
    (0..tiles.div_ceil(chunk)).into_par_iter().for_each(|c| {
        isa.run(Int8Block {
            w,
            x: &x,
            tiles: c * chunk..((c + 1) * chunk).min(tiles),
            amx,
            out: dst,
        });
    });
}

/// One task's tiles with inputs rounded to bytes, as a [`Kernel`].
struct Int8Block<'a> {
    w: &'a int8::Tiles,
    x: &'a int8::Inputs,
    tiles: std::ops::Range<usize>,
    /// Whether rows may go by sixteen through AMX's tiles (granted to this process).
    amx: bool,
    out: SendOut,
}

impl Kernel for Int8Block<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, s: S) {
        // SAFETY: `out` is m × n (checked in `linear_with`) and each task writes only its own
        // tiles' columns; `amx` was set only where the tiles are granted.
        unsafe { int8::block::<S, T>(s, self.w, self.x, self.tiles, self.amx, self.out.get()) }
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
