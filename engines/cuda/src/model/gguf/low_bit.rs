//! The GGUF types whose blocks decode into signed byte codes with a scale (and a minimum) per
//! group: Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS. One decoder per type feeds both the f32
//! dequantizer ([`super::quant::dequantize`]) and the CPU's [`Codes::Q8`] layout
//! ([`super::repack`]), so the value a kernel computes is the value the file dequantizes to.
//!
//! | type | values per block | bytes per block | value |
//! |---|---|---|---|
//! | Q5_0 | 32 | 22: f16 `d`, 4 bytes of fifth bits, 16 bytes of nibbles | `(q − 16)·d` |
//! | Q5_1 | 32 | 24: f16 `d`, f16 `m`, fifth bits, nibbles | `q·d + m` |
//! | Q2_K | 256 | 84: 16 scale/min nibble pairs, 64 bytes of 2-bit codes, f16 `d`, f16 `dmin` | `d·sc·q − dmin·m` per 16 |
//! | Q3_K | 256 | 110: 32 bytes of high bits, 64 bytes of 2-bit codes, 12 bytes of 6-bit scales, f16 `d` | `d·(sc − 32)·q` per 16, `q` in −4..3 |
//! | IQ4_NL | 32 | 18: f16 `d`, 16 bytes of nibbles indexing [`IQ4_VALUES`] | `d·v[q]` |
//! | IQ4_XS | 256 | 136: f16 `d`, 6-bit scales (2 high bits in a u16, 4 low bits in 4 bytes), 128 bytes of nibbles | `d·(sc − 32)·v[q]` per 32 |
//!
//! The layouts and formulas are ggml's reference dequantizers'; each product and sum is taken
//! in the same order, in f32.
//!
//! [`Codes::Q8`]: crate::model::packed::Codes::Q8

use half::f16;

use super::quant::GgmlType;
use crate::model::packed::Groups;

/// The 16 values a 4-bit IQ4 code stands for (before the block's scale).
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The f16 at the start of `b`.
fn half16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Values per group of a type decoded here, and whether its groups carry a minimum; `None`
/// for any other type.
pub fn grouping(kind: GgmlType) -> Option<(usize, bool)> {
    Some(match kind {
        GgmlType::Q5_0 | GgmlType::Iq4Nl | GgmlType::Iq4Xs => (32, false),
        GgmlType::Q5_1 => (32, true),
        GgmlType::Q2K => (16, true),
        GgmlType::Q3K => (16, false),
        _ => return None,
    })
}

/// Appends the groups of one block of `kind` to `out` (its minimums only for a type that has
/// them); `false` for a type not decoded here.
pub fn decode(kind: GgmlType, b: &[u8], out: &mut Groups<i8>) -> bool {
    match kind {
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let with_min = kind == GgmlType::Q5_1;
            let (at, bias) = if with_min { (4, 0) } else { (2, 16) };
            out.scale.push(half16(b));
            if with_min {
                out.min.push(half16(&b[2..]));
            }
            let high = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            let qs = &b[at + 4..at + 20];
            let fifth = |bit: usize| (((high >> bit) & 1) as u8) << 4;
            out.codes
                .extend((0..16).map(|j| ((qs[j] & 15) | fifth(j)) as i8 - bias));
            out.codes
                .extend((0..16).map(|j| ((qs[j] >> 4) | fifth(j + 16)) as i8 - bias));
        }
        GgmlType::Q2K => {
            let (scales, qs) = (&b[..16], &b[16..80]);
            let (d, dmin) = (half16(&b[80..]), half16(&b[82..]));
            for (g, &sc) in scales.iter().enumerate() {
                out.scale.push(d * f32::from(sc & 15));
                out.min.push(-(dmin * f32::from(sc >> 4)));
                let (half, j, second) = (g / 8, (g % 8) / 2, g % 2);
                let q = &qs[32 * half + 16 * second..][..16];
                out.codes
                    .extend(q.iter().map(|&x| ((x >> (2 * j)) & 3) as i8));
            }
        }
        GgmlType::Q3K => {
            let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
            let d = half16(&b[108..]);
            for (g, sc) in q3_scales(packed).into_iter().enumerate() {
                out.scale.push(d * f32::from(sc - 32));
                let (half, j, second) = (g / 8, (g % 8) / 2, g % 2);
                let q = &qs[32 * half + 16 * second..][..16];
                let h = &hmask[16 * second..][..16];
                let bit = 1u8 << (4 * half + j);
                out.codes.extend(
                    q.iter().zip(h).map(|(&x, &h)| {
                        ((x >> (2 * j)) & 3) as i8 - if h & bit != 0 { 0 } else { 4 }
                    }),
                );
            }
        }
        GgmlType::Iq4Nl => {
            out.scale.push(half16(b));
            iq4_codes(&b[2..18], &mut out.codes);
        }
        GgmlType::Iq4Xs => {
            let d = half16(b);
            let high = u16::from_le_bytes([b[2], b[3]]);
            let low = &b[4..8];
            for (g, qs) in b[8..136].chunks_exact(16).enumerate() {
                let ls =
                    ((low[g / 2] >> (4 * (g % 2))) & 15) | ((((high >> (2 * g)) & 3) as u8) << 4);
                out.scale.push(d * f32::from(i16::from(ls) - 32));
                iq4_codes(qs, &mut out.codes);
            }
        }
        _ => return false,
    }
    true
}

