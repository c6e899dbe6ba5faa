//! Sixteen lanes as one AVX-512 register.

use std::arch::x86_64::*;

use super::Simd;

/// A token that this CPU runs AVX-512 (F, BW, VL, VNNI) with AVX2, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512(());

impl Avx512 {
    /// # Safety
    /// The CPU must have the features above.
    pub(super) unsafe fn new() -> Self {
        Self(())
    }
}

/// [`Simd::transpose16`]'s permutes, round by round: lane `l` of the row with bit `b` clear
/// takes its own lane where `l` has bit `b` clear, else lane `l ^ 2^b` of the row with it set
/// (16 + that lane, the permute's second source)...
const TRANSPOSE_LOW: [[i32; 16]; 4] = permutes(false);
/// ... and the row with bit `b` set takes lane `l ^ 2^b` of the first where `l` has it clear,
/// else its own lane.
const TRANSPOSE_HIGH: [[i32; 16]; 4] = permutes(true);

const fn permutes(high: bool) -> [[i32; 16]; 4] {
    let mut out = [[0; 16]; 4];
    let mut b = 0;
    while b < 4 {
        let bit = 1 << b;
        let mut l = 0;
        while l < 16 {
            out[b][l] = match (high, l & bit == 0) {
                (false, true) => l,
                (false, false) => 16 + (l ^ bit),
                (true, true) => l ^ bit,
                (true, false) => 16 + l,
            } as i32;
            l += 1;
        }
        b += 1;
    }
    out
}

