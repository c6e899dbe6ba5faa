//! A weight matrix in the precision it was shipped in, laid out for the CPU's kernels.
//!
//! Each matrix is `rows × cols`, row-major (a linear layer's PyTorch layout: one row per output
//! feature). Quantized GGUF types are repacked once, at load, into two code layouts the kernels
//! read directly; no step ever converts a whole matrix again:
//! - [`Codes::Q4`]: 4-bit codes in groups of 32 (16 bytes: the low nibbles hold values 0..16,
//!   the high nibbles 16..32), each value `(code - offset) · scale + min` (Q4_0, Q4_1, Q4_K);
//! - [`Codes::Q8`]: signed 8-bit codes in groups of 16 or 32, each value `code · scale + min`
//!   (Q8_0; Q5_K, Q6_K and the low-bit types of `gguf::low_bit` (Q5_0, Q5_1, Q2_K, Q3_K,
//!   IQ4_NL, IQ4_XS), whose narrower codes are widened to a byte).
//!
//! Each formula is the one ggml's reference dequantizer evaluates (a product, then a sum, both
//! in f32), so a value the kernels compute is bit for bit the value `gguf` dequantizes to. bf16
//! and f16 checkpoints stay 16-bit; f32 stays f32.

use half::{bf16, f16};

/// One weight matrix, in its own precision.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The values.
    pub codes: Codes,
}

/// How a [`Packed`] matrix stores its values.
#[derive(Debug, Clone, PartialEq)]
pub enum Codes {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// bfloat16 bit patterns.
    Bf16(Vec<u16>),
    /// IEEE half bit patterns.
    F16(Vec<u16>),
    /// 4-bit codes in groups of 32, two to a byte (16 bytes per group).
    Q4 {
        /// Subtracted from every code before scaling (8 for Q4_0, else 0).
        offset: u8,
        /// The groups.
        groups: Groups<u8>,
    },
    /// Signed 8-bit codes in groups of `group`.
    Q8 {
        /// Values per group: 16 or 32.
        group: usize,
        /// The groups.
        groups: Groups<i8>,
    },
}

/// Codes in groups, each with a scale and a minimum, row-major.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Groups<T> {
    /// One scale per group.
    pub scale: Vec<f32>,
    /// One minimum per group; empty when every minimum is zero.
    pub min: Vec<f32>,
    /// The codes.
    pub codes: Vec<T>,
}

impl<T: Copy> Groups<T> {
    /// Group `at`'s minimum.
    #[inline(always)]
    pub fn min_at(&self, at: usize) -> f32 {
        if self.min.is_empty() {
            0.0
        } else {
            self.min[at]
        }
    }

    fn bytes(&self) -> usize {
        self.codes.len() * size_of::<T>() + (self.scale.len() + self.min.len()) * 4
    }

    /// The groups of rows `order`, with `groups` groups and `codes` codes per row.
    fn rows(&self, order: &[usize], groups: usize, codes: usize) -> Self {
        let min = if self.min.is_empty() {
            Vec::new()
        } else {
            pick(&self.min, groups, order)
        };
        Self {
            scale: pick(&self.scale, groups, order),
            min,
            codes: pick(&self.codes, codes, order),
        }
    }

    /// These groups, then `other`'s (minimums spelled out where only one side has them).
    fn append(mut self, mut other: Self) -> Self {
        if self.min.is_empty() != other.min.is_empty() {
            self.spell_out_mins();
            other.spell_out_mins();
        }
        self.scale.extend(other.scale);
        self.min.extend(other.min);
        self.codes.extend(other.codes);
        self
    }

    fn spell_out_mins(&mut self) {
        if self.min.is_empty() {
            self.min = vec![0.0; self.scale.len()];
        }
    }
}

/// Rows `order` of `v`, `per_row` items each.
fn pick<T: Copy>(v: &[T], per_row: usize, order: &[usize]) -> Vec<T> {
    order
        .iter()
        .flat_map(|&r| &v[r * per_row..(r + 1) * per_row])
        .copied()
        .collect()
}

/// Values per group of [`Codes::Q4`].
pub const Q4_GROUP: usize = 32;

