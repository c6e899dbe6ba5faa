//! A weight matrix in the precision it was shipped in, laid out for the CPU's kernels.
//!
//! Each matrix is `rows × cols`, row-major (a linear layer's PyTorch layout: one row per output
//! feature). Quantized GGUF types are repacked once, at load, into two code layouts the kernels
//! read directly; no step ever converts a whole matrix again:
//! - [`Codes::Q4`]: 4-bit codes in groups of 32 (16 bytes: the low nibbles hold values 0..16,
//!   the high nibbles 16..32), each value `(code - offset) · scale + min` (Q4_0, Q4_1, Q4_K);
//! - [`Codes::Q8`]: signed 8-bit codes in groups of 16 or 32, each value `code · scale + min`
//!   (Q8_0; Q5_K and Q6_K, whose 5- and 6-bit codes are widened to a byte).
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
    /// 4-bit codes in groups of 32.
    Q4 {
        /// Subtracted from every code before scaling (8 for Q4_0, else 0).
        offset: u8,
        /// One scale per group.
        scale: Vec<f32>,
        /// One minimum per group; empty when every minimum is zero.
        min: Vec<f32>,
        /// 16 bytes per group.
        codes: Vec<u8>,
    },
    /// Signed 8-bit codes in groups of `group`.
    Q8 {
        /// Values per group: 16 or 32.
        group: usize,
        /// One scale per group.
        scale: Vec<f32>,
        /// One minimum per group; empty when every minimum is zero.
        min: Vec<f32>,
        /// One byte per value.
        codes: Vec<i8>,
    },
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
            Codes::Q4 {
                scale, min, codes, ..
            } => codes.len() + (scale.len() + min.len()) * 4,
            Codes::Q8 {
                scale, min, codes, ..
            } => codes.len() + (scale.len() + min.len()) * 4,
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
        match &self.codes {
            Codes::F32(v) => out.copy_from_slice(&v[row * c..(row + 1) * c]),
            Codes::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[row * c..(row + 1) * c]) {
                    *o = bf16::from_bits(b).to_f32();
                }
            }
            Codes::F16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[row * c..(row + 1) * c]) {
                    *o = f16::from_bits(b).to_f32();
                }
            }
            Codes::Q4 {
                offset,
                scale,
                min,
                codes,
            } => {
                let groups = c / Q4_GROUP;
                for (g, o) in out.chunks_exact_mut(Q4_GROUP).enumerate() {
                    let at = row * groups + g;
                    let (s, m) = (scale[at], min.get(at).copied().unwrap_or(0.0));
                    let bytes = &codes[at * 16..(at + 1) * 16];
                    let (low, high) = o.split_at_mut(16);
                    for (j, &b) in bytes.iter().enumerate() {
                        low[j] = f32::from(i16::from(b & 15) - i16::from(*offset)) * s + m;
                        high[j] = f32::from(i16::from(b >> 4) - i16::from(*offset)) * s + m;
                    }
                }
            }
            Codes::Q8 {
                group,
                scale,
                min,
                codes,
            } => {
                let groups = c / group;
                for (g, o) in out.chunks_exact_mut(*group).enumerate() {
                    let at = row * groups + g;
                    let (s, m) = (scale[at], min.get(at).copied().unwrap_or(0.0));
                    for (o, &q) in o.iter_mut().zip(&codes[at * group..(at + 1) * group]) {
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

    /// The same matrix with its rows in `order` (row `i` of the result is row `order[i]`).
    pub fn with_rows(&self, order: &[usize]) -> Self {
        fn pick<T: Copy>(v: &[T], per_row: usize, order: &[usize]) -> Vec<T> {
            order
                .iter()
                .flat_map(|&r| &v[r * per_row..(r + 1) * per_row])
                .copied()
                .collect()
        }
        let c = self.cols;
        let codes = match &self.codes {
            Codes::F32(v) => Codes::F32(pick(v, c, order)),
            Codes::Bf16(v) => Codes::Bf16(pick(v, c, order)),
            Codes::F16(v) => Codes::F16(pick(v, c, order)),
            Codes::Q4 {
                offset,
                scale,
                min,
                codes,
            } => {
                let groups = c / Q4_GROUP;
                Codes::Q4 {
                    offset: *offset,
                    scale: pick(scale, groups, order),
                    min: if min.is_empty() {
                        Vec::new()
                    } else {
                        pick(min, groups, order)
                    },
                    codes: pick(codes, c / 2, order),
                }
            }
            Codes::Q8 {
                group,
                scale,
                min,
                codes,
            } => {
                let groups = c / group;
                Codes::Q8 {
                    group: *group,
                    scale: pick(scale, groups, order),
                    min: if min.is_empty() {
                        Vec::new()
                    } else {
                        pick(min, groups, order)
                    },
                    codes: pick(codes, c, order),
                }
            }
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
        let rows = parts.iter().map(|p| p.rows).sum();
        let cols = parts.first().map_or(0, |p| p.cols);
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            return Packed::f32(0, 0, Vec::new());
        };
        let mut acc = first;
        for next in parts {
            let (a, b) = unify(acc, next);
            acc = join(a, b);
        }
        debug_assert_eq!((acc.rows, acc.cols), (rows, cols));
        acc
    }

    /// 8-bit codes in groups of `group` holding exactly the same values, where possible.
    fn widen_to_q8(&self, group: usize) -> Option<Packed> {
        let (scale, min, codes) = match &self.codes {
            Codes::Q4 {
                offset,
                scale,
                min,
                codes,
            } => {
                let mut wide = Vec::with_capacity(self.rows * self.cols);
                for g in codes.chunks_exact(16) {
                    wide.extend(g.iter().map(|b| (b & 15) as i8 - *offset as i8));
                    wide.extend(g.iter().map(|b| (b >> 4) as i8 - *offset as i8));
                }
                (scale.clone(), min.clone(), wide)
            }
            Codes::Q8 {
                scale, min, codes, ..
            } => (scale.clone(), min.clone(), codes.clone()),
            _ => return None,
        };
        let from = match &self.codes {
            Codes::Q8 { group, .. } => *group,
            _ => Q4_GROUP,
        };
        if from == group {
            return Some(self.with_codes(Codes::Q8 {
                group,
                scale,
                min,
                codes,
            }));
        }
        if from != 2 * group {
            return None;
        }
        let twice = |v: Vec<f32>| v.into_iter().flat_map(|s| [s, s]).collect::<Vec<_>>();
        Some(self.with_codes(Codes::Q8 {
            group,
            scale: twice(scale),
            min: twice(min),
            codes,
        }))
    }

    fn with_codes(&self, codes: Codes) -> Packed {
        Packed {
            rows: self.rows,
            cols: self.cols,
            codes,
        }
    }
}

/// The two matrices in one layout that holds both exactly.
fn unify(a: Packed, b: Packed) -> (Packed, Packed) {
    let same = match (&a.codes, &b.codes) {
        (Codes::F32(_), Codes::F32(_))
        | (Codes::Bf16(_), Codes::Bf16(_))
        | (Codes::F16(_), Codes::F16(_)) => true,
        (
            Codes::Q4 {
                offset: x, min: m, ..
            },
            Codes::Q4 {
                offset: y, min: n, ..
            },
        ) => x == y && m.is_empty() == n.is_empty(),
        (
            Codes::Q8 {
                group: x, min: m, ..
            },
            Codes::Q8 {
                group: y, min: n, ..
            },
        ) => x == y && m.is_empty() == n.is_empty(),
        _ => false,
    };
    if same {
        return (a, b);
    }
    let group = |p: &Packed| match &p.codes {
        Codes::Q8 { group, .. } => Some(*group),
        Codes::Q4 { .. } => Some(Q4_GROUP),
        _ => None,
    };
    if let (Some(x), Some(y)) = (group(&a), group(&b)) {
        let g = x.min(y);
        if let (Some(wa), Some(wb)) = (a.widen_to_q8(g), b.widen_to_q8(g)) {
            return (with_mins(wa), with_mins(wb));
        }
    }
    let f = |p: &Packed| Packed::f32(p.rows, p.cols, p.to_f32());
    (f(&a), f(&b))
}

/// The same 8-bit matrix with its (zero) minimums spelled out, so it joins one that has some.
fn with_mins(mut p: Packed) -> Packed {
    if let Codes::Q8 { scale, min, .. } = &mut p.codes
        && min.is_empty()
    {
        *min = vec![0.0; scale.len()];
    }
    p
}

/// Row-wise concatenation of two matrices in the same layout.
fn join(a: Packed, b: Packed) -> Packed {
    let rows = a.rows + b.rows;
    let cols = a.cols;
    let cat = |mut x: Vec<f32>, y: Vec<f32>| {
        x.extend(y);
        x
    };
    let codes = match (a.codes, b.codes) {
        (Codes::F32(mut x), Codes::F32(y)) => {
            x.extend(y);
            Codes::F32(x)
        }
        (Codes::Bf16(mut x), Codes::Bf16(y)) => {
            x.extend(y);
            Codes::Bf16(x)
        }
        (Codes::F16(mut x), Codes::F16(y)) => {
            x.extend(y);
            Codes::F16(x)
        }
        (
            Codes::Q4 {
                offset,
                scale,
                min,
                mut codes,
            },
            Codes::Q4 {
                scale: s2,
                min: m2,
                codes: c2,
                ..
            },
        ) => {
            codes.extend(c2);
            Codes::Q4 {
                offset,
                scale: cat(scale, s2),
                min: cat(min, m2),
                codes,
            }
        }
        (
            Codes::Q8 {
                group,
                scale,
                min,
                mut codes,
            },
            Codes::Q8 {
                scale: s2,
                min: m2,
                codes: c2,
                ..
            },
        ) => {
            codes.extend(c2);
            Codes::Q8 {
                group,
                scale: cat(scale, s2),
                min: cat(min, m2),
                codes,
            }
        }
        (x, y) => {
            // `unify` never hands two layouts here; widen to f32 rather than fail.
            let (pa, pb) = (
                Packed {
                    rows: a.rows,
                    cols,
                    codes: x,
                },
                Packed {
                    rows: b.rows,
                    cols,
                    codes: y,
                },
            );
            let mut v = pa.to_f32();
            v.extend(pb.to_f32());
            Codes::F32(v)
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
                scale: (0..groups).map(|g| 0.5 + g as f32 / 8.0).collect(),
                min: if with_min {
                    (0..groups).map(|g| -(g as f32) / 4.0).collect()
                } else {
                    Vec::new()
                },
                codes: (0..groups * 16).map(|i| (i * 37 % 256) as u8).collect(),
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
    fn reordering_rows_moves_whole_rows() {
        let m = q4(3, 0, true);
        let all = m.to_f32();
        let moved = m.with_rows(&[2, 0, 1]).to_f32();
        assert_eq!(moved[..64], all[128..]);
        assert_eq!(moved[64..128], all[..64]);
    }
}
