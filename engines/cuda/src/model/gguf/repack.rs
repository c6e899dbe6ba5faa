//! GGUF blocks into the CPU's [`Packed`] layouts, once, at load: the same values as
//! [`super::quant`]'s dequantizer, kept in their codes.

use half::f16;

use super::quant::GgmlType;
use crate::model::packed::{Codes, Groups, Packed};

/// The f16 at the start of `b`.
fn half16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// `bytes` (whole blocks of `kind`, `rows × cols` values) as a packed matrix; `None` when the
/// lengths do not match or `cols` does not split into whole blocks.
pub fn pack(kind: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Option<Packed> {
    let (values, size) = kind.block()?;
    if !cols.is_multiple_of(values) || bytes.len() != rows * cols / values * size {
        return None;
    }
    let blocks = bytes.chunks_exact(size);
    let n = rows * cols;
    let codes = match kind {
        GgmlType::F32 => Codes::F32(
            blocks
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        GgmlType::F16 => Codes::F16(blocks.map(|b| u16::from_le_bytes([b[0], b[1]])).collect()),
        GgmlType::Bf16 => Codes::Bf16(blocks.map(|b| u16::from_le_bytes([b[0], b[1]])).collect()),
        GgmlType::Q8_0 => {
            let mut out = groups(32, n, false);
            for b in blocks {
                out.scale.push(half16(b));
                out.codes.extend(b[2..34].iter().map(|&q| q as i8));
            }
            Codes::Q8 {
                group: 32,
                groups: out,
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let q4_1 = kind == GgmlType::Q4_1;
            let mut out = groups(32, n, q4_1);
            out.codes = Vec::with_capacity(n / 2);
            for b in blocks {
                out.scale.push(half16(b));
                let at = if q4_1 {
                    out.min.push(half16(&b[2..]));
                    4
                } else {
                    2
                };
                out.codes.extend_from_slice(&b[at..at + 16]);
            }
            Codes::Q4 {
                offset: if q4_1 { 0 } else { 8 },
                groups: out,
            }
        }
        GgmlType::Q4K => {
            let mut out = groups(32, n, true);
            out.codes = Vec::with_capacity(n / 2);
            for b in blocks {
                let (d, dmin) = (half16(b), half16(&b[2..]));
                let scales = &b[4..16];
                for (chunk, q) in b[16..144].chunks_exact(32).enumerate() {
                    let [d1, m1, d2, m2] = super::quant::group_scales(d, dmin, scales, chunk);
                    out.scale.extend([d1, d2]);
                    out.min.extend([-m1, -m2]);
                    let (a, z) = q.split_at(16);
                    let (low, high) = (a.iter().zip(z), a.iter().zip(z));
                    out.codes
                        .extend(low.map(|(x, y)| (x & 15) | ((y & 15) << 4)));
                    out.codes.extend(high.map(|(x, y)| (x >> 4) | (y & 0xf0)));
                }
            }
            Codes::Q4 {
                offset: 0,
                groups: out,
            }
        }
        GgmlType::Q5K => {
            let mut out = groups(32, n, true);
            for b in blocks {
                let (d, dmin) = (half16(b), half16(&b[2..]));
                let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
                for (chunk, q) in qs.chunks_exact(32).enumerate() {
                    let [d1, m1, d2, m2] = super::quant::group_scales(d, dmin, scales, chunk);
                    let (bit1, bit2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
                    out.scale.extend([d1, d2]);
                    out.min.extend([-m1, -m2]);
                    let high = |l: usize, bit: u8| if qh[l] & bit != 0 { 16 } else { 0 };
                    out.codes.extend(
                        q.iter()
                            .enumerate()
                            .map(|(l, &x)| ((x & 15) + high(l, bit1)) as i8),
                    );
                    out.codes.extend(
                        q.iter()
                            .enumerate()
                            .map(|(l, &x)| ((x >> 4) + high(l, bit2)) as i8),
                    );
                }
            }
            Codes::Q8 {
                group: 32,
                groups: out,
            }
        }
        GgmlType::Q6K => {
            let mut out = groups(16, n, false);
            for b in blocks {
                let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
                let d = half16(&b[208..]);
                out.scale
                    .extend(scales.iter().map(|&s| d * f32::from(s as i8)));
                let mut block = [0i8; 256];
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    for l in 0..32 {
                        let q = [
                            (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                            (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                        ];
                        for (k, q) in q.into_iter().enumerate() {
                            block[128 * half + l + 32 * k] = q as i8 - 32;
                        }
                    }
                }
                out.codes.extend_from_slice(&block);
            }
            Codes::Q8 {
                group: 16,
                groups: out,
            }
        }
        // Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS; any other type has no grouping.
        low_bit => {
            let (group, with_min) = super::low_bit::grouping(low_bit)?;
            let mut out = groups(group, n, with_min);
            for b in blocks {
                super::low_bit::decode(low_bit, b, &mut out);
            }
            Codes::Q8 { group, groups: out }
        }
    };
    Some(Packed { rows, cols, codes })
}

/// Empty groups with room for `values` values in groups of `group` (minimums only when
/// `with_min`); one code per value.
fn groups<T>(group: usize, values: usize, with_min: bool) -> Groups<T> {
    Groups {
        scale: Vec::with_capacity(values / group),
        min: Vec::with_capacity(if with_min { values / group } else { 0 }),
        codes: Vec::with_capacity(values),
    }
}
