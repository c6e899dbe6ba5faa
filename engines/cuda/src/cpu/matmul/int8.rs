//! Products of 4- and 8-bit weights with 8-bit inputs, as ggml multiplies its
//! quantized types: each input row is rounded once per product to signed bytes in the weights'
//! groups (one f32 scale per group, [`Inputs`]), and four weight bytes meet four input bytes in
//! one i32 lane ([`Simd::dot_unsigned`], [`Simd::dot_signed`]): four times the products per
//! instruction of the float path, and codes are never turned into floats.
//!
//! The weights are laid out once, at load, for this loop ([`Tiles`]): sixteen output columns
//! side by side, each i32 lane one column, so a register of codes meets four input bytes
//! broadcast to every lane, the sums need no horizontal reduction, and the float work (scales,
//! minimums) is done once per group of 16 columns × 32 values per input row.
//!
//! The cost is the inputs' rounding: each input moves by at most half a step of its group
//! (the group's largest magnitude / 254), well under the weights' own quantization error.
//! Scales and minimums are held as IEEE halves: exactly the file's where it ships halves
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), and for the K-quants, whose group scales are a half
//! times a small integer, within 1/2048 of it, an eighth of the inputs' rounding (a matrix
//! with a scale outside the halves' normal range keeps f32 inputs instead). A decoding step
//! reads them beside the codes, so at 4 bits they were a third of its bytes as f32.
//! [`super::Activations::Exact`] keeps f32 inputs where bit-for-bit agreement with a reference
//! matters.

use rayon::prelude::*;

use super::rows::array;
use super::tile::Out;
use crate::cpu::simd::{Isa, Kernel, NIBBLE_PRODUCTS, Simd};
use crate::model::packed::{Codes, Groups, Packed};

#[cfg(target_arch = "x86_64")]
mod amx;

/// Output columns per tile: one per i32 lane.
const WIDTH: usize = 16;

/// Groups ahead whose codes are asked for early. At one input row the loop does little per
/// byte and a core's hardware prefetch alone left it waiting on memory: asking 8 groups ahead
/// (2 KiB of 4-bit codes) made SmolLM2's decoding steps 15% faster on 2 Xeon cores; 4 was
/// slower and 16 no faster.
const AHEAD: usize = 8;

/// Rows a task takes through all its tiles before the next: 64 rows' inputs (at most 192 KiB
/// at 3072 columns) stay in a core's cache, where a prompt's whole input (megabytes) was
/// read again for every tile.
const ROW_BLOCK: usize = 64;

/// Asks for `len` bytes of `codes` from `at` (those in it) to be brought into the cache.
#[inline(always)]
fn prefetch(codes: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (at..(at + len).min(codes.len())).step_by(64) {
        // SAFETY: a prefetch of an address inside the slice reads nothing and cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                codes.as_ptr().add(line).cast(),
            )
        };
    }
}

/// What the codes stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 4-bit codes, `code - offset`, in groups of 32; byte `j` of a group holds value `j` in
    /// its low nibble and `j + 16` in its high one.
    Q4 { offset: i32 },
    /// Signed 8-bit codes, held as unsigned `code + 128`: where [`Simd::WIDE_UNSIGNED`] they
    /// meet the signed inputs as they are (the inputs' sums times 128 taken off once per
    /// group), one instruction per four bytes where signed codes took three; elsewhere each
    /// register of codes is flipped back once for all rows.
    Q8,
}

/// A 4- or 8-bit matrix laid out for the byte kernels: tiles of 16 rows (output columns), and
/// in each tile, group by group, blocks of 64 bytes holding four code bytes of each of the 16
/// rows (block `q`: bytes `4q..4q + 4` of each row's group, row after row); beside them each
/// group's 16 scales and minimums, as halves.
#[derive(Debug)]
pub(super) struct Tiles {
    rows: usize,
    cols: usize,
    group: usize,
    kind: Kind,
    codes: Vec<u8>,
    /// IEEE half bit patterns.
    scale: Vec<u16>,
    /// IEEE half bit patterns; empty where the weights have no minimum.
    min: Vec<u16>,
}

