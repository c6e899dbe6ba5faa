//! Sixteen lanes as two AVX2 registers.

use std::arch::x86_64::*;

use super::Simd;

/// A token that this CPU runs AVX2 with FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx2(());

impl Avx2 {
    /// # Safety
    /// The CPU must have the features above.
    pub(super) unsafe fn new() -> Self {
        Self(())
    }
}

// SAFETY (every `unsafe` block below): a value of `Avx2` exists only where the CPU has the
// features its intrinsics need (see `Avx2::new`), and every pointer comes from a reference to
// an array at least as wide as the intrinsic reads or writes at that offset.
impl Simd for Avx2 {
    type V = [__m256; 2];

    #[inline(always)]
    fn zero(self) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_setzero_ps(); 2] }
    }

    #[inline(always)]
    fn splat(self, v: f32) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_set1_ps(v); 2] }
    }

    #[inline(always)]
    fn load(self, src: &[f32; 16]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_loadu_ps(src.as_ptr()),
                _mm256_loadu_ps(src.as_ptr().add(8)),
            ]
        }
    }

    #[inline(always)]
    fn store(self, v: [__m256; 2], dst: &mut [f32; 16]) {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            _mm256_storeu_ps(dst.as_mut_ptr(), v[0]);
            _mm256_storeu_ps(dst.as_mut_ptr().add(8), v[1]);
        }
    }

    #[inline(always)]
    fn add(self, a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])] }
    }

    #[inline(always)]
    fn mul_add(self, a: [__m256; 2], b: [__m256; 2], c: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_fmadd_ps(a[0], b[0], c[0]),
                _mm256_fmadd_ps(a[1], b[1], c[1]),
            ]
        }
    }

    #[inline(always)]
    fn mul_then_add(self, a: [__m256; 2], b: [__m256; 2], c: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_add_ps(_mm256_mul_ps(a[0], b[0]), c[0]),
                _mm256_add_ps(_mm256_mul_ps(a[1], b[1]), c[1]),
            ]
        }
    }

    #[inline(always)]
    fn sum(self, v: [__m256; 2]) -> f32 {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let s = _mm256_add_ps(v[0], v[1]);
            let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
            _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)))
        }
    }

    #[inline(always)]
    fn nibbles(self, bytes: &[u8; 16], shift: u32, offset: i32) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let b = _mm_loadu_si128(bytes.as_ptr().cast());
            let b = _mm_srl_epi16(b, _mm_cvtsi32_si128(shift as i32));
            let b = _mm_and_si128(b, _mm_set1_epi8(15));
            let off = _mm256_set1_epi32(offset);
            let lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(b), off);
            let hi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(b)), off);
            [_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)]
        }
    }

    #[inline(always)]
    fn bytes(self, codes: &[i8; 16]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let b = _mm_loadu_si128(codes.as_ptr().cast());
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b))),
            ]
        }
    }

    #[inline(always)]
    fn bf16(self, bits: &[u16; 16]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(bits.as_ptr().cast()));
            let hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(bits.as_ptr().add(8).cast()));
            [
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(lo)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(hi)),
            ]
        }
    }

    #[inline(always)]
    fn f16(self, bits: &[u16; 16]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().add(8).cast())),
            ]
        }
    }

    type B = [__m256i; 2];
    type I = [__m256i; 2];

    #[inline(always)]
    fn bytes64(self, src: &[u8; 64]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_loadu_si256(src.as_ptr().cast()),
                _mm256_loadu_si256(src.as_ptr().add(32).cast()),
            ]
        }
    }

    #[inline(always)]
    fn low_nibbles(self, b: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let m = _mm256_set1_epi8(15);
            [_mm256_and_si256(b[0], m), _mm256_and_si256(b[1], m)]
        }
    }

    #[inline(always)]
    fn high_nibbles(self, b: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let m = _mm256_set1_epi8(15);
            [
                _mm256_and_si256(_mm256_srli_epi16::<4>(b[0]), m),
                _mm256_and_si256(_mm256_srli_epi16::<4>(b[1]), m),
            ]
        }
    }

    #[inline(always)]
    fn six_bits<const SHIFT: u32>(self, nibbles: [__m256i; 2], high: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let m = _mm256_set1_epi8(0x30);
            // Shifts of 16-bit lanes: bits 4 and 5 of a byte come from the same byte.
            let moved = match SHIFT {
                0 => [
                    _mm256_slli_epi16::<4>(high[0]),
                    _mm256_slli_epi16::<4>(high[1]),
                ],
                2 => [
                    _mm256_slli_epi16::<2>(high[0]),
                    _mm256_slli_epi16::<2>(high[1]),
                ],
                4 => high,
                _ => [
                    _mm256_srli_epi16::<2>(high[0]),
                    _mm256_srli_epi16::<2>(high[1]),
                ],
            };
            [
                _mm256_or_si256(nibbles[0], _mm256_and_si256(moved[0], m)),
                _mm256_or_si256(nibbles[1], _mm256_and_si256(moved[1], m)),
            ]
        }
    }

    // vpmaddubsw saturates pairs of products at i16.
    const WIDE_UNSIGNED: bool = false;

    #[inline(always)]
    fn flip_bytes(self, b: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let top = _mm256_set1_epi8(i8::MIN);
            [_mm256_xor_si256(b[0], top), _mm256_xor_si256(b[1], top)]
        }
    }

    #[inline(always)]
    fn dot_unsigned(self, acc: [__m256i; 2], u: [__m256i; 2], s: [__m256i; 2]) -> [__m256i; 2] {
        // Pairs of products in i16 (at most 2 · 127 · 128, no saturation), then pairs of those.
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let low = _mm256_madd_epi16(_mm256_maddubs_epi16(u[0], s[0]), ones);
            let high = _mm256_madd_epi16(_mm256_maddubs_epi16(u[1], s[1]), ones);
            [
                _mm256_add_epi32(acc[0], low),
                _mm256_add_epi32(acc[1], high),
            ]
        }
    }

    #[inline(always)]
    fn dot_signed(self, acc: [__m256i; 2], a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        // |a| as unsigned bytes times b with a's sign: the same products, in the unsigned form.
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            self.dot_unsigned(
                acc,
                [_mm256_sign_epi8(a[0], a[0]), _mm256_sign_epi8(a[1], a[1])],
                [_mm256_sign_epi8(b[0], a[0]), _mm256_sign_epi8(b[1], a[1])],
            )
        }
    }

    #[inline(always)]
    fn int_zero(self) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_setzero_si256(); 2] }
    }

    #[inline(always)]
    fn int_to_float(self, v: [__m256i; 2]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_cvtepi32_ps(v[0]), _mm256_cvtepi32_ps(v[1])] }
    }

    #[inline(always)]
    fn mul(self, a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])] }
    }

    #[inline(always)]
    fn int_splat(self, v: i32) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_set1_epi32(v); 2] }
    }

    #[inline(always)]
    fn broadcast4(self, v: &[i8; 4]) -> [__m256i; 2] {
        // SAFETY: see above; the four bytes are read as one unaligned i32.
        unsafe { [_mm256_set1_epi32(v.as_ptr().cast::<i32>().read_unaligned()); 2] }
    }

    #[inline(always)]
    fn store_bytes(self, b: [__m256i; 2], dst: &mut [u8; 64]) {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            _mm256_storeu_si256(dst.as_mut_ptr().cast(), b[0]);
            _mm256_storeu_si256(dst.as_mut_ptr().add(32).cast(), b[1]);
        }
    }

    #[inline(always)]
    fn int_load(self, src: &[i32; 16]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_loadu_si256(src.as_ptr().cast()),
                _mm256_loadu_si256(src.as_ptr().add(8).cast()),
            ]
        }
    }

    #[inline(always)]
    fn int_add(self, a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])] }
    }

    type P = [__m256i; 2];

    #[inline(always)]
    fn nibble_zero(self) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe { [_mm256_setzero_si256(); 2] }
    }

    #[inline(always)]
    fn nibble_products(self, p: [__m256i; 2], u: [__m256i; 2], s: [__m256i; 2]) -> [__m256i; 2] {
        // Pairs of products in i16 (at most 2 · 15 · 127 each), added in i16.
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            [
                _mm256_add_epi16(p[0], _mm256_maddubs_epi16(u[0], s[0])),
                _mm256_add_epi16(p[1], _mm256_maddubs_epi16(u[1], s[1])),
            ]
        }
    }

    #[inline(always)]
    fn nibble_widen(self, acc: [__m256i; 2], p: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: see above (the token proves the features; arrays bound the pointers).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            [
                _mm256_add_epi32(acc[0], _mm256_madd_epi16(p[0], ones)),
                _mm256_add_epi32(acc[1], _mm256_madd_epi16(p[1], ones)),
            ]
        }
    }
}
