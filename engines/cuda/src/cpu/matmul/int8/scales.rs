//! A byte layout's group scales (or minimums), 16 columns side by side, in the smaller of two
//! forms: a signed byte per group times a half per span of 256 values, where every scale is
//! exactly such a product, or a half per group.
//!
//! The K-quants store their scales so: a half per super-block of 256 values times a small
//! integer per group (6 bits in Q4_K and Q5_K, 8 in Q6_K). Held as one half per group, a Q4_K
//! group of 32 values read 4 bytes of scale and minimum beside its 16 bytes of codes; held as
//! bytes, 2.5. The product of a half and a byte is exact in f32, so the kernels get the very
//! scales the file stands for (a half per group rounded them to 11 bits).

use half::f16;

use super::super::rows::array;
use super::WIDTH;
use crate::cpu::simd::Simd;

/// Values a span covers: a K-quant super-block.
const SPAN_VALUES: usize = 256;

/// One scale (or minimum) per group and column, laid out tile by tile as the codes are.
#[derive(Debug)]
pub(super) enum Scales {
    /// A half per group: entry `(t · count + g) · 16 + lane`.
    Halves(Vec<u16>),
    /// `base[span] · steps[group]`, exactly, spans of `1 << shift` groups: `base` entry
    /// `(t · spans + s) · 16 + lane` (halves), `steps` entry `(t · count + g) · 16 + lane`.
    Spans {
        shift: u32,
        base: Vec<u16>,
        steps: Vec<i8>,
    },
}

/// One tile's [`Scales`], what a kernel reads: group `g` counts from the tile's first.
#[derive(Clone, Copy)]
pub(super) enum TileScales<'a> {
    Halves(&'a [u16]),
    Spans {
        shift: u32,
        base: &'a [u16],
        steps: &'a [i8],
    },
}

impl Scales {
    /// `values` (row by row, `count` groups of `group` values each) for `rows` rows, as
    /// spans where every span factors exactly, else as halves (rounded); `None` where a value
    /// rounds to no normal half and is not zero.
    pub(super) fn new(values: &[f32], rows: usize, count: usize, group: usize) -> Option<Self> {
        Self::spans(values, rows, count, group).or_else(|| Self::halves(values, rows, count))
    }

    fn halves(values: &[f32], rows: usize, count: usize) -> Option<Self> {
        let mut out = vec![0; rows.div_ceil(WIDTH) * count * WIDTH];
        for row in 0..rows {
            for g in 0..count {
                out[slot(row, g, count)] = half(values[row * count + g])?;
            }
        }
        Some(Self::Halves(out))
    }

    fn spans(values: &[f32], rows: usize, count: usize, group: usize) -> Option<Self> {
        if group == 0 || !SPAN_VALUES.is_multiple_of(group) {
            return None;
        }
        let span = SPAN_VALUES / group;
        if !count.is_multiple_of(span) {
            return None;
        }
        let spans = count / span;
        let tiles = rows.div_ceil(WIDTH);
        let (mut base, mut steps) = (
            vec![0; tiles * spans * WIDTH],
            vec![0; tiles * count * WIDTH],
        );
        let mut factors = vec![0i8; span];
        for row in 0..rows {
            let row_values = &values[row * count..(row + 1) * count];
            for (s, chunk) in row_values.chunks_exact(span).enumerate() {
                base[slot(row, s, spans)] = factor(chunk, &mut factors)?;
                for (i, &n) in factors.iter().enumerate() {
                    steps[slot(row, s * span + i, count)] = n;
                }
            }
        }
        Some(Self::Spans {
            shift: span.trailing_zeros(),
            base,
            steps,
        })
    }

    /// Tile `t`'s scales, its groups `count`.
    #[inline(always)]
    pub(super) fn tile(&self, t: usize, count: usize) -> TileScales<'_> {
        let (first, last) = (t * count * WIDTH, (t + 1) * count * WIDTH);
        match self {
            Self::Halves(h) => TileScales::Halves(&h[first..last]),
            Self::Spans { shift, base, steps } => TileScales::Spans {
                shift: *shift,
                base: &base[first >> shift..last >> shift],
                steps: &steps[first..last],
            },
        }
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Self::Halves(h) => 2 * h.len(),
            Self::Spans { base, steps, .. } => 2 * base.len() + steps.len(),
        }
    }
}

impl TileScales<'_> {
    /// Group `g`'s sixteen scales.
    #[inline(always)]
    pub(super) fn get<S: Simd>(self, s: S, g: usize) -> S::V {
        match self {
            Self::Halves(h) => s.f16(array(h, g * WIDTH)),
            Self::Spans { shift, base, steps } => s.mul(
                s.f16(array(base, (g >> shift) * WIDTH)),
                s.bytes(array(steps, g * WIDTH)),
            ),
        }
    }
}

/// Where group `g` of row `row` (of `count` a row) lies in a tiled layout: tile by tile, group
/// by group, 16 rows side by side.
fn slot(row: usize, g: usize, count: usize) -> usize {
    ((row / WIDTH) * count + g) * WIDTH + row % WIDTH
}