/// The 16 signed 6-bit scales of a Q3_K super-block (biased by 32), from their 12 bytes: the
/// low four bits of scales 0..8 and 8..16 in the low and high nibbles of bytes 0..8, the high
/// two bits four to a byte in bytes 8..12.
fn q3_scales(packed: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, s) in out.iter_mut().enumerate() {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 15;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i8;
    }
    out
}

/// The IQ4 values of 16 bytes of nibbles: the low nibbles first, then the high ones.
fn iq4_codes(qs: &[u8], codes: &mut Vec<i8>) {
    codes.extend(qs.iter().map(|&q| IQ4_VALUES[usize::from(q & 15)]));
    codes.extend(qs.iter().map(|&q| IQ4_VALUES[usize::from(q >> 4)]));
}

/// Dequantizes `bytes`, whole blocks of `kind`, into `out` (the blocks' values) with ggml's
/// formulas; `false` for a type not decoded here.
pub fn dequantize(kind: GgmlType, bytes: &[u8], out: &mut [f32]) -> bool {
    let (Some((group, _)), Some((values, size))) = (grouping(kind), kind.block()) else {
        return false;
    };
    // One block's groups at a time, in a buffer the blocks share.
    let mut groups = Groups::default();
    for (b, out) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(values)) {
        groups.scale.clear();
        groups.min.clear();
        groups.codes.clear();
        decode(kind, b, &mut groups);
        for (g, (codes, o)) in groups
            .codes
            .chunks_exact(group)
            .zip(out.chunks_exact_mut(group))
            .enumerate()
        {
            let (scale, min) = (groups.scale[g], groups.min_at(g));
            for (o, &q) in o.iter_mut().zip(codes) {
                *o = f32::from(q) * scale + min;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3_scales_unpack_as_ggml_does() {
        // Scale 0: low nibble 5 of byte 0, high bits 2 from byte 8 → 5 | 32 = 37.
        // Scale 9: high nibble of byte 1 = 7, high bits (byte 9 >> 4) & 3 = 1 → 7 | 16 = 23.
        let mut packed = [0u8; 12];
        packed[0] = 5;
        packed[1] = 7 << 4;
        packed[8] = 2;
        packed[9] = 1 << 4;
        let s = q3_scales(&packed);
        assert_eq!((s[0], s[9], s[1]), (37, 23, 0));
    }

    #[test]
    fn q5_0_reads_its_fifth_bits() {
        let mut b = vec![0u8; 22];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Value 0: nibble 3 with the fifth bit set → 19 − 16 = 3; value 16: nibble 0, no bit.
        b[2] = 1;
        b[6] = 3;
        let mut out = vec![0.0; 32];
        assert!(dequantize(GgmlType::Q5_0, &b, &mut out));
        assert_eq!((out[0], out[16], out[1]), (1.5, -8.0, -8.0));
    }
}
