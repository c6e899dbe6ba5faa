//! The weight layouts as the kernels read them: sixteen values of one row at a time, decoded
//! and scaled in registers, so one loop ([`super::tile`]) serves every precision.

use crate::cpu::simd::Simd;
use crate::model::packed::{Codes, Groups, Packed, Q4_GROUP};

/// A matrix the kernels read sixteen values at a time.
pub(super) trait Rows: Sync {
    /// Values `16·g .. 16·g + 16` of row `row`.
    fn load16<S: Simd>(&self, s: S, row: usize, g: usize) -> S::V;
    /// Value `i` of row `row`: the tail past the last whole sixteen (only float layouts have
    /// one; quantized rows are whole groups).
    fn value(&self, row: usize, i: usize) -> f32;
}

/// `N` items of `v` from `at` as an array (the callers' shapes keep it in bounds).
#[inline(always)]
pub(super) fn array<T, const N: usize>(v: &[T], at: usize) -> &[T; N] {
    match v[at..at + N].try_into() {
        Ok(a) => a,
        Err(_) => unreachable!("a slice of N items is an array of N"),
    }
}

/// f32 rows.
pub(super) struct F32Rows<'a> {
    pub data: &'a [f32],
    pub cols: usize,
}

impl Rows for F32Rows<'_> {
    #[inline(always)]
    fn load16<S: Simd>(&self, s: S, row: usize, g: usize) -> S::V {
        s.load(array(self.data, row * self.cols + 16 * g))
    }

    fn value(&self, row: usize, i: usize) -> f32 {
        self.data[row * self.cols + i]
    }
}

/// 16-bit float rows (bfloat16 or IEEE half).
pub(super) struct HalfRows<'a, const BF16: bool> {
    pub data: &'a [u16],
    pub cols: usize,
}

impl<const BF16: bool> Rows for HalfRows<'_, BF16> {
    #[inline(always)]
    fn load16<S: Simd>(&self, s: S, row: usize, g: usize) -> S::V {
        let bits = array(self.data, row * self.cols + 16 * g);
        if BF16 { s.bf16(bits) } else { s.f16(bits) }
    }

    fn value(&self, row: usize, i: usize) -> f32 {
        let bits = self.data[row * self.cols + i];
        if BF16 {
            half::bf16::from_bits(bits).to_f32()
        } else {
            half::f16::from_bits(bits).to_f32()
        }
    }
}

/// 4-bit codes in groups of 32.
pub(super) struct Q4Rows<'a> {
    pub offset: i32,
    pub groups: &'a Groups<u8>,
    /// Groups of 32 per row.
    pub per_row: usize,
}

impl Rows for Q4Rows<'_> {
    #[inline(always)]
    fn load16<S: Simd>(&self, s: S, row: usize, g: usize) -> S::V {
        let at = row * self.per_row + g / 2;
        let bytes = array(&self.groups.codes, 16 * at);
        let codes = s.nibbles(bytes, 4 * (g & 1) as u32, self.offset);
        let (scale, min) = (self.groups.scale[at], self.groups.min_at(at));
        s.mul_then_add(codes, s.splat(scale), s.splat(min))
    }

    fn value(&self, row: usize, i: usize) -> f32 {
        let at = row * self.per_row + i / 32;
        let byte = self.groups.codes[16 * at + i % 16];
        let code = (i32::from(byte) >> (4 * ((i % 32) / 16))) & 15;
        (code - self.offset) as f32 * self.groups.scale[at] + self.groups.min_at(at)
    }
}

/// Signed 8-bit codes in groups of 16 or 32.
pub(super) struct Q8Rows<'a> {
    /// log2 of the group size over 16 (0 for groups of 16, 1 for 32).
    pub shift: u32,
    pub groups: &'a Groups<i8>,
    pub cols: usize,
}

impl Rows for Q8Rows<'_> {
    #[inline(always)]
    fn load16<S: Simd>(&self, s: S, row: usize, g: usize) -> S::V {
        let at = row * self.cols + 16 * g;
        let group = at >> (4 + self.shift);
        let codes = s.bytes(array(&self.groups.codes, at));
        let (scale, min) = (self.groups.scale[group], self.groups.min_at(group));
        s.mul_then_add(codes, s.splat(scale), s.splat(min))
    }

    fn value(&self, row: usize, i: usize) -> f32 {
        let at = row * self.cols + i;
        let group = at >> (4 + self.shift);
        f32::from(self.groups.codes[at]) * self.groups.scale[group] + self.groups.min_at(group)
    }
}

/// A packed matrix, borrowed as the kernels read it.
pub(super) enum View<'a> {
    F32(F32Rows<'a>),
    Bf16(HalfRows<'a, true>),
    F16(HalfRows<'a, false>),
    Q4(Q4Rows<'a>),
    Q8(Q8Rows<'a>),
}

impl<'a> View<'a> {
    /// The view of `w`.
    pub(super) fn of(w: &'a Packed) -> Self {
        let cols = w.cols;
        match &w.codes {
            Codes::F32(data) => Self::F32(F32Rows { data, cols }),
            Codes::Bf16(data) => Self::Bf16(HalfRows { data, cols }),
            Codes::F16(data) => Self::F16(HalfRows { data, cols }),
            Codes::Q4 { offset, groups } => Self::Q4(Q4Rows {
                offset: i32::from(*offset),
                groups,
                per_row: cols / Q4_GROUP,
            }),
            Codes::Q8 { group, groups } => Self::Q8(Q8Rows {
                shift: if *group == 32 { 1 } else { 0 },
                groups,
                cols,
            }),
        }
    }
}