impl Packed {
    /// An f32 matrix.
    pub fn f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        Self {
            rows,
            cols,
            codes: Codes::F32(data),
        }
    }

    /// The values, when they are f32 (norms and biases always are).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.codes {
            Codes::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Bytes the values take in memory.
    pub fn bytes(&self) -> usize {
        match &self.codes {
            Codes::F32(v) => v.len() * 4,
            Codes::Bf16(v) | Codes::F16(v) => v.len() * 2,
            Codes::Q4 { groups, .. } => groups.bytes(),
            Codes::Q8 { groups, .. } => groups.bytes(),
        }
    }

    /// The precision's name, for logs.
    pub fn kind(&self) -> &'static str {
        match &self.codes {
            Codes::F32(_) => "f32",
            Codes::Bf16(_) => "bf16",
            Codes::F16(_) => "f16",
            Codes::Q4 { .. } => "q4",
            Codes::Q8 { .. } => "q8",
        }
    }

    /// Writes row `row` as f32 into `out` (`cols` long).
    pub fn row_into(&self, row: usize, out: &mut [f32]) {
        let c = self.cols;
        let range = row * c..(row + 1) * c;
        match &self.codes {
            Codes::F32(v) => out.copy_from_slice(&v[range]),
            Codes::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[range]) {
                    *o = bf16::from_bits(b).to_f32();
                }
            }
            Codes::F16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[range]) {
                    *o = f16::from_bits(b).to_f32();
                }
            }
            Codes::Q4 { offset, groups } => {
                let per_row = c / Q4_GROUP;
                for (g, o) in out.chunks_exact_mut(Q4_GROUP).enumerate() {
                    let at = row * per_row + g;
                    let (s, m) = (groups.scale[at], groups.min_at(at));
                    let bytes = &groups.codes[at * 16..(at + 1) * 16];
                    let (low, high) = o.split_at_mut(16);
                    for (j, &b) in bytes.iter().enumerate() {
                        low[j] = f32::from(i16::from(b & 15) - i16::from(*offset)) * s + m;
                        high[j] = f32::from(i16::from(b >> 4) - i16::from(*offset)) * s + m;
                    }
                }
            }
            Codes::Q8 { group, groups } => {
                let per_row = c / group;
                for (g, o) in out.chunks_exact_mut(*group).enumerate() {
                    let at = row * per_row + g;
                    let (s, m) = (groups.scale[at], groups.min_at(at));
                    let codes = &groups.codes[at * group..(at + 1) * group];
                    for (o, &q) in o.iter_mut().zip(codes) {
                        *o = f32::from(q) * s + m;
                    }
                }
            }
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.row_into(r, row);
            }
        }
        out
    }

    /// A float matrix rounded to signed 8-bit codes in groups of `group` (which must divide
    /// `cols`), each group's step its largest magnitude / 127, as ggml's Q8_0 rounds; `None`
    /// for a matrix whose values are codes already.
    pub fn rounded_to_q8(&self, group: usize) -> Option<Packed> {
        if !matches!(self.codes, Codes::F32(_) | Codes::Bf16(_) | Codes::F16(_))
            || group == 0
            || !self.cols.is_multiple_of(group)
        {
            return None;
        }
        let values = self.to_f32();
        let mut groups = Groups {
            scale: Vec::with_capacity(values.len() / group),
            min: Vec::new(),
            codes: Vec::with_capacity(values.len()),
        };
        for chunk in values.chunks_exact(group) {
            let largest = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inverse = if largest > 0.0 { 127.0 / largest } else { 0.0 };
            groups.scale.push(largest / 127.0);
            groups.codes.extend(
                chunk
                    .iter()
                    .map(|v| (v * inverse).round().clamp(-127.0, 127.0) as i8),
            );
        }
        Some(Packed {
            rows: self.rows,
            cols: self.cols,
            codes: Codes::Q8 { group, groups },
        })
    }

    /// The same matrix with its rows in `order` (row `i` of the result is row `order[i]`).
    pub fn with_rows(&self, order: &[usize]) -> Self {
        let c = self.cols;
        let codes = match &self.codes {
            Codes::F32(v) => Codes::F32(pick(v, c, order)),
            Codes::Bf16(v) => Codes::Bf16(pick(v, c, order)),
            Codes::F16(v) => Codes::F16(pick(v, c, order)),
            Codes::Q4 { offset, groups } => Codes::Q4 {
                offset: *offset,
                groups: groups.rows(order, c / Q4_GROUP, c / 2),
            },
            Codes::Q8 { group, groups } => Codes::Q8 {
                group: *group,
                groups: groups.rows(order, c / group, c),
            },
        };
        Self {
            rows: order.len(),
            cols: c,
            codes,
        }
    }

    /// Stacks matrices of equal width row-wise (q, k and v into one). Matrices in one layout
    /// are joined as they are; mixed ones are widened to the narrowest layout that holds every
    /// value exactly (4-bit codes into 8-bit ones, groups of 32 into groups of 16, anything
    /// else into f32).
    pub fn stack(parts: Vec<Packed>) -> Packed {
        let mut parts = parts.into_iter();
        let Some(mut acc) = parts.next() else {
            return Packed::f32(0, 0, Vec::new());
        };
        for next in parts {
            acc = join(acc, next);
        }
        acc
    }

    /// Stacks matrices of equal width row-wise as [`Self::stack`] does, joining only
    /// neighbours in one layout: the others stay apart, each in its own, where `stack` would
    /// widen them all (a Q4_K_M file's Q4_K queries and keys beside Q6_K values would take
    /// twice their bytes as 8-bit codes in groups of 16).
    pub fn stack_runs(parts: Vec<Packed>) -> Vec<Packed> {
        let mut runs: Vec<Packed> = Vec::new();
        for next in parts {
            match runs.pop() {
                Some(last) if last.same_layout(&next) => runs.push(join(last, next)),
                Some(last) => runs.extend([last, next]),
                None => runs.push(next),
            }
        }
        runs
    }

    /// Whether `other`'s values join this matrix's without widening either.
    fn same_layout(&self, other: &Packed) -> bool {
        match (&self.codes, &other.codes) {
            (Codes::F32(_), Codes::F32(_))
            | (Codes::Bf16(_), Codes::Bf16(_))
            | (Codes::F16(_), Codes::F16(_)) => true,
            (Codes::Q4 { offset, .. }, Codes::Q4 { offset: o, .. }) => offset == o,
            (Codes::Q8 { group, .. }, Codes::Q8 { group: g, .. }) => group == g,
            _ => false,
        }
    }

    /// The same values as 8-bit codes in groups of `group`, where that holds them exactly.
    fn widen_to_q8(&self, group: usize) -> Option<Groups<i8>> {
        let (from, groups) = match &self.codes {
            Codes::Q4 { offset, groups } => {
                let mut wide = Vec::with_capacity(self.rows * self.cols);
                for g in groups.codes.chunks_exact(16) {
                    wide.extend(g.iter().map(|b| (b & 15) as i8 - *offset as i8));
                    wide.extend(g.iter().map(|b| (b >> 4) as i8 - *offset as i8));
                }
                let groups = Groups {
                    scale: groups.scale.clone(),
                    min: groups.min.clone(),
                    codes: wide,
                };
                (Q4_GROUP, groups)
            }
            Codes::Q8 { group, groups } => (*group, groups.clone()),
            _ => return None,
        };
        if from == group {
            return Some(groups);
        }
        if from != 2 * group {
            return None;
        }
        let twice = |v: Vec<f32>| v.into_iter().flat_map(|s| [s, s]).collect();
        Some(Groups {
            scale: twice(groups.scale),
            min: twice(groups.min),
            codes: groups.codes,
        })
    }

    /// The group size of a quantized layout.
    fn group(&self) -> Option<usize> {
        match &self.codes {
            Codes::Q8 { group, .. } => Some(*group),
            Codes::Q4 { .. } => Some(Q4_GROUP),
            _ => None,
        }
    }
}

