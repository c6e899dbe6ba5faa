//! The byte kernels' layout of a weight matrix ([`Tiles`]): codes of 16 output columns side
//! by side, group by group, with their scales and minimums ([`Scales`]), made once at load.

use super::WIDTH;
use super::inputs::Inputs;
use super::scales::Scales;
use crate::model::packed::{Codes, Groups, Packed};

/// What the codes stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// 4-bit codes, `code - offset`, in groups of 32; byte `j` of a group holds value `j` in
    /// its low nibble and `j + 16` in its high one.
    Q4 { offset: i32 },
    /// 6-bit codes held as `code + 32` (0..=63), for 8-bit codes that all lie in -32..=31
    /// (Q6_K's, and those of the 3- and 5-bit types widened to bytes): per group, `group / 2`
    /// bytes of low nibbles (byte `j`: value `j` low, `j + group / 2` high), then `group / 4`
    /// bytes of top bits (byte `j`: values `j`, `j + group / 4`, `j + group / 2` and
    /// `j + 3·group / 4` at bits 0, 2, 4 and 6). With a half scale per 16 values that is
    /// 7 bits a value where bytes took 9: a Llama 3.2 1B Q4_K_M file's decoding step reads
    /// a tenth fewer bytes. The sums are the 8-bit layout's, integer for integer.
    Q6,
    /// Signed 8-bit codes, held as unsigned `code + 128`: where
    /// [`crate::cpu::simd::Simd::WIDE_UNSIGNED`] they meet the signed inputs as they are (the
    /// inputs' sums times 128 taken off once per group), one instruction per four bytes where
    /// signed codes took three; elsewhere each register of codes is flipped back once for all
    /// rows.
    Q8,
}

/// A 4-, 6- or 8-bit matrix laid out for the byte kernels: tiles of 16 rows (output columns),
/// and in each tile, group by group, blocks of 64 bytes holding four code bytes of each of the
/// 16 rows (block `q`: bytes `4q..4q + 4` of each row's group, row after row); beside them
/// each group's 16 scales and minimums.
#[derive(Debug)]
pub(in crate::cpu::matmul) struct Tiles {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) group: usize,
    pub(super) kind: Kind,
    pub(super) codes: Vec<u8>,
    pub(super) scale: Scales,
    /// `None` where the weights have no minimum.
    pub(super) min: Option<Scales>,
}

impl Tiles {
    /// `w` laid out in tiles, or `None` for float layouts and for a scale or minimum outside
    /// the halves' normal range.
    pub(in crate::cpu::matmul) fn new(w: &Packed) -> Option<Self> {
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
            Codes::Q8 { group, groups } if six_bits_hold(*group, &groups.codes) => {
                let codes = six_bit_codes(*group, &groups.codes);
                Self::build(w, *group, Kind::Q6, &codes, groups)
            }
            Codes::Q8 { .. } => Self::eight_bit(w),
            _ => None,
        }
    }

    /// `w`'s 8-bit codes in the 8-bit layout, even where they fit in 6 bits (tests compare
    /// the two).
    pub(in crate::cpu::matmul) fn eight_bit(w: &Packed) -> Option<Self> {
        let Codes::Q8 { group, groups } = &w.codes else {
            return None;
        };
        let codes: Vec<u8> = groups.codes.iter().map(|&c| c as u8 ^ 0x80).collect();
        Self::build(w, *group, Kind::Q8, &codes, groups)
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
        let min = match groups.min.is_empty() {
            true => None,
            false => Some(Scales::new(&groups.min, w.rows, count, group)?),
        };
        let mut out = Self {
            rows: w.rows,
            cols: w.cols,
            group,
            kind,
            codes: vec![0; w.rows.div_ceil(WIDTH) * count * WIDTH * per],
            scale: Scales::new(&groups.scale, w.rows, count, group)?,
            min,
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
            }
        }
        Some(out)
    }

    /// Code bytes per row per group.
    pub(super) fn bytes_per(kind: Kind, group: usize) -> usize {
        match kind {
            Kind::Q4 { .. } => group / 2,
            Kind::Q6 => group / 4 * 3,
            Kind::Q8 => group,
        }
    }

    /// Output columns.
    pub(in crate::cpu::matmul) fn rows(&self) -> usize {
        self.rows
    }

    /// What rounding `x` to bytes leaves out: `x` minus its rounded value, element by element
    /// (multiplied in a second pass, it makes the product nearly exact; see
    /// [`crate::cpu::matmul::SecondPass`]).
    pub(in crate::cpu::matmul) fn residual(&self, x: &[f32]) -> Vec<f32> {
        let inputs = Inputs::quantize(x, self.cols, self.group, 0, false);
        let count = self.cols / self.group;
        x.chunks_exact(self.group)
            .zip(inputs.codes.chunks_exact(self.group))
            .enumerate()
            .flat_map(|(at, (values, codes))| {
                let step = inputs.scale[inputs.slot(at / count, at % count)];
                values
                    .iter()
                    .zip(codes)
                    .map(move |(v, &c)| v - f32::from(c) * step)
            })
            .collect()
    }

    /// Bytes the tiles take in memory.
    pub(in crate::cpu::matmul) fn bytes(&self) -> usize {
        self.codes.len() + self.scale.bytes() + self.min.as_ref().map_or(0, Scales::bytes)
    }

    /// Input rows rounded for these weights.
    pub(in crate::cpu::matmul) fn inputs(&self, x: &[f32]) -> Inputs {
        let offset = match self.kind {
            Kind::Q4 { offset } => offset,
            Kind::Q6 => i32::from(SIX_BIT_OFFSET),
            Kind::Q8 => 128,
        };
        Inputs::quantize(x, self.cols, self.group, offset, self.min.is_some())
    }
}

/// What [`Kind::Q6`] adds to a code to hold it unsigned (and what its inputs' sums are
/// multiplied by to take it off).
const SIX_BIT_OFFSET: i8 = 32;

/// Whether 8-bit codes in groups of `group` take the 6-bit layout ([`Kind::Q6`]): every code
/// within -32..=31, and groups of 16 or 32 (AMX takes a group's codes in at most 8 rows).
fn six_bits_hold(group: usize, codes: &[i8]) -> bool {
    matches!(group, 16 | 32)
        && codes
            .iter()
            .all(|c| (-SIX_BIT_OFFSET..SIX_BIT_OFFSET).contains(c))
}

/// Codes in -32..=31 as [`Kind::Q6`] holds them, group by group, before tiling.
fn six_bit_codes(group: usize, codes: &[i8]) -> Vec<u8> {
    let (half, quarter) = (group / 2, group / 4);
    let mut out = Vec::with_capacity(codes.len() / 4 * 3);
    for g in codes.chunks_exact(group) {
        let code = |j: usize| (g[j] + SIX_BIT_OFFSET) as u8;
        out.extend((0..half).map(|j| code(j) & 15 | (code(j + half) & 15) << 4));
        out.extend(
            (0..quarter)
                .map(|j| (0..4).fold(0, |b, i| b | (code(j + i * quarter) >> 4) << (2 * i))),
        );
    }
    out
}
