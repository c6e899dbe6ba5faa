use super::*;
use crate::cpu::simd::Isa;
use crate::model::packed::{Codes, Groups};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 29) as f32 / 14.0 - 1.0)
        .collect()
}

/// Values as the nearest IEEE halves: the scales and minimums of the files' 4- and 8-bit
/// types are halves, and the byte kernels hold them so.
fn halves(v: Vec<f32>) -> Vec<f32> {
    v.into_iter()
        .map(|x| half::f16::from_f32(x).to_f32())
        .collect()
}

fn matrices(rows: usize, k: usize) -> Vec<Packed> {
    let tail = 37;
    let groups = rows * k / 32;
    let bits = |v: &[f32], f: fn(f32) -> u16| v.iter().map(|&x| f(x)).collect::<Vec<u16>>();
    let float = values(rows * tail, 1);
    let q4 = |offset: u8, with_min: bool| Packed {
        rows,
        cols: k,
        codes: Codes::Q4 {
            offset,
            groups: Groups {
                scale: halves(values(groups, 2).iter().map(|s| s / 3.0 + 0.5).collect()),
                min: if with_min {
                    halves(values(groups, 3))
                } else {
                    Vec::new()
                },
                codes: (0..groups * 16).map(|i| (i * 59 % 256) as u8).collect(),
            },
        },
    };
    // `six`: codes within -32..=31, which the byte kernels hold in 6 bits.
    let q8 = |group: usize, with_min: bool, six: bool| Packed {
        rows,
        cols: k,
        codes: Codes::Q8 {
            group,
            groups: Groups {
                scale: halves(values(rows * k / group, 4)),
                min: if with_min {
                    halves(values(rows * k / group, 5))
                } else {
                    Vec::new()
                },
                codes: (0..rows * k)
                    .map(|i| match six {
                        true => (i * 97 % 64) as i8 - 32,
                        false => (i * 97 % 256) as u8 as i8,
                    })
                    .collect(),
            },
        },
    };
    // As the K-quants hold scales and minimums: a half per 256 values times a byte per group
    // (63 the largest in Q4_K, -128 in Q6_K); with 4 significant bits in each half, every
    // product is a half too, so either form of the tiles holds them exactly.
    let spans = |group: usize, largest: i32, seed: usize| -> Vec<f32> {
        let per = 256 / group;
        (0..rows * k / group)
            .map(|i| {
                let d = (1.0 + ((i / per + seed) % 8) as f32 / 8.0) / 64.0;
                let n = if i % per == seed % per {
                    largest
                } else {
                    (i * 37 + seed) as i32 % 120 - 60
                };
                d * n as f32
            })
            .collect()
    };
    let q4_k = Packed {
        rows,
        cols: k,
        codes: Codes::Q4 {
            offset: 0,
            groups: Groups {
                scale: spans(32, 63, 1).into_iter().map(f32::abs).collect(),
                min: spans(32, -63, 2),
                codes: (0..groups * 16).map(|i| (i * 61 % 256) as u8).collect(),
            },
        },
    };
    let q6_k = Packed {
        rows,
        cols: k,
        codes: Codes::Q8 {
            group: 16,
            groups: Groups {
                scale: spans(16, -128, 3),
                min: Vec::new(),
                codes: (0..rows * k).map(|i| (i * 89 % 64) as i8 - 32).collect(),
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
        q8(32, false, false),
        q8(16, true, false),
        q8(16, false, true),
        q8(32, true, true),
        q4_k,
        q6_k,
    ]
}

/// Each input rounded as [`int8::Inputs`] rounds it: to a multiple of its group's largest
/// magnitude / 127, in the weights' groups.
fn rounded(x: &[f32], k: usize, size: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(k) {
        for group in row.chunks(size) {
            let largest = group.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = largest / 127.0;
            out.extend(group.iter().map(|&v| {
                if largest > 0.0 {
                    (v * (127.0 / largest)).round() * step
                } else {
                    0.0
                }
            }));
        }
    }
    out
}

/// `x · wᵀ + bias` in f64 from the weights' values, and the sum of the terms' magnitudes
/// (what f32 rounding scales with); with `bytes`, the inputs rounded as the int8 kernels round
/// them.
fn naive(x: &[f32], w: &Packed, bias: &[f32], bytes: bool) -> Vec<(f32, f32)> {
    let (n, k) = (w.rows, w.cols);
    let m = x.len() / k;
    let dense = w.to_f32();
    let size = input_group(w);
    let near = if bytes {
        rounded(x, k, size)
    } else {
        x.to_vec()
    };
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            let (mut dot, mut size) = (0f64, 0f64);
            for j in 0..k {
                let (v, exact, near) = (dense[c * k + j], x[r * k + j], near[r * k + j]);
                dot += f64::from(v) * f64::from(near);
                size += f64::from(v).abs() * f64::from(exact).abs();
            }
            (dot as f32 + bias[c], size as f32)
        })
        .collect()
}