/// `values` as one half `d` times a signed byte each, exactly (`values[i] = d · steps[i]` in
/// f32): `d`'s bits with the bytes in `steps`, or `None` where no such pair exists.
fn factor(values: &[f32], steps: &mut [i8]) -> Option<u16> {
    let largest = values
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if largest == 0.0 {
        steps.fill(0);
        return Some(0);
    }
    // The byte of the largest value: ggml's quantizers make it 63 (Q4_K and Q5_K) or -128
    // (Q6_K); every other is tried after those.
    [63, -128].into_iter().chain(-128..=127).find_map(|k: i32| {
        let d = f16::from_f32(largest / k as f32);
        let step = d.to_f32();
        // A subnormal half is exact too (a random-weight model's Q4_K halves are).
        if k == 0 || !d.is_finite() || step * k as f32 != largest {
            return None;
        }
        for (&v, n) in values.iter().zip(steps.iter_mut()) {
            let q = (v / step).round();
            if !(-128.0..=127.0).contains(&q) || q * step != v {
                return None;
            }
            *n = q as i8;
        }
        Some(d.to_bits())
    })
}

/// `v` as the bit pattern of the nearest IEEE half, where that is within 1/2048 of it (zero or
/// in the halves' normal range).
fn half(v: f32) -> Option<u16> {
    let h = f16::from_f32(v);
    (v == 0.0 || (h.is_normal() && v.is_finite())).then_some(h.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::{Isa, Kernel};

    /// Group `g` of a tile's scales, read as a kernel reads it.
    struct Read<'a>(TileScales<'a>, usize);

    impl Kernel for Read<'_> {
        type Output = [f32; 16];

        #[inline(always)]
        fn run<S: Simd, const T: usize>(self, s: S) -> [f32; 16] {
            let mut out = [0f32; 16];
            s.store(self.0.get(s, self.1), &mut out);
            out
        }
    }

    /// Scales as a Q4_K file holds them (`sign` 1) or a Q6_K file (`sign` -1): per 256
    /// values a half near `base`, times a byte per group whose largest magnitude is 63 or
    /// 128. Most products are no halves.
    fn k_quant(rows: usize, count: usize, group: usize, sign: i32, base: f32) -> Vec<f32> {
        let span = 256 / group;
        (0..rows * count)
            .map(|i| {
                let d = f16::from_f32(base * (1.0 + 0.07 * (i / span) as f32)).to_f32();
                let n = match (i % span, sign) {
                    (0, 1) => 63,
                    (0, _) => -128,
                    (j, _) => sign * ((j * 29 + i / span * 7) % 64) as i32,
                };
                d * n as f32
            })
            .collect()
    }

    #[test]
    fn k_quant_scales_are_held_exactly_as_a_byte_each() {
        // 37 rows: a part tile; 16 groups of 32 or 32 of 16: two spans a row.
        let rows: usize = 37;
        let columns = rows.next_multiple_of(WIDTH);
        // Halves with 11 significant bits, and subnormal ones (below 6.1e-5).
        for (group, sign, base) in [(32, 1, 0.01), (16, -1, 0.01), (32, 1, 2e-5), (16, -1, 2e-5)] {
            let count = 512 / group;
            let values = k_quant(rows, count, group, sign, base);
            let Some(scales) = Scales::new(&values, rows, count, group) else {
                panic!("group {group}: no scales");
            };
            assert!(matches!(scales, Scales::Spans { .. }), "group {group}");
            // A byte per group and column, a half per span and column.
            assert_eq!(scales.bytes(), columns * count + 2 * columns * 2);
            for isa in [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Portable] {
                if !isa.supported() {
                    continue;
                }
                for row in 0..rows {
                    for g in 0..count {
                        let got = isa.run(Read(scales.tile(row / WIDTH, count), g));
                        assert_eq!(
                            got[row % WIDTH],
                            values[row * count + g],
                            "{isa:?} {row} {g}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scales_no_byte_factors_are_held_as_halves() {
        // Independent halves per group (as Q4_0 and Q8_0 ship them), and a span's scales
        // whose ratios are no bytes.
        let independent: Vec<f32> = (0..8 * 16).map(|i| 0.1 + 0.013 * i as f32).collect();
        let mut ratios = vec![0.5f32; 8 * 16];
        ratios[3] = 0.5 * 1.001;
        for values in [independent, ratios] {
            let Some(Scales::Halves(halves)) = Scales::new(&values, 8, 16, 32) else {
                panic!("not halves");
            };
            let lane = |row: usize, g: usize| halves[g * WIDTH + row];
            assert_eq!(
                f16::from_bits(lane(7, 15)).to_f32(),
                f16::from_f32(values[7 * 16 + 15]).to_f32()
            );
        }
        // A scale no half holds (below their normal range): the caller keeps f32 inputs.
        assert!(Scales::new(&[1e-6, 0.5], 1, 2, 32).is_none());
    }
}
