//! Products of 4- and 8-bit weights with 8-bit inputs, as ggml multiplies its
//! quantized types: each input row is rounded once per product to signed bytes in the weights'
//! groups (one f32 scale per group, [`Inputs`]), and four weight bytes meet four input bytes in
//! one i32 lane ([`Simd::dot_unsigned`], [`Simd::dot_signed`]): four times the products per
//! instruction of the float path, and codes are never turned into floats.
//!
//! The weights are laid out once, at load, for this loop ([`Tiles`], `layout`): sixteen output
//! columns side by side, each i32 lane one column, so a register of codes meets four input
//! bytes broadcast to every lane, the sums need no horizontal reduction, and the float work
//! (scales, minimums) is done once per group of 16 columns × 32 values per input row. 8-bit
//! codes that fit in six bits (Q6_K's and the 2-, 3- and 5-bit types' widened codes) are held
//! so, and joined back into bytes in registers: a decoding step reads their codes in 6 bits a
//! value, not 8.
//!
//! The cost is the inputs' rounding: each input moves by at most half a step of its group
//! (the group's largest magnitude / 254), well under the weights' own quantization error.
//! Scales and minimums are held as the file holds them ([`scales`]): the K-quants' as a byte
//! per group times a half per 256 values, exactly, and the others' as IEEE halves, exactly
//! the file's where it ships halves (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and otherwise
//! within 1/2048 of them, an eighth of the inputs' rounding (a matrix with a scale outside the
//! halves' normal range keeps f32 inputs instead). A decoding step reads them beside the
//! codes, so at 4 bits they were a third of its bytes as f32, and a tenth as halves.
//! [`super::Activations::Exact`] keeps f32 inputs where bit-for-bit agreement with a reference
//! matters.

use super::rows::array;
use super::tile::Out;
use crate::cpu::simd::{NIBBLE_PRODUCTS, Simd};

#[cfg(target_arch = "x86_64")]
mod amx;
mod inputs;
mod layout;
mod scales;

pub(super) use inputs::Inputs;
use layout::Kind;
pub(super) use layout::Tiles;

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

/// Asks for `len` bytes of `codes` from `at` to be brought into the cache. Lines past the
/// end are asked for too: a prefetch never faults, and bounding the range cost more than the
/// lines (a few of the last tile's) it spared.
#[inline(always)]
fn prefetch(codes: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let first = codes.as_ptr().wrapping_add(at);
        let mut line = 0;
        while line < len {
            // SAFETY: a prefetch reads nothing and cannot fault, whatever the address; the
            // address is made without `add`'s promise to stay inside the slice.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    first.wrapping_add(line).cast(),
                )
            };
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (codes, at, len);
}

