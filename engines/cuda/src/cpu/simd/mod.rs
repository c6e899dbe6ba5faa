//! The instruction sets the CPU kernels are compiled for, and the one this CPU runs: found once
//! at run time (`is_x86_feature_detected!`), never assumed at build time, so one binary runs on
//! every x86-64 machine and uses AMX tiles, AVX-512 or AVX2 + FMA where they exist.
//! `TURNPIKE_CPU_ISA` (`amx`, `avx512`, `avx2`, `portable`) picks a narrower one, for tests and
//! measurements.
//!
//! Besides float lanes, a set has byte lanes for products of 8-bit inputs with 4- and 8-bit
//! weights: four byte products summed into each i32 lane (AVX-512 VNNI's `vpdpbusd`, AVX2's
//! `vpmaddubsw` + `vpmaddwd`, plain loops elsewhere), as ggml's quantized dot products do.
//!
//! A kernel is written once over sixteen-lane vectors ([`Kernel::run`], generic over [`Simd`]
//! and a tile size) and [`Isa::run`] compiles it into a function per instruction set
//! (`#[target_feature]`) with that set's lanes: AVX-512 registers, pairs of AVX2 registers, or
//! plain arrays.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;

/// Sixteen f32 lanes and the operations the kernels need, for one instruction set. A value of
/// an implementing type is a token that this CPU runs that set: only [`Isa::run`] makes one,
/// after checking, so the x86 implementations may use their instructions in safe methods.
pub(super) trait Simd: Copy {
    /// Sixteen floats.
    type V: Copy;
    /// All zeros.
    fn zero(self) -> Self::V;
    /// `v` in every lane.
    fn splat(self, v: f32) -> Self::V;
    /// Sixteen floats from `src`.
    fn load(self, src: &[f32; 16]) -> Self::V;
    /// Stores into `dst`.
    fn store(self, v: Self::V, dst: &mut [f32; 16]);
    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`, fused where the CPU can.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a · b` then `+ c`, two roundings (as ggml's dequantizers compute).
    fn mul_then_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The sum of the lanes.
    fn sum(self, v: Self::V) -> f32;
    /// The nibbles `(byte >> shift) & 15` of sixteen bytes less `offset`, as floats.
    fn nibbles(self, bytes: &[u8; 16], shift: u32, offset: i32) -> Self::V;
    /// Sixteen signed bytes as floats.
    fn bytes(self, codes: &[i8; 16]) -> Self::V;
    /// Sixteen bfloat16 bit patterns as floats.
    fn bf16(self, bits: &[u16; 16]) -> Self::V;
    /// Sixteen IEEE half bit patterns as floats.
    fn f16(self, bits: &[u16; 16]) -> Self::V;
    /// The 16 × 16 matrix whose rows are `rows`, transposed: lane `i` of row `j` is lane `j`
    /// of row `i`. Through memory by default.
    fn transpose16(self, rows: [Self::V; 16]) -> [Self::V; 16] {
        let mut m = [[0f32; 16]; 16];
        for (row, v) in m.iter_mut().zip(rows) {
            self.store(v, row);
        }
        let t: [[f32; 16]; 16] = std::array::from_fn(|i| std::array::from_fn(|j| m[j][i]));
        t.map(|row| self.load(&row))
    }

    /// Sixty-four bytes.
    type B: Copy;
    /// Sixteen i32 lanes.
    type I: Copy;
    /// Sixty-four bytes from `src`.
    fn bytes64(self, src: &[u8; 64]) -> Self::B;
    /// Each byte's low nibble.
    fn low_nibbles(self, b: Self::B) -> Self::B;
    /// Each byte's high nibble.
    fn high_nibbles(self, b: Self::B) -> Self::B;
    /// Six-bit codes: each byte of `nibbles` (at most 15) with bits `SHIFT..SHIFT + 2` of the
    /// same byte of `high` above it, `nibbles | ((high >> SHIFT) & 3) << 4`; `SHIFT` is 0, 2,
    /// 4 or 6.
    fn six_bits<const SHIFT: u32>(self, nibbles: Self::B, high: Self::B) -> Self::B;
    /// Whether [`Simd::dot_unsigned`] is exact for every unsigned byte, not only for those
    /// at most 127.
    const WIDE_UNSIGNED: bool;
    /// `acc` plus, in lane `i`, the sum of `u[4i + j] · s[4i + j]` over `j < 4`, with `u`
    /// unsigned bytes (at most 127 unless [`Simd::WIDE_UNSIGNED`]) and `s` signed.
    fn dot_unsigned(self, acc: Self::I, u: Self::B, s: Self::B) -> Self::I;
    /// Each byte with its top bit flipped (unsigned `v + 128` to signed `v`).
    fn flip_bytes(self, b: Self::B) -> Self::B;
    /// As [`Simd::dot_unsigned`] with both signed; no byte of `b` may be -128.
    fn dot_signed(self, acc: Self::I, a: Self::B, b: Self::B) -> Self::I;
    /// All-zero i32 lanes.
    fn int_zero(self) -> Self::I;
    /// `v` in every i32 lane.
    fn int_splat(self, v: i32) -> Self::I;
    /// Four signed bytes in every i32 lane.
    fn broadcast4(self, v: &[i8; 4]) -> Self::B;
    /// i32 lanes as floats.
    fn int_to_float(self, v: Self::I) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// Stores sixty-four bytes into `dst`.
    fn store_bytes(self, b: Self::B, dst: &mut [u8; 64]);
    /// Sixteen i32 lanes from `src`.
    fn int_load(self, src: &[i32; 16]) -> Self::I;
    /// `a + b`, lane by lane.
    fn int_add(self, a: Self::I, b: Self::I) -> Self::I;

    /// Sums of byte products as narrow as they stay exact for 4-bit codes: AVX2 keeps pairs
    /// of products in i16 lanes and widens them once per group, a third fewer instructions
    /// than widening each product; sets that widen in one instruction keep i32 lanes.
    type P: Copy;
    /// All-zero partial sums.
    fn nibble_zero(self) -> Self::P;
    /// `p` plus the products of `u` (every byte at most 15) with `s` (every byte within
    /// ±127), grouped as [`Simd::dot_unsigned`] groups them; exact for at most
    /// [`NIBBLE_PRODUCTS`] calls before [`Simd::nibble_widen`].
    fn nibble_products(self, p: Self::P, u: Self::B, s: Self::B) -> Self::P;
    /// `acc` plus `p`, in [`Simd::dot_unsigned`]'s i32 lanes.
    fn nibble_widen(self, acc: Self::I, p: Self::P) -> Self::I;
}

/// Calls of [`Simd::nibble_products`] that stay exact in i16 lanes: each adds at most
/// 2 · 15 · 127 = 3,810 to a lane, and 8 · 3,810 = 30,480 is under `i16::MAX`.
pub(super) const NIBBLE_PRODUCTS: usize = 8;

/// A kernel body, compiled per instruction set by [`Isa::run`]. Implementations mark `run`
/// `#[inline(always)]` so it is compiled inside each instruction set's function.
pub(super) trait Kernel {
    /// What it returns.
    type Output;
    /// The body: `S` is the instruction set's lanes, and `T` rows of sixteen sums fit its
    /// registers with room to spare (eight in AVX-512's 32 registers, four otherwise).
    fn run<S: Simd, const T: usize>(self, simd: S) -> Self::Output;
}

/// An instruction set the kernels are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    /// [`Isa::Avx512`] with AMX's tiles for byte products of many rows ([`amx`]).
    Amx,
    /// AVX-512 (F, BW, VL, VNNI) with FMA: 16 floats per register, 32 registers.
    Avx512,
    /// AVX2 with FMA: 8 floats per register, 16 registers.
    Avx2,
    /// Whatever the build targets (SSE2 on x86-64), with separate multiplies and adds.
    Portable,
}