/// `x`, then `y`.
fn cat<T>(mut x: Vec<T>, y: Vec<T>) -> Vec<T> {
    x.extend(y);
    x
}

/// `a`'s rows, then `b`'s, in one layout that holds both exactly.
fn join(a: Packed, b: Packed) -> Packed {
    let rows = a.rows + b.rows;
    let cols = a.cols;
    let codes = match (a.codes, b.codes) {
        (Codes::F32(x), Codes::F32(y)) => Codes::F32(cat(x, y)),
        (Codes::Bf16(x), Codes::Bf16(y)) => Codes::Bf16(cat(x, y)),
        (Codes::F16(x), Codes::F16(y)) => Codes::F16(cat(x, y)),
        (
            Codes::Q4 { offset, groups: x },
            Codes::Q4 {
                offset: o,
                groups: y,
            },
        ) if offset == o => Codes::Q4 {
            offset,
            groups: x.append(y),
        },
        (
            Codes::Q8 { group, groups: x },
            Codes::Q8 {
                group: g,
                groups: y,
            },
        ) if group == g => Codes::Q8 {
            group,
            groups: x.append(y),
        },
        (a_codes, b_codes) => {
            let (a, b) = (
                Packed {
                    rows: a.rows,
                    cols,
                    codes: a_codes,
                },
                Packed {
                    rows: b.rows,
                    cols,
                    codes: b_codes,
                },
            );
            let wide = match (a.group(), b.group()) {
                (Some(x), Some(y)) => {
                    let group = x.min(y);
                    a.widen_to_q8(group)
                        .zip(b.widen_to_q8(group))
                        .map(|(x, y)| Codes::Q8 {
                            group,
                            groups: x.append(y),
                        })
                }
                _ => None,
            };
            wide.unwrap_or_else(|| Codes::F32(cat(a.to_f32(), b.to_f32())))
        }
    };
    Packed { rows, cols, codes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q4(rows: usize, offset: u8, with_min: bool) -> Packed {
        let cols = 64;
        let groups = rows * cols / 32;
        Packed {
            rows,
            cols,
            codes: Codes::Q4 {
                offset,
                groups: Groups {
                    scale: (0..groups).map(|g| 0.5 + g as f32 / 8.0).collect(),
                    min: if with_min {
                        (0..groups).map(|g| -(g as f32) / 4.0).collect()
                    } else {
                        Vec::new()
                    },
                    codes: (0..groups * 16).map(|i| (i * 37 % 256) as u8).collect(),
                },
            },
        }
    }

    #[test]
    fn stacking_mixed_layouts_keeps_every_value() {
        let parts = [q4(2, 8, false), q4(3, 0, true), q4(1, 0, true)];
        let want: Vec<f32> = parts.iter().flat_map(Packed::to_f32).collect();
        let stacked = Packed::stack(parts.to_vec());
        assert_eq!(stacked.kind(), "q8");
        assert_eq!(stacked.to_f32(), want);
        let same = Packed::stack(vec![q4(2, 0, true), q4(3, 0, true)]);
        assert_eq!(same.kind(), "q4");
        let f = Packed::f32(1, 64, (0..64).map(|i| i as f32).collect());
        let mixed = Packed::stack(vec![q4(1, 0, true), f.clone()]);
        assert_eq!(mixed.kind(), "f32");
        assert_eq!(mixed.to_f32()[64..], f.to_f32()[..]);
    }

    #[test]
    fn stacking_runs_joins_one_layout_and_keeps_the_others_apart() {
        let runs = Packed::stack_runs(vec![q4(2, 0, true), q4(3, 0, false), q4(1, 8, false)]);
        let shapes: Vec<_> = runs.iter().map(|p| (p.kind(), p.rows)).collect();
        assert_eq!(shapes, [("q4", 5), ("q4", 1)]);
        let want: Vec<f32> = [q4(2, 0, true), q4(3, 0, false)]
            .iter()
            .flat_map(Packed::to_f32)
            .collect();
        assert_eq!(runs[0].to_f32(), want);
    }

    #[test]
    fn rounding_floats_to_bytes_moves_each_value_by_at_most_half_its_groups_step() {
        let values: Vec<f32> = (0..3 * 64)
            .map(|i| ((i * 7919 % 257) as f32 - 128.0) / 37.0)
            .collect();
        let f = Packed::f32(3, 64, values.clone());
        let q = f.rounded_to_q8(32).expect("an f32 matrix rounds");
        assert_eq!(q.kind(), "q8");
        for (group, got) in values.chunks(32).zip(q.to_f32().chunks(32)) {
            let step = group.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (v, g) in group.iter().zip(got) {
                assert!((v - g).abs() <= step / 2.0 * 1.0001, "{v} became {g}");
            }
        }
        assert!(q4(1, 0, false).rounded_to_q8(32).is_none());
        assert!(f.rounded_to_q8(48).is_none());
    }

    #[test]
    fn reordering_rows_moves_whole_rows() {
        let m = q4(3, 0, true);
        let all = m.to_f32();
        let moved = m.with_rows(&[2, 0, 1]).to_f32();
        assert_eq!(moved[..64], all[128..]);
        assert_eq!(moved[64..128], all[..64]);
    }
}