#[test]
fn every_layout_and_instruction_set_matches_a_naive_product() {
    let n = 29;
    let bias = values(n, 6);
    // 512: two K-quant spans of 256 values a row.
    for k in [64, 288, 512] {
        for w in matrices(n, k) {
            let k = w.cols;
            let quantized = quantized(&w);
            let size = input_group(&w);
            let dense = w.to_f32();
            // Every count of rows a pass takes at once (up to eight) and a few past it.
            for m in [1, 2, 3, 4, 5, 6, 7, 9, 13, 15, 17, 33, 41] {
                let x = values(m * k, m);
                let (near, exact) = (naive(&x, &w, &bias, quantized), naive(&x, &w, &bias, false));
                for inputs in [Activations::Exact, Activations::Int8] {
                    let bytes = inputs == Activations::Int8 && quantized;
                    for second in [SecondPass::Never, SecondPass::Prompts] {
                        let mut matrix = Matrix::new(w.clone());
                        matrix.round_inputs(inputs);
                        matrix.second_pass(second);
                        matrix.tiles_only();
                        // All rows decoding steps', the first half, none.
                        for rounded in [m, m / 2, 0] {
                            let once = match second {
                                SecondPass::Never => m,
                                SecondPass::Prompts => rounded,
                            };
                            for isa in [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Portable] {
                                if !isa.supported() {
                                    continue;
                                }
                                let mut out = vec![0.0; m * n];
                                linear_with(isa, &x, rounded, &matrix, Some(&bias), &mut out);
                                for (i, got) in out.iter().enumerate() {
                                    let (r, c) = (i / n, i % n);
                                    let ((want, sum), allowed) = if !bytes {
                                        (exact[i], 0.0)
                                    } else if r < once {
                                        (near[i], 0.0)
                                    } else {
                                        (exact[i], refined_bound(&dense, &x, k, r, c, size))
                                    };
                                    assert!(
                                        (got - want).abs()
                                            < 1e-4 * (1.0 + want.abs()) + 1e-6 * sum + allowed,
                                        "{} k={k} m={m} {rounded} rounded {inputs:?} {second:?} {isa:?} [{i}]: {got} vs {want}",
                                        w.kind()
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_sums_alone_as_in_any_batch() {
    // What lets a prefix-cache hit recompute a prompt's last position alone and give the
    // same logits as the whole prompt did, under byte products. Float products of
    // `panel::MIN_ROWS` rows and more go through decoded panels, which add in another order.
    let n = 37;
    for w in [288, 512].into_iter().flat_map(|k| matrices(n, k)) {
        let k = w.cols;
        let quantized = quantized(&w);
        for inputs in [Activations::Exact, Activations::Int8] {
            let bytes = quantized && inputs == Activations::Int8;
            for second in [SecondPass::Never, SecondPass::Prompts] {
                let mut matrix = Matrix::new(w.clone());
                matrix.round_inputs(inputs);
                matrix.second_pass(second);
                matrix.tiles_only();
                // 70 rows: more than a task's block of rows (`int8::ROW_BLOCK`).
                // 6, 7, 13, 15: what passes of eight leave, taken in one pass.
                for m in [2, 6, 7, 9, 13, 15, 17, 33, 41, 70] {
                    if !bytes && m >= panel::MIN_ROWS {
                        continue;
                    }
                    let x = values(m * k, m + 3);
                    // Decoding steps, then prompts.
                    for decoding in [true, false] {
                        let rounded = |rows: usize| if decoding { rows } else { 0 };
                        let mut batch = vec![0.0; m * n];
                        linear(&x, rounded(m), &matrix, None, &mut batch);
                        for r in [0, m / 2, m - 1] {
                            let mut alone = vec![0.0; n];
                            let row = &x[r * k..(r + 1) * k];
                            linear(row, rounded(1), &matrix, None, &mut alone);
                            assert_eq!(
                                alone,
                                batch[r * n..(r + 1) * n],
                                "{} {inputs:?} {second:?} decoding {decoding}: row {r} of {m}",
                                w.kind()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rounded_inputs_stay_close_to_the_exact_product() {
    // The bound a user can expect: each input moves by at most half a step (its group's
    // largest magnitude / 254), so a dot product moves by at most Σ|w|·step/2.
    let n = 29;
    let bias = vec![0.0; n];
    for w in matrices(n, 288) {
        if !quantized(&w) {
            continue;
        }
        let k = w.cols;
        let dense = w.to_f32();
        let x = values(4 * k, 7);
        let mut exact = vec![0.0; 4 * n];
        let mut bytes = vec![0.0; 4 * n];
        let size = input_group(&w);
        let mut rounded = Matrix::new(w.clone());
        rounded.round_inputs(Activations::Int8);
        linear(&x, 0, &Matrix::new(w.clone()), None, &mut exact);
        linear(&x, 4, &rounded, Some(&bias), &mut bytes);
        for (i, (e, b)) in exact.iter().zip(&bytes).enumerate() {
            let (r, c) = (i / n, i % n);
            let bound: f32 = (0..k)
                .map(|j| dense[c * k + j].abs() * group_largest(&x, r * k, j, size) / 254.0)
                .sum();
            assert!(
                (e - b).abs() <= bound * 1.001 + 1e-5,
                "[{i}] {e} vs {b} (bound {bound})"
            );
        }
    }
}

#[test]
fn a_refined_byte_product_is_within_a_step_of_a_step_of_exact() {
    let n = 29;
    for w in matrices(n, 288) {
        if !quantized(&w) {
            continue;
        }
        let k = w.cols;
        let dense = w.to_f32();
        let x = values(3 * k, 11);
        let mut exact = vec![0.0; 3 * n];
        let mut refined = vec![0.0; 3 * n];
        let mut head = Matrix::new(w.clone());
        head.round_inputs(Activations::Int8);
        head.second_pass(SecondPass::Prompts);
        head.tiles_only();
        linear(&x, 0, &Matrix::new(w.clone()), None, &mut exact);
        linear(&x, 0, &head, None, &mut refined);
        let size = input_group(&w);
        for (i, (e, b)) in exact.iter().zip(&refined).enumerate() {
            let (r, c) = (i / n, i % n);
            let bound = refined_bound(&dense, &x, k, r, c, size);
            assert!(
                (e - b).abs() <= bound + 1e-5,
                "[{i}] {e} vs {b} (bound {bound})"
            );
        }
    }
}

/// How far a product in two byte passes may be from exact at row `r`, column `c`: rounding
/// leaves at most a group's largest / 254 out of each input, and the second pass at most 1/254
/// of that.
fn refined_bound(dense: &[f32], x: &[f32], k: usize, r: usize, c: usize, size: usize) -> f32 {
    let bound: f32 = (0..k)
        .map(|j| dense[c * k + j].abs() * group_largest(x, r * k, j, size) / (254.0 * 254.0))
        .sum();
    bound * 1.01
}

/// Whether `w` has 4- or 8-bit codes (what the byte kernels multiply).
fn quantized(w: &Packed) -> bool {
    matches!(w.codes, Codes::Q4 { .. } | Codes::Q8 { .. })
}

/// The inputs' rounding group for `w`: its own group for 8-bit codes, 32 otherwise.
fn input_group(w: &Packed) -> usize {
    match &w.codes {
        Codes::Q8 { group, .. } => *group,
        _ => 32,
    }
}

/// The largest magnitude in the input group holding column `j` of the row starting at `row`.
fn group_largest(x: &[f32], row: usize, j: usize, size: usize) -> f32 {
    let first = row + j / size * size;
    x[first..first + size]
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
}

#[test]
fn a_scale_no_half_holds_keeps_the_matrix_on_f32_inputs() {
    // 1e-6 is below the halves' normal range: rounding it to a half would move it by far more
    // than 1/2048, so the matrix is not laid out for the byte kernels and multiplies exactly.
    let mut w = matrices(29, 64).swap_remove(5);
    if let Codes::Q8 { groups, .. } = &mut w.codes {
        groups.scale[3] = 1e-6;
    }
    let x = values(3 * 64, 9);
    let (mut exact, mut got) = (vec![0.0; 3 * 29], vec![0.0; 3 * 29]);
    linear(&x, 0, &Matrix::new(w.clone()), None, &mut exact);
    let mut matrix = Matrix::new(w);
    matrix.round_inputs(Activations::Int8);
    matrix.tiles_only();
    linear(&x, 3, &matrix, None, &mut got);
    assert_eq!(got, exact);
}

#[test]
fn tiles_and_lanes_give_the_same_sums_bit_for_bit() {
    // AMX's tile products and VNNI's lanes add the same integers and scale them alike, so a
    // prompt's rows (tiles) and a decoding step's (lanes) agree with each other exactly.
    if !Isa::Amx.supported() {
        eprintln!("AMX tiles not granted on this machine: nothing to compare");
        return;
    }
    // 288 columns: 9 or 18 groups, batches of four and a tail; 64: a tail alone; 512: scales
    // in K-quant spans.
    for w in [64, 288, 512]
        .into_iter()
        .flat_map(|k| matrices(37, k))
        .filter(quantized)
    {
        let k = w.cols;
        let mut matrix = Matrix::new(w.clone());
        matrix.round_inputs(Activations::Int8);
        matrix.tiles_only();
        // Fewer rows than a tile, whole tiles, a part tile past a task's block of rows.
        for m in [15, 16, 17, 33, 70] {
            let x = values(m * k, m);
            let (mut tiles, mut lanes) = (vec![0.0; m * 37], vec![0.0; m * 37]);
            linear_with(Isa::Amx, &x, m, &matrix, None, &mut tiles);
            linear_with(Isa::Avx512, &x, m, &matrix, None, &mut lanes);
            assert_eq!(tiles, lanes, "{} m={m}", w.kind());
        }
    }
}

#[test]
fn six_bit_codes_give_the_eight_bit_layouts_sums_bit_for_bit() {
    // The 6-bit layout holds the same codes in fewer bytes and adds the same integers, so a
    // model's logits do not change with it, on any instruction set or count of rows.
    for w in [64, 288].into_iter().flat_map(|k| matrices(37, k)) {
        let Codes::Q8 { group, groups } = &w.codes else {
            continue;
        };
        if groups.codes.iter().any(|c| !(-32..32).contains(c)) {
            continue;
        }
        let k = w.cols;
        let mut six = Matrix::new(w.clone());
        six.round_inputs(Activations::Int8);
        let mut eight = Matrix::new(w.clone());
        eight.tiles = int8::Tiles::eight_bit(&w);
        let (six_bytes, eight_bytes) = (six.bytes(), eight.bytes());
        // Codes in 3/4 of the bytes, the halves as they were (for tiles of 16 columns).
        let columns = 37usize.next_multiple_of(16);
        let halves = (1 + usize::from(!groups.min.is_empty())) * 2 * columns * k / group;
        assert_eq!(
            (six_bytes - w.bytes() - halves) * 4,
            (eight_bytes - w.bytes() - halves) * 3
        );
        for m in [1, 2, 5, 8, 9, 15, 16, 17, 33, 70] {
            let x = values(m * k, m + 1);
            for isa in [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Portable] {
                if !isa.supported() {
                    continue;
                }
                for rounded in [m, 0] {
                    let (mut got, mut want) = (vec![0.0; m * 37], vec![0.0; m * 37]);
                    linear_with(isa, &x, rounded, &six, None, &mut got);
                    linear_with(isa, &x, rounded, &eight, None, &mut want);
                    assert_eq!(got, want, "group {group} k={k} m={m} {isa:?} {rounded}");
                }
            }
        }
    }
}

#[test]
fn four_bit_sums_at_their_largest_stay_exact_on_every_instruction_set() {
    // Every nibble 15 and every input rounded to ±127: the largest sums AVX2's i16 partial
    // sums ever hold (`simd::NIBBLE_PRODUCTS` calls of 2 · 15 · 127 per lane).
    let (n, k) = (16, 128);
    let w = Packed {
        rows: n,
        cols: k,
        codes: Codes::Q4 {
            offset: 0,
            groups: Groups {
                scale: vec![1.0; n * k / 32],
                min: Vec::new(),
                codes: vec![0xFF; n * k / 2],
            },
        },
    };
    let mut matrix = Matrix::new(w);
    matrix.round_inputs(Activations::Int8);
    matrix.second_pass(SecondPass::Never);
    matrix.tiles_only();
    // Rows of +1 and -1 (each rounds to ±127 · 1/127), alone and beside others.
    let x: Vec<f32> = (0..5 * k)
        .map(|i| if (i / k) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    for isa in [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Portable] {
        if !isa.supported() {
            continue;
        }
        let mut out = vec![0.0; 5 * n];
        linear_with(isa, &x, 5, &matrix, None, &mut out);
        for (i, got) in out.iter().enumerate() {
            let want = if (i / n) % 2 == 0 { 15.0 } else { -15.0 } * k as f32;
            assert!((got - want).abs() < 1e-3, "{isa:?} [{i}]: {got} vs {want}");
        }
    }
}

#[test]
fn a_matrix_stacked_from_parts_in_different_layouts_places_each_parts_sums() {
    let k = 64;
    let pick = |rows: usize, kind: &str| {
        matrices(rows, k)
            .into_iter()
            .find(|m| m.kind() == kind && m.cols == k)
            .unwrap_or_else(|| panic!("a {kind} matrix"))
    };
    let parts = vec![pick(24, "q4"), pick(8, "q8")];
    let n = 32;
    let bias = values(n, 6);
    for inputs in [Activations::Exact, Activations::Int8] {
        let prepare = |mut m: Matrix| {
            m.round_inputs(inputs);
            m.second_pass(SecondPass::Prompts);
            m.tiles_only();
            m
        };
        let whole = prepare(Matrix::stacked(parts.clone()));
        let alone: Vec<Matrix> = parts
            .iter()
            .cloned()
            .map(Matrix::new)
            .map(prepare)
            .collect();
        assert_eq!(
            whole.bytes(),
            alone.iter().map(Matrix::bytes).sum::<usize>()
        );
        for m in [1, 5, 17] {
            for rounded in [m, 0] {
                let x = values(m * k, m);
                let mut out = vec![0.0; m * n];
                linear(&x, rounded, &whole, Some(&bias), &mut out);
                let mut first = 0;
                for part in &alone {
                    let width = part.packed.rows;
                    let mut sums = vec![0.0; m * width];
                    linear(
                        &x,
                        rounded,
                        part,
                        Some(&bias[first..first + width]),
                        &mut sums,
                    );
                    for r in 0..m {
                        assert_eq!(
                            out[r * n + first..r * n + first + width],
                            sums[r * width..(r + 1) * width],
                            "{inputs:?} m={m} rounded={rounded} row {r}"
                        );
                    }
                    first += width;
                }
            }
        }
    }
}
