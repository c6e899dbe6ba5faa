//! The tensor types of a GGUF file, and their dequantization to f32.
//!
//! Each quantized type stores a row as blocks of a fixed number of values; a block holds its
//! scale(s) and the packed integers. The layouts are ggml's:
//!
//! | type | values per block | bytes per block | value |
//! |---|---|---|---|
//! | Q8_0 | 32 | 34: f16 `d`, 32 × i8 | `d·q` |
//! | Q4_0 | 32 | 18: f16 `d`, 16 bytes of nibbles | `d·(q − 8)` |
//! | Q4_1 | 32 | 20: f16 `d`, f16 `m`, 16 bytes of nibbles | `d·q + m` |
//! | Q4_K | 256 | 144: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles | `d·sc·q − dmin·m` per 32 |
//! | Q5_K | 256 | 176: as Q4_K plus 32 bytes of fifth bits | the same, `q` of 5 bits |
//! | Q6_K | 256 | 210: 128 bytes low nibbles, 64 bytes high 2 bits, 16 × i8 scales, f16 `d` | `d·sc·(q − 32)` per 16 |
//!
//! In a block of 32 (Q4_0, Q4_1) the low nibbles are values 0..16 and the high nibbles 16..32;
//! a K-quant super-block is four (Q6_K: two) groups, each taking the low nibbles first.
//!
//! Written here rather than taken from a crate: dequantization is a few dozen lines per type,
//! the quantized CPU and CUDA kernels must read exactly these layouts anyway, and the tests hold
//! it to the reference dequantizer of ggml's own Python package.

use half::{bf16, f16};

/// A tensor's element type, as GGUF numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
    /// 32 values: f16 scale, 8-bit integers.
    Q8_0,
    /// 32 values: f16 scale, 4-bit integers offset by 8.
    Q4_0,
    /// 32 values: f16 scale and minimum, 4-bit integers.
    Q4_1,
    /// 256 values: 4-bit integers, 6-bit scales and minimums per 32.
    Q4K,
    /// 256 values: 5-bit integers, 6-bit scales and minimums per 32.
    Q5K,
    /// 256 values: 6-bit integers, 8-bit scales per 16.
    Q6K,
    /// 32 values: f16 scale, 5-bit integers offset by 16.
    Q5_0,
    /// 32 values: f16 scale and minimum, 5-bit integers.
    Q5_1,
    /// 256 values: 2-bit integers, 4-bit scales and minimums per 16.
    Q2K,
    /// 256 values: 3-bit signed integers, 6-bit scales per 16.
    Q3K,
    /// 32 values: f16 scale, 4-bit indices into a fixed table of 16 values.
    Iq4Nl,
    /// 256 values: 4-bit indices into the IQ4 table, 6-bit scales per 32.
    Iq4Xs,
    /// A type this engine does not load (its GGUF number and, where known, its name).
    Other(u32),
}

impl GgmlType {
    /// The type GGUF numbers `id`.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            20 => Self::Iq4Nl,
            23 => Self::Iq4Xs,
            30 => Self::Bf16,
            other => Self::Other(other),
        }
    }

    /// Its name, as llama.cpp's tools print it.
    pub fn name(self) -> String {
        let known = match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Iq4Nl => "IQ4_NL",
            Self::Iq4Xs => "IQ4_XS",
            Self::Other(id) => {
                return match OTHER_NAMES.iter().find(|(n, _)| *n == id) {
                    Some((_, name)) => (*name).to_string(),
                    None => format!("type {id}"),
                };
            }
        };
        known.to_string()
    }

    /// Values per block and bytes per block; `None` for a type this engine does not load.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q8_0 => (32, 34),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Iq4Nl => (32, 18),
            Self::Iq4Xs => (256, 136),
            Self::Other(_) => return None,
        })
    }
}

/// The names of the GGUF types this engine does not load, for errors.
const OTHER_NAMES: &[(u32, &str)] = &[
    (9, "Q8_1"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

/// The types this engine loads, for errors.
pub const SUPPORTED: &str =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";

/// Dequantizes `bytes`, whole blocks of `kind`, into `out` (as many values as the blocks hold).
/// Returns `false` when `kind` is not loaded here or the lengths do not match.
pub fn dequantize(kind: GgmlType, bytes: &[u8], out: &mut [f32]) -> bool {
    let Some((values, size)) = kind.block() else {
        return false;
    };
    if !bytes.len().is_multiple_of(size) || bytes.len() / size * values != out.len() {
        return false;
    }
    let blocks = bytes.chunks_exact(size).zip(out.chunks_exact_mut(values));
    match kind {
        GgmlType::F32 => {
            blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, o)| o[0] = half16(b)),
        GgmlType::Bf16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        GgmlType::Q8_0 => blocks.for_each(|(b, o)| q8_0(b, o)),
        GgmlType::Q4_0 => blocks.for_each(|(b, o)| q4_0(b, o)),
        GgmlType::Q4_1 => blocks.for_each(|(b, o)| q4_1(b, o)),
        GgmlType::Q4K => blocks.for_each(|(b, o)| q4_k(b, o)),
        GgmlType::Q5K => blocks.for_each(|(b, o)| q5_k(b, o)),
        GgmlType::Q6K => blocks.for_each(|(b, o)| q6_k(b, o)),
        // Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS; any other type is refused there.
        low_bit => return super::low_bit::dequantize(low_bit, bytes, out),
    }
    true
}

/// The f16 at the start of `b`.
fn half16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = half16(b);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = d * f32::from(q as i8);
    }
}

fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half16(b);
    let (low, high) = out.split_at_mut(16);
    for (i, &q) in b[2..18].iter().enumerate() {
        low[i] = d * (f32::from(q & 0x0f) - 8.0);
        high[i] = d * (f32::from(q >> 4) - 8.0);
    }
}

fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half16(b), half16(&b[2..]));
    let (low, high) = out.split_at_mut(16);
    for (i, &q) in b[4..20].iter().enumerate() {
        low[i] = d * f32::from(q & 0x0f) + m;
        high[i] = d * f32::from(q >> 4) + m;
    }
}

/// The 6-bit scale and minimum of group `j` (0..8) of a Q4_K or Q5_K super-block.
fn scale_min(scales: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// The scales and minimums of the two groups of 32 that make chunk `chunk` (of 64 values) of a
/// Q4_K or Q5_K super-block with scale `d` and minimum scale `dmin`.
pub(super) fn group_scales(d: f32, dmin: f32, scales: &[u8], chunk: usize) -> [f32; 4] {
    let (sc1, m1) = scale_min(scales, 2 * chunk);
    let (sc2, m2) = scale_min(scales, 2 * chunk + 1);
    [d * sc1, dmin * m1, d * sc2, dmin * m2]
}

fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half16(b), half16(&b[2..]));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, o)) in qs
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let [d1, min1, d2, min2] = group_scales(d, dmin, scales, chunk);
        let (low, high) = o.split_at_mut(32);
        for (l, &byte) in q.iter().enumerate() {
            low[l] = d1 * f32::from(byte & 0x0f) - min1;
            high[l] = d2 * f32::from(byte >> 4) - min2;
        }
    }
}

fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half16(b), half16(&b[2..]));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (chunk, (q, o)) in qs
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let [d1, min1, d2, min2] = group_scales(d, dmin, scales, chunk);
        let (bit1, bit2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let (low, high) = o.split_at_mut(32);
        for (l, &byte) in q.iter().enumerate() {
            let h1 = if qh[l] & bit1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & bit2 != 0 { 16 } else { 0 };
            low[l] = d1 * f32::from((byte & 0x0f) + h1) - min1;
            high[l] = d2 * f32::from((byte >> 4) + h2) - min2;
        }
    }
}

fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half16(&b[208..]);
    for half in 0..2 {
        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
        let sc = &scales[8 * half..];
        let o = &mut out[128 * half..128 * (half + 1)];
        for l in 0..32 {
            let group = l / 16;
            let q = [
                (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let scale = f32::from(sc[group + 2 * k] as i8);
                o[l + 32 * k] = d * scale * (f32::from(q) - 32.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_blocks_decode_by_hand() {
        // Q8_0: d = 0.5, q = -2, 3.
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2] = (-2i8) as u8;
        b[3] = 3;
        let mut out = vec![0.0; 32];
        assert!(dequantize(GgmlType::Q8_0, &b, &mut out));
        assert_eq!((out[0], out[1], out[2]), (-1.0, 1.5, 0.0));
        // Q4_0: d = 2, first byte 0x9A: value 0 = 2·(10−8), value 16 = 2·(9−8).
        let mut b = vec![0x88u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        b[2] = 0x9a;
        let mut out = vec![0.0; 32];
        assert!(dequantize(GgmlType::Q4_0, &b, &mut out));
        assert_eq!((out[0], out[16], out[1]), (4.0, 2.0, 0.0));
    }

    #[test]
    fn unknown_types_and_bad_lengths_are_refused() {
        let mut out = vec![0.0; 32];
        assert!(!dequantize(GgmlType::from_id(16), &[0; 66], &mut out));
        assert_eq!(GgmlType::from_id(16).name(), "IQ2_XXS");
        assert_eq!(GgmlType::from_id(6).name(), "Q5_0");
        assert_eq!(GgmlType::from_id(99).name(), "type 99");
        assert!(!dequantize(GgmlType::Q8_0, &[0; 33], &mut out));
        assert!(!dequantize(GgmlType::Q8_0, &[0; 34], &mut out[..31]));
    }
}