/// Rows `r0..r0 + R` of `x` against tile `t` of `w`: sixteen columns per row.
#[inline(always)]
fn tile_rows<S: Simd, const R: usize, const BITS: u32, const MIN: bool, const OFFSET: bool>(
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
    let weight_scales = w.scale.tile(t, count);
    let weight_mins = w.min.as_ref().filter(|_| MIN).map(|m| m.tile(t, count));
    let size = WIDTH * per;
    let tile_codes = &w.codes[t * count * size..(t + 1) * count * size];
    let mut acc = [s.zero(); R];
    for (g, codes) in tile_codes.chunks_exact(size).enumerate() {
        prefetch(&w.codes, (t * count + g + AHEAD) * size, size);
        let mut ints = [s.int_zero(); R];
        if OFFSET {
            let starts = x.group::<i32, R>(&x.start, g, r0);
            for (ints, &start) in ints.iter_mut().zip(starts) {
                *ints = s.int_splat(start);
            }
        }
        if BITS == 4 {
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
        } else if BITS == 6 {
            // Nibble block q holds values 4q.. (low) and group / 2 + 4q.. (high) of each
            // column; their top bits are in block group / 8 + q % (group / 16), walked as
            // two rounds of group / 16 blocks: a `%` by a number known only at run time was
            // a division per block.
            let (half, blocks) = (group / 2, group / 16);
            for round in 0..2 {
                for top in 0..blocks {
                    let q = round * blocks + top;
                    let (low, high) = six_bit_block(s, codes, group, q, top);
                    for (r, ints) in ints.iter_mut().enumerate() {
                        // SAFETY: r < R and g·group + group / 2 + 4q + 4 <= (g + 1)·group
                        // (q < group / 8), inside the R rows of `xs`; `[i8; 4]` has i8's
                        // alignment.
                        let (lo, hi) = unsafe {
                            let at = xp.add(r * k + g * group + 4 * q);
                            (&*at.cast::<[i8; 4]>(), &*at.add(half).cast::<[i8; 4]>())
                        };
                        *ints = s.dot_unsigned(*ints, low, s.broadcast4(lo));
                        *ints = s.dot_unsigned(*ints, high, s.broadcast4(hi));
                    }
                }
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
        let scale = weight_scales.get(s, g);
        // A match, not a closure: closures do not take the instruction set's features.
        let min = match weight_mins {
            Some(m) => m.get(s, g),
            None => s.zero(),
        };
        let steps = x.group::<f32, R>(&x.scale, g, r0);
        for (r, (acc, ints)) in acc.iter_mut().zip(ints).enumerate() {
            let step = s.mul(scale, s.splat(steps[r]));
            *acc = s.mul_add(s.int_to_float(ints), step, *acc);
            if MIN {
                let sums = x.group::<f32, R>(&x.sum, g, r0);
                *acc = s.mul_add(min, s.splat(sums[r]), *acc);
            }
        }
    }
    acc
}

/// Nibble block `q` of a [`Kind::Q6`] group's codes (`codes`, its 16 columns) as two blocks
/// of 6-bit codes: values `4q..4q + 4` and `group / 2 + 4q..` of each column; `top` is
/// `q % (group / 16)`, which block of top bits holds theirs.
#[inline(always)]
fn six_bit_block<S: Simd>(s: S, codes: &[u8], group: usize, q: usize, top: usize) -> (S::B, S::B) {
    let bytes = s.bytes64(array(codes, 64 * q));
    let (low, high) = (s.low_nibbles(bytes), s.high_nibbles(bytes));
    let top = s.bytes64(array(codes, 64 * (group / 8 + top)));
    if 4 * q < group / 4 {
        (s.six_bits::<0>(low, top), s.six_bits::<4>(high, top))
    } else {
        (s.six_bits::<2>(low, top), s.six_bits::<6>(high, top))
    }
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
    let min = w.min.is_some();
    let acc = match (w.kind, min) {
        (Kind::Q4 { offset: 0 }, false) => tile_rows::<S, R, 4, false, false>(s, w, x, r0, t),
        (Kind::Q4 { offset: 0 }, true) => tile_rows::<S, R, 4, true, false>(s, w, x, r0, t),
        (Kind::Q4 { .. }, false) => tile_rows::<S, R, 4, false, true>(s, w, x, r0, t),
        (Kind::Q4 { .. }, true) => tile_rows::<S, R, 4, true, true>(s, w, x, r0, t),
        (Kind::Q6, false) => tile_rows::<S, R, 6, false, true>(s, w, x, r0, t),
        (Kind::Q6, true) => tile_rows::<S, R, 6, true, true>(s, w, x, r0, t),
        (Kind::Q8, false) if S::WIDE_UNSIGNED => tile_rows::<S, R, 8, false, true>(s, w, x, r0, t),
        (Kind::Q8, true) if S::WIDE_UNSIGNED => tile_rows::<S, R, 8, true, true>(s, w, x, r0, t),
        (Kind::Q8, false) => tile_rows::<S, R, 8, false, false>(s, w, x, r0, t),
        (Kind::Q8, true) => tile_rows::<S, R, 8, true, false>(s, w, x, r0, t),
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