impl Isa {
    /// Its name.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Amx => "amx",
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
        }
    }

    /// Whether this CPU runs it.
    pub(super) fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Self::Amx => Self::Avx512.supported() && amx::granted(),
                Self::Avx512 => {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512vnni")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                        && std::arch::is_x86_feature_detected!("fma")
                        && std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("f16c")
                }
                Self::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                        && std::arch::is_x86_feature_detected!("f16c")
                }
                Self::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Portable
        }
    }

    /// The widest this CPU runs, or the one `TURNPIKE_CPU_ISA` names if it runs that.
    pub(super) fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let wanted = std::env::var("TURNPIKE_CPU_ISA").ok();
            let order = [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Portable];
            let pick = order
                .into_iter()
                .filter(|isa| wanted.as_deref().is_none_or(|w| w == isa.name()))
                .find(|isa| isa.supported());
            pick.unwrap_or(Isa::Portable)
        })
    }

    /// Runs `kernel` compiled for this instruction set (the portable build where this CPU does
    /// not run it).
    pub(super) fn run<K: Kernel>(self, kernel: K) -> K::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `supported` checked the CPU has every feature `avx512` enables (AMX
            // implies them).
            Self::Amx | Self::Avx512 if self.supported() => unsafe { x86::avx512(kernel) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `supported` checked the CPU has AVX2 and FMA.
            Self::Avx2 if self.supported() => unsafe { x86::avx2(kernel) },
            _ => kernel.run::<portable::Portable, 4>(portable::Portable),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Kernel;
    use super::avx2::Avx2;
    use super::avx512::Avx512;

    /// `kernel` for AVX-512: tiles of eight rows.
    ///
    /// # Safety
    /// The CPU must have the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn avx512<K: Kernel>(kernel: K) -> K::Output {
        // SAFETY: the caller checked the CPU has AVX-512 (F, BW, VL, VNNI), AVX2, FMA and F16C.
        kernel.run::<Avx512, 8>(unsafe { Avx512::new() })
    }

    /// `kernel` for AVX2 + FMA: tiles of four rows (sixteen registers).
    ///
    /// # Safety
    /// The CPU must have the features enabled here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn avx2<K: Kernel>(kernel: K) -> K::Output {
        // SAFETY: the caller checked the CPU has AVX2, FMA and F16C.
        kernel.run::<Avx2, 4>(unsafe { Avx2::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::{Isa, Kernel, Simd};

    /// A matrix through [`Simd::transpose16`].
    struct Transpose([[f32; 16]; 16]);

    impl Kernel for Transpose {
        type Output = [[f32; 16]; 16];

        #[inline(always)]
        fn run<S: Simd, const T: usize>(self, s: S) -> [[f32; 16]; 16] {
            let rows = self.0.map(|row| s.load(&row));
            let mut out = [[0f32; 16]; 16];
            for (row, v) in out.iter_mut().zip(s.transpose16(rows)) {
                s.store(v, row);
            }
            out
        }
    }

    #[test]
    fn every_instruction_set_transposes_sixteen_rows() {
        let m: [[f32; 16]; 16] =
            std::array::from_fn(|i| std::array::from_fn(|j| (16 * i + j) as f32));
        let want: [[f32; 16]; 16] = std::array::from_fn(|i| std::array::from_fn(|j| m[j][i]));
        for isa in [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Portable] {
            if isa.supported() {
                assert_eq!(isa.run(Transpose(m)), want, "{isa:?}");
            }
        }
    }
}
