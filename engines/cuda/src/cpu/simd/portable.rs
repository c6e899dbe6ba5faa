//! Sixteen lanes as a plain array: what any target runs, with separate multiplies and adds
//! (without FMA, a fused multiply-add would be a library call).

use half::{bf16, f16};

use super::Simd;

/// The portable lanes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Portable;

impl Simd for Portable {
    type V = [f32; 16];

    #[inline(always)]
    fn zero(self) -> [f32; 16] {
        [0.0; 16]
    }

    #[inline(always)]
    fn splat(self, v: f32) -> [f32; 16] {
        [v; 16]
    }

    #[inline(always)]
    fn load(self, src: &[f32; 16]) -> [f32; 16] {
        *src
    }

    #[inline(always)]
    fn store(self, v: [f32; 16], dst: &mut [f32; 16]) {
        *dst = v;
    }

    #[inline(always)]
    fn add(self, a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|i| a[i] + b[i])
    }

    #[inline(always)]
    fn mul_add(self, a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        self.mul_then_add(a, b, c)
    }

    #[inline(always)]
    fn mul_then_add(self, a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }

    #[inline(always)]
    fn sum(self, v: [f32; 16]) -> f32 {
        let h: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
        ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]))
    }

    #[inline(always)]
    fn nibbles(self, bytes: &[u8; 16], shift: u32, offset: i32) -> [f32; 16] {
        std::array::from_fn(|i| (((i32::from(bytes[i]) >> shift) & 15) - offset) as f32)
    }

    #[inline(always)]
    fn bytes(self, codes: &[i8; 16]) -> [f32; 16] {
        std::array::from_fn(|i| f32::from(codes[i]))
    }

    #[inline(always)]
    fn bf16(self, bits: &[u16; 16]) -> [f32; 16] {
        std::array::from_fn(|i| bf16::from_bits(bits[i]).to_f32())
    }

    #[inline(always)]
    fn f16(self, bits: &[u16; 16]) -> [f32; 16] {
        std::array::from_fn(|i| f16::from_bits(bits[i]).to_f32())
    }

    type B = [u8; 64];
    type I = [i32; 16];

    #[inline(always)]
    fn bytes64(self, src: &[u8; 64]) -> [u8; 64] {
        *src
    }

    #[inline(always)]
    fn low_nibbles(self, b: [u8; 64]) -> [u8; 64] {
        b.map(|b| b & 15)
    }

    #[inline(always)]
    fn high_nibbles(self, b: [u8; 64]) -> [u8; 64] {
        b.map(|b| b >> 4)
    }

    #[inline(always)]
    fn six_bits<const SHIFT: u32>(self, nibbles: [u8; 64], high: [u8; 64]) -> [u8; 64] {
        std::array::from_fn(|i| nibbles[i] | ((high[i] >> SHIFT) & 3) << 4)
    }

    const WIDE_UNSIGNED: bool = true;

    #[inline(always)]
    fn flip_bytes(self, b: [u8; 64]) -> [u8; 64] {
        b.map(|b| b ^ 0x80)
    }

    #[inline(always)]
    fn dot_unsigned(self, acc: [i32; 16], u: [u8; 64], s: [u8; 64]) -> [i32; 16] {
        dot_lanes(acc, u, s, i32::from)
    }

    #[inline(always)]
    fn dot_signed(self, acc: [i32; 16], a: [u8; 64], b: [u8; 64]) -> [i32; 16] {
        dot_lanes(acc, a, b, |x| i32::from(x as i8))
    }

    #[inline(always)]
    fn int_zero(self) -> [i32; 16] {
        [0; 16]
    }

    #[inline(always)]
    fn int_to_float(self, v: [i32; 16]) -> [f32; 16] {
        v.map(|v| v as f32)
    }

    #[inline(always)]
    fn mul(self, a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|i| a[i] * b[i])
    }

    #[inline(always)]
    fn int_splat(self, v: i32) -> [i32; 16] {
        [v; 16]
    }

    #[inline(always)]
    fn broadcast4(self, v: &[i8; 4]) -> [u8; 64] {
        std::array::from_fn(|i| v[i % 4] as u8)
    }

    #[inline(always)]
    fn store_bytes(self, b: [u8; 64], dst: &mut [u8; 64]) {
        *dst = b;
    }

    #[inline(always)]
    fn int_load(self, src: &[i32; 16]) -> [i32; 16] {
        *src
    }

    #[inline(always)]
    fn int_add(self, a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        std::array::from_fn(|i| a[i].wrapping_add(b[i]))
    }

    // Products widen to i32 as cheaply as they are made: the partial sums are the sums.
    type P = [i32; 16];

    #[inline(always)]
    fn nibble_zero(self) -> [i32; 16] {
        [0; 16]
    }

    #[inline(always)]
    fn nibble_products(self, p: [i32; 16], u: Self::B, s: Self::B) -> [i32; 16] {
        self.dot_unsigned(p, u, s)
    }

    #[inline(always)]
    fn nibble_widen(self, acc: [i32; 16], p: [i32; 16]) -> [i32; 16] {
        self.int_add(acc, p)
    }
}

/// `acc` plus, in lane `i`, the products of bytes `4i..4i + 4` of `a` (read by `first`) and
/// `b` (signed).
#[inline(always)]
fn dot_lanes(mut acc: [i32; 16], a: [u8; 64], b: [u8; 64], first: fn(u8) -> i32) -> [i32; 16] {
    for (i, o) in acc.iter_mut().enumerate() {
        for j in 4 * i..4 * i + 4 {
            *o += first(a[j]) * i32::from(b[j] as i8);
        }
    }
    acc
}
