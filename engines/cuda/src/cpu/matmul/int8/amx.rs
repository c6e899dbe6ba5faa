//! Byte products on AMX tiles, sixteen input rows at a time ([`crate::cpu::simd::amx`]): one
//! tile instruction gives a group's i32 sums for 16 rows × 16 columns, the same integers the
//! lanes' kernel ([`super::tile_rows`]) adds up with 128 VNNI instructions, and the float work
//! after them is the same operations in the same order. So each row's result is bit for bit
//! the lanes' kernel's, and a row may take either path: a prompt's rows go by sixteen here,
//! a decoding step's few through the lanes, and a prefix-cache hit that recomputes one row
//! still gets the whole prompt's logits.
//!
//! The weights need no second layout: the tiles' blocks of 64 bytes (four codes of each of
//! 16 columns) are the rows of AMX's code operand as they are for 8-bit codes, and a block of
//! 4-bit codes is split into two such rows (low and high nibbles), one of 6-bit codes joined
//! with its top bits into two, each time a tile of rows meets it. What is left to the lanes is the float work per group (a conversion and two
//! multiply-adds per row), which bounds the loop: four groups' tile instructions are issued
//! before the previous four groups' sums are read back and scaled, so the tiles' stores have
//! landed by then.

use super::super::rows::array;
use super::super::tile::Out;
use super::scales::TileScales;
use super::{AHEAD, Inputs, Kind, Tiles, WIDTH, prefetch, six_bit_block, store};
use crate::cpu::simd::Simd;
use crate::cpu::simd::amx::{Configured, Operands, Shapes};

/// Rows from which the tiles are worth their fixed cost (they multiply and scale 16 rows
/// whatever the count): below it the lanes' kernel takes them.
pub(super) const ROWS: usize = 16;

/// Groups whose tile instructions are issued together.
const BATCH: usize = 4;

/// 64-byte aligned storage (a tile row is a cache line).
#[repr(C, align(64))]
struct Lines<T>(T);

/// Two batches' sums and split 4-bit codes, reused by every tile of rows a task takes.
pub(super) struct Scratch {
    sums: [Lines<[[[i32; 16]; 16]; BATCH]>; 2],
    codes: [Lines<[[[u8; 64]; 8]; BATCH]>; 2],
}

impl Scratch {
    /// Zeroed (every byte is written before it is read).
    pub(super) fn new() -> Self {
        Self {
            sums: [Lines([[[0; 16]; 16]; BATCH]), Lines([[[0; 16]; 16]; BATCH])],
            codes: [Lines([[[0; 64]; 8]; BATCH]), Lines([[[0; 64]; 8]; BATCH])],
        }
    }
}

/// This thread's tiles shaped for `w`'s groups.
///
/// # Safety
/// [`crate::cpu::simd::amx::granted`] must have returned true.
pub(super) unsafe fn configure(w: &Tiles) -> Configured {
    // SAFETY: as the caller's.
    unsafe { Configured::new(&Shapes::new(w.group)) }
}

/// Rows `r0..r0 + valid` (`valid <= 16`) of `x` against tile `t` of `w`, written to `out`.
///
/// # Safety
/// As [`super::block`]'s, for those rows and that tile; `x`'s codes, steps and sums must
/// hold rows up to `r0 + 16` (they are padded so).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run<S: Simd>(
    s: S,
    tiles: &Configured,
    scratch: &mut Scratch,
    w: &Tiles,
    x: &Inputs,
    r0: usize,
    valid: usize,
    t: usize,
    out: Out,
) {
    let min = w.min.is_some();
    // SAFETY: as the caller's.
    let acc = unsafe {
        match (w.kind, min) {
            (Kind::Q4 { offset: 0 }, false) => {
                rows::<S, 4, false, false>(s, tiles, scratch, w, x, r0, t)
            }
            (Kind::Q4 { offset: 0 }, true) => {
                rows::<S, 4, true, false>(s, tiles, scratch, w, x, r0, t)
            }
            (Kind::Q4 { .. }, false) => rows::<S, 4, false, true>(s, tiles, scratch, w, x, r0, t),
            (Kind::Q4 { .. }, true) => rows::<S, 4, true, true>(s, tiles, scratch, w, x, r0, t),
            // Codes held as `code + 32` and `code + 128`: the inputs' sums times 32 or 128
            // taken off, as the lanes' kernel does where its byte products are unsigned ×
            // signed.
            (Kind::Q6, false) => rows::<S, 6, false, true>(s, tiles, scratch, w, x, r0, t),
            (Kind::Q6, true) => rows::<S, 6, true, true>(s, tiles, scratch, w, x, r0, t),
            (Kind::Q8, false) => rows::<S, 8, false, true>(s, tiles, scratch, w, x, r0, t),
            (Kind::Q8, true) => rows::<S, 8, true, true>(s, tiles, scratch, w, x, r0, t),
        }
    };
    // SAFETY: as the caller's.
    unsafe { store(s, w, &acc[..valid], r0, t, out) };
}