impl Tiles {
    /// `w` laid out in tiles, or `None` for float layouts and for a scale or minimum outside
    /// the halves' normal range.
    pub(super) fn new(w: &Packed) -> Option<Self> {
        match &w.codes {
            Codes::Q4 { offset, groups } => Self::build(
                w,
                32,
                Kind::Q4 {
                    offset: i32::from(*offset),
                },
                &groups.codes,
                groups,
            ),
            Codes::Q8 { group, groups } => {
                let codes: Vec<u8> = groups.codes.iter().map(|&c| c as u8 ^ 0x80).collect();
                Self::build(w, *group, Kind::Q8, &codes, groups)
            }
            _ => None,
        }
    }

    fn build<T: Copy>(
        w: &Packed,
        group: usize,
        kind: Kind,
        codes: &[u8],
        groups: &Groups<T>,
    ) -> Option<Self> {
        let per = Self::bytes_per(kind, group);
        let count = w.cols / group;
        let tiles = w.rows.div_ceil(WIDTH);
        let mut out = Self {
            rows: w.rows,
            cols: w.cols,
            group,
            kind,
            codes: vec![0; tiles * count * WIDTH * per],
            scale: vec![0; tiles * count * WIDTH],
            min: vec![
                0;
                if groups.min.is_empty() {
                    0
                } else {
                    tiles * count * WIDTH
                }
            ],
        };
        for row in 0..w.rows {
            let (t, lane) = (row / WIDTH, row % WIDTH);
            for g in 0..count {
                let at = t * count + g;
                let src = &codes[(row * count + g) * per..][..per];
                for (q, four) in src.chunks_exact(4).enumerate() {
                    let dst = (at * per / 4 + q) * 4 * WIDTH + 4 * lane;
                    out.codes[dst..dst + 4].copy_from_slice(four);
                }
                out.scale[at * WIDTH + lane] = half(groups.scale[row * count + g])?;
                if !out.min.is_empty() {
                    out.min[at * WIDTH + lane] = half(groups.min_at(row * count + g))?;
                }
            }
        }
        Some(out)
    }

    /// Code bytes per row per group.
    fn bytes_per(kind: Kind, group: usize) -> usize {
        match kind {
            Kind::Q4 { .. } => group / 2,
            Kind::Q8 => group,
        }
    }

    /// Output columns.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// What rounding `x` to bytes leaves out: `x` minus its rounded value, element by element
    /// (multiplied in a second pass, it makes the product nearly exact; see
    /// [`super::SecondPass`]).
    pub(super) fn residual(&self, x: &[f32]) -> Vec<f32> {
        let inputs = Inputs::quantize(x, self.cols, self.group, 0, false);
        x.chunks_exact(self.group)
            .zip(inputs.codes.chunks_exact(self.group))
            .zip(&inputs.scale)
            .flat_map(|((values, codes), &step)| {
                values
                    .iter()
                    .zip(codes)
                    .map(move |(v, &c)| v - f32::from(c) * step)
            })
            .collect()
    }

    /// Bytes the tiles take in memory.
    pub(super) fn bytes(&self) -> usize {
        self.codes.len() + (self.scale.len() + self.min.len()) * 2
    }

    /// Input rows rounded for these weights.
    pub(super) fn inputs(&self, x: &[f32]) -> Inputs {
        let offset = match self.kind {
            Kind::Q4 { offset } => offset,
            Kind::Q8 => 128,
        };
        Inputs::quantize(x, self.cols, self.group, offset, !self.min.is_empty())
    }
}

/// `v` as the bit pattern of the nearest IEEE half, where that is within 1/2048 of it (zero or
/// in the halves' normal range).
fn half(v: f32) -> Option<u16> {
    let h = half::f16::from_f32(v);
    (v == 0.0 || (h.is_normal() && v.is_finite())).then_some(h.to_bits())
}

/// Input rows rounded to bytes in groups.
pub(super) struct Inputs {
    rows: usize,
    /// `rows × k` codes. This and the three below go on with zeros to a multiple of 16 rows.
    codes: Vec<i8>,
    /// `rows × groups`: each group's step.
    scale: Vec<f32>,
    /// `rows × groups`: `-offset ×` the group's codes summed; empty for no offset.
    start: Vec<i32>,
    /// `rows × groups`: the group's rounded inputs summed (step × codes summed, for the
    /// weights' minimum); empty unless asked for.
    sum: Vec<f32>,
}

