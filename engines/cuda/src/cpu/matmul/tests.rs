use super::*;
use crate::cpu::simd::Isa;
use crate::model::packed::{Codes, Groups};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 29) as f32 / 14.0 - 1.0)
        .collect()
}

fn matrices(rows: usize) -> Vec<Packed> {
    let (k, tail) = (64, 37);
    let groups = rows * k / 32;
    let bits = |v: &[f32], f: fn(f32) -> u16| v.iter().map(|&x| f(x)).collect::<Vec<u16>>();
    let float = values(rows * tail, 1);
    let q4 = |offset: u8, with_min: bool| Packed {
        rows,
        cols: k,
        codes: Codes::Q4 {
            offset,
            groups: Groups {
                scale: values(groups, 2).iter().map(|s| s / 3.0 + 0.5).collect(),
                min: if with_min {
                    values(groups, 3)
                } else {
                    Vec::new()
                },
                codes: (0..groups * 16).map(|i| (i * 59 % 256) as u8).collect(),
            },
        },
    };
    let q8 = |group: usize, with_min: bool| Packed {
        rows,
        cols: k,
        codes: Codes::Q8 {
            group,
            groups: Groups {
                scale: values(rows * k / group, 4),
                min: if with_min {
                    values(rows * k / group, 5)
                } else {
                    Vec::new()
                },
                codes: (0..rows * k).map(|i| (i * 97 % 256) as u8 as i8).collect(),
            },
        },
    };
    vec![
        Packed::f32(rows, tail, float.clone()),
        Packed {
            rows,
            cols: tail,
            codes: Codes::Bf16(bits(&float, |x| half::bf16::from_f32(x).to_bits())),
        },
        Packed {
            rows,
            cols: tail,
            codes: Codes::F16(bits(&float, |x| half::f16::from_f32(x).to_bits())),
        },
        q4(8, false),
        q4(0, true),
        q8(32, false),
        q8(16, true),
    ]
}

#[test]
fn every_layout_and_instruction_set_matches_a_naive_product() {
    let n = 29;
    let bias = values(n, 6);
    for w in matrices(n) {
        let k = w.cols;
        let dense = w.to_f32();
        for m in [1, 2, 3, 5, 9, 17, 33, 41] {
            let x = values(m * k, m);
            let want: Vec<f32> = (0..m * n)
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    let dot: f64 = (0..k)
                        .map(|j| f64::from(x[r * k + j]) * f64::from(dense[c * k + j]))
                        .sum();
                    dot as f32 + bias[c]
                })
                .collect();
            for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
                if !isa.supported() {
                    continue;
                }
                let mut out = vec![0.0; m * n];
                linear_with(isa, &x, &w, Some(&bias), &mut out);
                for (i, (got, want)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{} m={m} {isa:?} [{i}]: {got} vs {want}",
                        w.kind()
                    );
                }
            }
        }
    }
}
