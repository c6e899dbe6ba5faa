//! The few dense kernels the CPU device needs, in f32: matrix products through `matrixmultiply`
//! (split by output columns over the device's threads), RMSNorm, SiLU gating and RoPE.

use rayon::prelude::*;

/// Rows up to this many use plain dot products: packing a matrix for one row costs more than
/// the product itself.
const DOT_ROWS: usize = 4;

/// A pointer that may cross threads; every user writes a disjoint part of what it points to.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: users only write disjoint column ranges of one buffer that outlives the parallel loop.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer itself is only copied.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Dot product with eight independent sums, so the compiler can vectorise it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`: a linear layer with PyTorch's weight layout.
pub fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>, out: &mut [f32], k: usize, n: usize) {
    let m = x.len() / k;
    // The unsafe product below relies on these shapes.
    assert_eq!(w.len(), n * k, "weight shape");
    assert_eq!(out.len(), m * n, "output shape");
    assert_eq!(x.len(), m * k, "input shape");
    if m <= DOT_ROWS {
        for (row, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
            o.par_chunks_mut(64).enumerate().for_each(|(c, cols)| {
                for (j, cell) in cols.iter_mut().enumerate() {
                    let col = c * 64 + j;
                    *cell = dot(row, &w[col * k..(col + 1) * k]);
                }
            });
        }
    } else {
        let threads = rayon::current_num_threads().max(1);
        let chunk = n.div_ceil(threads * 2).next_multiple_of(16).max(16);
        let ptr = SendPtr(out.as_mut_ptr());
        (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
            let j0 = c * chunk;
            let cols = chunk.min(n - j0);
            // SAFETY: `x` is m×k with row stride k, the weight slice is the `cols` rows of `w`
            // from j0 read as a k×cols matrix (strides 1, k), and the output is the m×cols
            // block of `out` at column j0 (strides n, 1): all in bounds, and each task writes
            // its own columns only.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    cols,
                    1.0,
                    x.as_ptr(),
                    k as isize,
                    1,
                    w.as_ptr().add(j0 * k),
                    1,
                    k as isize,
                    0.0,
                    ptr.get().add(j0),
                    n as isize,
                    1,
                );
            }
        });
    }
    if let Some(bias) = bias {
        for o in out.chunks_exact_mut(n) {
            for (v, b) in o.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

/// RMSNorm of each row of `x` (width `weight.len()`) into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, row)| {
            let mean = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean + eps).sqrt();
            for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
                *o = w * (v * inv);
            }
        });
}

/// `gate_up` rows hold `[gate | up]` (width 2f); writes `silu(gate) * up` rows of width f.
pub fn silu_gate(gate_up: &[f32], f: usize, out: &mut [f32]) {
    out.par_chunks_mut(f)
        .zip(gate_up.par_chunks(2 * f))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(f);
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        });
}

/// `x += y`, element by element.
pub fn add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
}

/// Rotates each head (width `2 * cos.len()`) of a row in place, the "rotate half" layout of
/// Hugging Face Llama: the pair is (i, i + half).
pub fn rope(row: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in row.chunks_exact_mut(2 * half) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x, y) = (a[i], b[i]);
            a[i] = x * cos[i] - y * sin[i];
            b[i] = y * cos[i] + x * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_a_naive_product_for_few_and_many_rows() {
        let (k, n) = (37, 53);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0)
            .collect();
        let bias: Vec<f32> = (0..n).map(|i| i as f32 / 100.0).collect();
        for m in [1, 3, 9] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 7.0)
                .collect();
            let mut out = vec![0.0; m * n];
            linear(&x, &w, Some(&bias), &mut out, k, n);
            for r in 0..m {
                for c in 0..n {
                    let want: f32 =
                        (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum::<f32>() + bias[c];
                    assert!((out[r * n + c] - want).abs() < 1e-4, "m={m} r={r} c={c}");
                }
            }
        }
    }
}