impl Inputs {
    /// `x` (rows of `k`, a multiple of `group`) for weights whose codes stand for
    /// `code - offset`, with the sums a weight minimum needs when `sums`. The minimum meets
    /// the rounded inputs, like the rest of the weight: the weight's rounding errors then
    /// cancel around its centre, where against exact sums the codes (all of one sign) would
    /// add them up.
    fn quantize(x: &[f32], k: usize, group: usize, offset: i32, sums: bool) -> Self {
        let rows = x.len().checked_div(k).unwrap_or(0);
        let count = k / group;
        // Whole tiles of 16 rows (zeros past the last), which AMX takes at once.
        let padded = rows.next_multiple_of(16);
        let mut inputs = Self {
            rows,
            codes: vec![0; padded * k],
            scale: vec![0.0; padded * count],
            start: vec![0; padded * count],
            sum: vec![0.0; padded * count],
        };
        // Rows are rounded on the pool, each compiled for the CPU's instruction set: a
        // prompt's rows are many, and one core rounding them left the others waiting.
        let isa = Isa::detected();
        x.par_chunks(k)
            .zip(inputs.codes[..rows * k].par_chunks_mut(k))
            .zip(inputs.scale[..rows * count].par_chunks_mut(count))
            .zip(inputs.start[..rows * count].par_chunks_mut(count))
            .zip(inputs.sum[..rows * count].par_chunks_mut(count))
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
        if offset == 0 {
            inputs.start = Vec::new();
        }
        if !sums {
            inputs.sum = Vec::new();
        }
        inputs
    }
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

/// Rows `r0..r0 + R` of `x` against tile `t` of `w`: sixteen columns per row.
#[inline(always)]
fn tile_rows<S: Simd, const R: usize, const Q4: bool, const MIN: bool, const OFFSET: bool>(
    s: S,
    w: &Tiles,
    x: &Inputs,
    r0: usize,
    t: usize,
) -> [S::V; R] {
    let (k, group) = (w.cols, w.group);
    let count = k / group;
    let per = Tiles::bytes_per(w.kind, group);
    let xs = &x.codes[r0 * k..(r0 + R) * k];
    let xp = xs.as_ptr();
    let scales = &x.scale[r0 * count..(r0 + R) * count];
    let mut acc = [s.zero(); R];
    for g in 0..count {
        let at = t * count + g;
        let codes = &w.codes[at * WIDTH * per..(at + 1) * WIDTH * per];
        prefetch(&w.codes, (at + AHEAD) * WIDTH * per, WIDTH * per);
        let mut ints = [s.int_zero(); R];
        if OFFSET {
            for (r, ints) in ints.iter_mut().enumerate() {
                *ints = s.int_splat(x.start[(r0 + r) * count + g]);
            }
        }
        if Q4 {
            // A group's 4-bit products (two per byte of its 16 code bytes: 8 calls) add up
            // narrow and widen once.
            const _: () = assert!(2 * 4 <= NIBBLE_PRODUCTS);
            let mut sums = [s.nibble_zero(); R];
            for q in 0..per / 4 {
                let bytes = s.bytes64(array(codes, 64 * q));
                let (low, high) = (s.low_nibbles(bytes), s.high_nibbles(bytes));
                for (r, sums) in sums.iter_mut().enumerate() {
                    // SAFETY: r < R and g·32 + 16 + 4q + 4 <= k (q < 4), inside the R rows of
                    // `xs`; `[i8; 4]` has i8's alignment.
                    let (lo, hi) = unsafe {
                        let at = xp.add(r * k + g * group + 4 * q);
                        (&*at.cast::<[i8; 4]>(), &*at.add(16).cast::<[i8; 4]>())
                    };
                    *sums = s.nibble_products(*sums, low, s.broadcast4(lo));
                    *sums = s.nibble_products(*sums, high, s.broadcast4(hi));
                }
            }
            for (ints, sums) in ints.iter_mut().zip(sums) {
                *ints = s.nibble_widen(*ints, sums);
            }
        } else {
            for q in 0..per / 4 {
                let bytes = s.bytes64(array(codes, 64 * q));
                if OFFSET {
                    for (r, ints) in ints.iter_mut().enumerate() {
                        // SAFETY: r < R and g·group + 4q + 4 <= k, inside the R rows of `xs`.
                        let four = unsafe { &*xp.add(r * k + g * group + 4 * q).cast::<[i8; 4]>() };
                        *ints = s.dot_unsigned(*ints, bytes, s.broadcast4(four));
                    }
                } else {
                    let signed = s.flip_bytes(bytes);
                    for (r, ints) in ints.iter_mut().enumerate() {
                        // SAFETY: as above.
                        let four = unsafe { &*xp.add(r * k + g * group + 4 * q).cast::<[i8; 4]>() };
                        *ints = s.dot_signed(*ints, signed, s.broadcast4(four));
                    }
                }
            }
        }
        let scale = s.f16(array(&w.scale, at * WIDTH));
        let min = if MIN {
            s.f16(array(&w.min, at * WIDTH))
        } else {
            s.zero()
        };
        for (r, (acc, ints)) in acc.iter_mut().zip(ints).enumerate() {
            let step = s.mul(scale, s.splat(scales[r * count + g]));
            *acc = s.mul_add(s.int_to_float(ints), step, *acc);
            if MIN {
                *acc = s.mul_add(min, s.splat(x.sum[(r0 + r) * count + g]), *acc);
            }
        }
    }
    acc
}

/// Every row of `x` against tiles `tiles` of `w`, writing `out`: [`ROW_BLOCK`] rows at a time,
/// tile by tile, and in each tile rows in blocks of `T`, then what is left in one pass
/// ([`last_pass`]), so a tile's codes are read from memory once for a batch of decoding steps
/// and stay in cache while every row meets them, and a long prompt's rows stay in cache while
/// every tile meets them. With `amx` (granted, see [`crate::cpu::simd::amx`]) rows go by
/// sixteen through AMX's tiles first, while at least [`amx::ROWS`] are left. Each row's sums
/// are the same whatever the batch around it, and whichever path took it.
///
/// # Safety
/// `out.ptr` must point at `x.rows × out.n` writable floats (`out.n` = `w.rows()`), and no
/// other thread may write the columns of those tiles meanwhile; `amx` only where
/// [`crate::cpu::simd::amx::granted`].
#[inline(always)]
pub(super) unsafe fn block<S: Simd, const T: usize>(
    s: S,
    w: &Tiles,
    x: &Inputs,
    tiles: std::ops::Range<usize>,
    amx: bool,
    out: Out,
) {
    // The tiles and their scratch only where rows will take them: zeroing the scratch per
    // task was a cost on every decoding step, whose few rows never do.
    #[cfg(target_arch = "x86_64")]
    let mut tiled = (amx && x.rows >= amx::ROWS).then(|| {
        // SAFETY: the caller vouches the tiles are granted where `amx`.
        (unsafe { amx::configure(w) }, amx::Scratch::new())
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = amx;
    let mut first = 0;
    while first < x.rows {
        let end = (first + ROW_BLOCK).min(x.rows);
        for t in tiles.clone() {
            let mut r0 = first;
            #[cfg(target_arch = "x86_64")]
            if let Some((tiles, scratch)) = tiled.as_mut().filter(|_| end - r0 >= amx::ROWS) {
                while end - r0 >= amx::ROWS {
                    let valid = (end - r0).min(16);
                    // SAFETY: rows r0..r0 + valid lie below x.rows, the codes are padded to
                    // r0 + 16 (r0 is a multiple of 16 below ROW_BLOCK's), the tile is ours.
                    unsafe { amx::run(s, tiles, scratch, w, x, r0, valid, t, out) };
                    r0 += valid;
                }
            }
            while end - r0 > last_pass(T) {
                // SAFETY: the rows lie below x.rows and the tile is the caller's.
                unsafe { run::<S, T>(s, w, x, r0, t, out) };
                r0 += T;
            }
            // SAFETY: the rows r0..end lie below x.rows and the tile is the caller's.
            unsafe { last::<S, T>(s, w, x, r0, end - r0, t, out) };
        }
        first = end;
    }
}

/// The most rows the last pass over a tile takes: what passes of `t` leave, and five where
/// passes take four. A pass decodes the tile's codes once for all its rows, so a decoding step
/// checking four drafts (five rows) takes one pass, not 4 + 1, whose second pass cost about as
/// much as the first (decoding the codes and the chain of sums bound a pass, not the read of
/// weights the first pass brought into the cache).
const fn last_pass(t: usize) -> usize {
    if t == 4 { 5 } else { t - 1 }
}

/// The last `rows` rows from `r0` (at most [`last_pass`]`(T)`) against tile `t`, in one pass.
///
/// # Safety
/// As [`block`], for rows `r0..r0 + rows` and tile `t`.
#[inline(always)]
unsafe fn last<S: Simd, const T: usize>(
    s: S,
    w: &Tiles,
    x: &Inputs,
    r0: usize,
    rows: usize,
    t: usize,
    out: Out,
) {
    const { assert!(last_pass(T) <= 7, "a last pass of more than seven rows") };
    // SAFETY: the rows lie below x.rows and the tile is the caller's.
    unsafe {
        match rows {
            1 => run::<S, 1>(s, w, x, r0, t, out),
            2 => run::<S, 2>(s, w, x, r0, t, out),
            3 => run::<S, 3>(s, w, x, r0, t, out),
            4 => run::<S, 4>(s, w, x, r0, t, out),
            5 => run::<S, 5>(s, w, x, r0, t, out),
            6 => run::<S, 6>(s, w, x, r0, t, out),
            7 => run::<S, 7>(s, w, x, r0, t, out),
            _ => {}
        }
    }
}

/// # Safety
/// As [`block`], for rows `r0..r0 + R` and tile `t`.
#[inline(always)]
unsafe fn run<S: Simd, const R: usize>(s: S, w: &Tiles, x: &Inputs, r0: usize, t: usize, out: Out) {
    let min = !w.min.is_empty();
    let acc = match (w.kind, min) {
        (Kind::Q4 { offset: 0 }, false) => tile_rows::<S, R, true, false, false>(s, w, x, r0, t),
        (Kind::Q4 { offset: 0 }, true) => tile_rows::<S, R, true, true, false>(s, w, x, r0, t),
        (Kind::Q4 { .. }, false) => tile_rows::<S, R, true, false, true>(s, w, x, r0, t),
        (Kind::Q4 { .. }, true) => tile_rows::<S, R, true, true, true>(s, w, x, r0, t),
        (Kind::Q8, false) if S::WIDE_UNSIGNED => {
            tile_rows::<S, R, false, false, true>(s, w, x, r0, t)
        }
        (Kind::Q8, true) if S::WIDE_UNSIGNED => {
            tile_rows::<S, R, false, true, true>(s, w, x, r0, t)
        }
        (Kind::Q8, false) => tile_rows::<S, R, false, false, false>(s, w, x, r0, t),
        (Kind::Q8, true) => tile_rows::<S, R, false, true, false>(s, w, x, r0, t),
    };
    // SAFETY: as the caller's.
    unsafe { store(s, w, &acc, r0, t, out) };
}

/// Writes `acc` (row `r0 + r` in `acc[r]`) into tile `t`'s columns of `out`.
///
/// # Safety
/// The caller owns tile `t`'s columns of rows `r0..r0 + acc.len()` of `out`.
#[inline(always)]
unsafe fn store<S: Simd>(s: S, w: &Tiles, acc: &[S::V], r0: usize, t: usize, out: Out) {
    let (first, count) = (t * WIDTH, (w.rows - t * WIDTH).min(WIDTH));
    for (r, &acc) in acc.iter().enumerate() {
        // SAFETY: the caller owns columns first..first + count of rows r0..r0 + R.
        let dst = unsafe { out.ptr.add((r0 + r) * out.n + first) };
        if count == WIDTH {
            // SAFETY: as above, all sixteen of them; `[f32; 16]` has f32's alignment.
            s.store(acc, unsafe { &mut *dst.cast::<[f32; WIDTH]>() });
        } else {
            let mut lanes = [0f32; WIDTH];
            s.store(acc, &mut lanes);
            // SAFETY: as above; `lanes` is a local array, never overlapping `out`.
            unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, count) };
        }
    }
}