// SAFETY (every `unsafe` block below): a value of `Avx512` exists only where the CPU has the
// features its intrinsics need (see `Avx512::new`), and every pointer comes from a reference to
// an array of exactly the width the intrinsic reads or writes.
impl Simd for Avx512 {
    type V = __m512;

    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    fn splat(self, v: f32) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    fn load(self, src: &[f32; 16]) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_loadu_ps(src.as_ptr()) }
    }

    #[inline(always)]
    fn store(self, v: __m512, dst: &mut [f32; 16]) {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), v) }
    }

    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_add_ps(a, b) }
    }

    #[inline(always)]
    fn mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    fn mul_then_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_add_ps(_mm512_mul_ps(a, b), c) }
    }

    #[inline(always)]
    fn sum(self, v: __m512) -> f32 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_reduce_add_ps(v) }
    }

    #[inline(always)]
    fn nibbles(self, bytes: &[u8; 16], shift: u32, offset: i32) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let b = _mm_loadu_si128(bytes.as_ptr().cast());
            let b = _mm_srl_epi16(b, _mm_cvtsi32_si128(shift as i32));
            let b = _mm_and_si128(b, _mm_set1_epi8(15));
            let i = _mm512_sub_epi32(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(offset));
            _mm512_cvtepi32_ps(i)
        }
    }

    #[inline(always)]
    fn bytes(self, codes: &[i8; 16]) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes.as_ptr().cast()))) }
    }

    #[inline(always)]
    fn bf16(self, bits: &[u16; 16]) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(bits.as_ptr().cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
    }

    #[inline(always)]
    fn f16(self, bits: &[u16; 16]) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr().cast())) }
    }

    #[inline(always)]
    fn transpose16(self, rows: [__m512; 16]) -> [__m512; 16] {
        // Four rounds, round b swapping bit b of the row index with bit b of the lane index:
        // rows r and r | 2^b (bit b clear in r) exchange the lanes with bit b set in the
        // first and clear in the second, two two-source permutes per pair, 64 in all where
        // through memory it was 256 scalar stores.
        let mut m = rows;
        for (b, (low, high)) in TRANSPOSE_LOW.iter().zip(&TRANSPOSE_HIGH).enumerate() {
            let bit = 1 << b;
            // SAFETY: see above (the token proves the features; arrays bound the pointers).
            let (low, high) = unsafe {
                (
                    _mm512_loadu_si512(low.as_ptr().cast()),
                    _mm512_loadu_si512(high.as_ptr().cast()),
                )
            };
            for r in (0..16).filter(|r| r & bit == 0) {
                let (a, c) = (m[r], m[r | bit]);
                // SAFETY: see above.
                unsafe {
                    m[r] = _mm512_permutex2var_ps(a, low, c);
                    m[r | bit] = _mm512_permutex2var_ps(a, high, c);
                }
            }
        }
        m
    }

    type B = __m512i;
    type I = __m512i;

    #[inline(always)]
    fn bytes64(self, src: &[u8; 64]) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_loadu_si512(src.as_ptr().cast()) }
    }

    #[inline(always)]
    fn low_nibbles(self, b: __m512i) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_and_si512(b, _mm512_set1_epi8(15)) }
    }

    #[inline(always)]
    fn high_nibbles(self, b: __m512i) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_and_si512(_mm512_srli_epi16::<4>(b), _mm512_set1_epi8(15)) }
    }

    #[inline(always)]
    fn six_bits<const SHIFT: u32>(self, nibbles: __m512i, high: __m512i) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            // Shifts of 16-bit lanes: bits 4 and 5 of a byte come from the same byte.
            let moved = match SHIFT {
                0 => _mm512_slli_epi16::<4>(high),
                2 => _mm512_slli_epi16::<2>(high),
                4 => high,
                _ => _mm512_srli_epi16::<2>(high),
            };
            // nibbles | (moved & 0x30) in one instruction (0xF8: a | (b & c)).
            _mm512_ternarylogic_epi32::<0xF8>(nibbles, moved, _mm512_set1_epi8(0x30))
        }
    }

    // vpdpbusd widens each product to 32 bits before adding.
    const WIDE_UNSIGNED: bool = true;

    #[inline(always)]
    fn flip_bytes(self, b: __m512i) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_xor_si512(b, _mm512_set1_epi8(i8::MIN)) }
    }

    #[inline(always)]
    fn dot_unsigned(self, acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_dpbusd_epi32(acc, u, s) }
    }

    #[inline(always)]
    fn dot_signed(self, acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // |a| as unsigned bytes times b with a's sign: the same products, in vpdpbusd's form.
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let negative = _mm512_movepi8_mask(a);
            let signed = _mm512_mask_sub_epi8(b, negative, _mm512_setzero_si512(), b);
            _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(a), signed)
        }
    }

    #[inline(always)]
    fn int_zero(self) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    fn int_to_float(self, v: __m512i) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_cvtepi32_ps(v) }
    }

    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    fn int_splat(self, v: i32) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_set1_epi32(v) }
    }

    #[inline(always)]
    fn broadcast4(self, v: &[i8; 4]) -> __m512i {
        // SAFETY: see above; the four bytes are read as one unaligned i32.
        unsafe { _mm512_set1_epi32(v.as_ptr().cast::<i32>().read_unaligned()) }
    }

    #[inline(always)]
    fn store_bytes(self, b: __m512i, dst: &mut [u8; 64]) {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), b) }
    }

    #[inline(always)]
    fn int_load(self, src: &[i32; 16]) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_loadu_si512(src.as_ptr().cast()) }
    }

    #[inline(always)]
    fn int_add(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { _mm512_add_epi32(a, b) }
    }

    // Products widen to i32 as cheaply as they are made: the partial sums are the sums.
    type P = __m512i;

    #[inline(always)]
    fn nibble_zero(self) -> __m512i {
        self.int_zero()
    }

    #[inline(always)]
    fn nibble_products(self, p: __m512i, u: Self::B, s: Self::B) -> __m512i {
        self.dot_unsigned(p, u, s)
    }

    #[inline(always)]
    fn nibble_widen(self, acc: __m512i, p: __m512i) -> __m512i {
        self.int_add(acc, p)
    }
}