/// What one tile of rows reads, fetched once (after each tile instruction, assembly the
/// compiler must assume writes anywhere, fields behind references would be read again).
struct Tile<'a> {
    /// Input bytes per group.
    group: usize,
    /// Code bytes per group of the tile's 16 columns.
    size: usize,
    /// Tile `t`'s codes, scales and minimums (no minimums unless `MIN`).
    codes: &'a [u8],
    scale: TileScales<'a>,
    min: Option<TileScales<'a>>,
    /// Rows r0..r0 + 16's inputs; steps, offset sums (empty unless `OFFSET`) and sums
    /// (empty unless `MIN`) from row r0's, group `g`'s `stride` entries later than group 0's.
    inputs: &'a [i8],
    stride: usize,
    step: &'a [f32],
    start: &'a [i32],
    sum: &'a [f32],
}

/// The sixteen rows' sums for tile `t`, four groups at a time.
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn rows<S: Simd, const BITS: u32, const MIN: bool, const OFFSET: bool>(
    s: S,
    tiles: &Configured,
    scratch: &mut Scratch,
    w: &Tiles,
    x: &Inputs,
    r0: usize,
    t: usize,
) -> [S::V; 16] {
    let (k, group) = (w.cols, w.group);
    let count = k / group;
    let per = Tiles::bytes_per(w.kind, group);
    let (first, last) = (t * count * WIDTH, (t + 1) * count * WIDTH);
    let o = Tile {
        group,
        size: per * WIDTH,
        codes: &w.codes[first * per..last * per],
        scale: w.scale.tile(t, count),
        min: w.min.as_ref().filter(|_| MIN).map(|m| m.tile(t, count)),
        inputs: &x.codes[r0 * k..(r0 + 16) * k],
        stride: x.stride(),
        step: &x.scale[r0..],
        start: if OFFSET { &x.start[r0..] } else { &[] },
        sum: if MIN { &x.sum[r0..] } else { &[] },
    };
    let mut acc = [s.zero(); 16];
    let whole = count / BATCH;
    let Scratch { sums, codes } = scratch;
    let [codes0, codes1] = codes;
    // Batch b + 1's tile instructions go before batch b's sums are read, and batch b + 2's
    // 4-bit codes are split then, a batch before the tiles load them (stores just made
    // reach a tile load late).
    let mut groups = [[Operands::EMPTY; BATCH]; 2];
    if whole > 0 {
        groups[0] = split::<S, BITS>(s, &o, 0, &mut codes0.0);
    }
    if whole > 1 {
        groups[1] = split::<S, BITS>(s, &o, BATCH, &mut codes1.0);
    }
    if whole > 0 {
        // SAFETY: as the caller's; the batch's groups are below `count`.
        unsafe { tiles.sums4(groups[0], k, &mut sums[0].0) };
    }
    for b in 0..whole {
        let (now, next) = (b % 2, (b + 1) % 2);
        if b + 1 < whole {
            prefetch(
                w.codes.as_slice(),
                (first + ((b + 2) * BATCH + AHEAD) * WIDTH) * per,
                BATCH * WIDTH * per,
            );
            // SAFETY: as above.
            unsafe { tiles.sums4(groups[next], k, &mut sums[next].0) };
        }
        if b + 2 < whole {
            let codes = if now == 0 {
                &mut codes0.0
            } else {
                &mut codes1.0
            };
            groups[now] = split::<S, BITS>(s, &o, (b + 2) * BATCH, codes);
        }
        for (i, sums) in sums[now].0.iter().enumerate() {
            scale_in::<S, MIN, OFFSET>(s, &o, b * BATCH + i, sums, &mut acc);
        }
    }
    for g in whole * BATCH..count {
        let operands = operands::<S, BITS>(s, &o, g, &mut codes0.0[0]);
        // SAFETY: as the caller's; g < count.
        unsafe { tiles.sums1(operands, k, &mut sums[0].0[0]) };
        scale_in::<S, MIN, OFFSET>(s, &o, g, &sums[0].0[0], &mut acc);
    }
    acc
}

/// Groups `g..g + BATCH`'s operands, their 4- and 6-bit codes split into `codes`.
#[inline(always)]
fn split<S: Simd, const BITS: u32>(
    s: S,
    o: &Tile,
    g: usize,
    codes: &mut [[[u8; 64]; 8]; BATCH],
) -> [Operands; BATCH] {
    let [c0, c1, c2, c3] = codes;
    [
        operands::<S, BITS>(s, o, g, c0),
        operands::<S, BITS>(s, o, g + 1, c1),
        operands::<S, BITS>(s, o, g + 2, c2),
        operands::<S, BITS>(s, o, g + 3, c3),
    ]
}

/// Group `g`'s operands, its 4- and 6-bit codes split into bytes in `split`.
#[inline(always)]
fn operands<S: Simd, const BITS: u32>(
    s: S,
    o: &Tile,
    g: usize,
    split: &mut [[u8; 64]; 8],
) -> Operands {
    let codes = &o.codes[g * o.size..(g + 1) * o.size];
    let codes = if BITS == 6 {
        // As for 4-bit codes, rows q and group / 8 + q.
        let blocks = o.group / 16;
        for round in 0..2 {
            for top in 0..blocks {
                let q = round * blocks + top;
                let (low, high) = six_bit_block(s, codes, o.group, q, top);
                s.store_bytes(low, &mut split[q]);
                s.store_bytes(high, &mut split[o.group / 8 + q]);
            }
        }
        split.as_ptr().cast::<u8>()
    } else if BITS == 4 {
        // Block q's low nibbles are values 4q..4q + 4 of each column, its high ones
        // 16 + 4q..: rows q and 4 + q of the code operand.
        for q in 0..4 {
            let bytes = s.bytes64(array(codes, 64 * q));
            s.store_bytes(s.low_nibbles(bytes), &mut split[q]);
            s.store_bytes(s.high_nibbles(bytes), &mut split[4 + q]);
        }
        split.as_ptr().cast::<u8>()
    } else {
        codes.as_ptr()
    };
    Operands {
        inputs: o.inputs[g * o.group..].as_ptr(),
        codes,
    }
}

/// Group `g`'s `sums` scaled into `acc` as the lanes' kernel scales them.
#[inline(always)]
fn scale_in<S: Simd, const MIN: bool, const OFFSET: bool>(
    s: S,
    o: &Tile,
    g: usize,
    sums: &[[i32; 16]; 16],
    acc: &mut [S::V; 16],
) {
    let scale = o.scale.get(s, g);
    // A match, not a closure: closures do not take the instruction set's features.
    let min = match o.min {
        Some(m) => m.get(s, g),
        None => s.zero(),
    };
    for (r, acc) in acc.iter_mut().enumerate() {
        let at = g * o.stride + r;
        let mut ints = s.int_load(&sums[r]);
        if OFFSET {
            ints = s.int_add(ints, s.int_splat(o.start[at]));
        }
        let step = s.mul(scale, s.splat(o.step[at]));
        *acc = s.mul_add(s.int_to_float(ints), step, *acc);
        if MIN {
            *acc = s.mul_add(min, s.splat(o.sum[at]), *acc);
        }
    }
}
