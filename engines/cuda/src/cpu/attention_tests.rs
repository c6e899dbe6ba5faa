use half::f16;

use super::*;
use crate::cpu::kv::KvValue;

fn values(n: usize, seed: usize) -> Vec<f32> {
    // Multiples of 1/64 in [-1, 1]: exact in halves, so both caches hold the same numbers.
    (0..n)
        .map(|i| ((i * 37 + seed * 11) % 129) as f32 / 64.0 - 1.0)
        .collect()
}

/// Attention of one query row over `positions` cached tokens, in f64.
fn naive(heads: Heads, q: &[f32], keys: &[f32], vals: &[f32], positions: usize) -> Vec<f32> {
    let (hd, group) = (heads.dim, heads.query / heads.kv);
    let width = heads.kv * hd;
    let mut out = vec![0.0; heads.query * hd];
    for h in 0..heads.query {
        let g = h / group;
        let scores: Vec<f64> = (0..positions)
            .map(|p| {
                (0..hd)
                    .map(|d| f64::from(q[h * hd + d]) * f64::from(keys[p * width + g * hd + d]))
                    .sum::<f64>()
                    * f64::from(heads.scale)
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for d in 0..hd {
            let v: f64 = (0..positions)
                .map(|p| weights[p] / total * f64::from(vals[p * width + g * hd + d]))
                .sum();
            out[h * hd + d] = v as f32;
        }
    }
    out
}

/// The last `rows` positions of `n` cached ones attending, as a prompt's rows or decoding
/// steps' (one query row of `heads.query × heads.dim` per position, from `q`).
fn attend<V: KvValue>(
    heads: Heads,
    q: &[f32],
    keys: &[V],
    vals: &[V],
    n: usize,
    rows: usize,
    prompt: bool,
) -> Vec<f32> {
    let width = heads.kv * heads.dim;
    let offsets: Vec<usize> = (0..n).map(|p| p * width).collect();
    let tile = Tile {
        row: 0,
        len: rows,
        pos: n - rows,
        offsets: &offsets,
        prompt,
    };
    let mut out = vec![0.0; rows * heads.query * heads.dim];
    let cache = Cache { keys, values: vals };
    attend_tiles(cache, heads, &[tile], q, heads.query * heads.dim, &mut out);
    out
}

#[test]
fn a_decoding_row_attends_as_a_naive_softmax_does_in_either_cache() {
    // Heads sharing a key/value head scored together (group 3, 64 wide), and the shapes that
    // take one head at a time (group 9; 24 wide).
    for (query, kv, dim) in [(6, 2, 64), (18, 2, 64), (4, 2, 24)] {
        let heads = Heads {
            query,
            kv,
            dim,
            scale: 1.0 / (dim as f32).sqrt(),
            softcap: None,
            window: None,
        };
        let n = 37;
        let (keys, vals) = (values(n * kv * dim, 1), values(n * kv * dim, 2));
        let q = values(query * dim, 3);
        let want = naive(heads, &q, &keys, &vals, n);
        let halves = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let got = [
            attend(heads, &q, &keys, &vals, n, 1, false),
            attend(heads, &q, &halves(&keys), &halves(&vals), n, 1, false),
            attend(heads, &q, &keys, &vals, n, 1, true),
            attend(heads, &q, &halves(&keys), &halves(&vals), n, 1, true),
        ];
        for out in got {
            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                assert!((a - b).abs() < 1e-5, "{query}/{kv}×{dim} [{i}]: {a} vs {b}");
            }
        }
    }
}

/// 37 cached positions of 2 key/value heads (halves) and a query row for each, 6 heads of 64.
struct Rows {
    heads: Heads,
    n: usize,
    width: usize,
    keys: Vec<f16>,
    vals: Vec<f16>,
    q: Vec<f32>,
}

impl Rows {
    fn new() -> Self {
        let (n, width) = (37, 6 * 64);
        let halves = |v: Vec<f32>| v.iter().map(|&x| f16::from_f32(x)).collect();
        Self {
            heads: Heads {
                query: 6,
                kv: 2,
                dim: 64,
                scale: 0.125,
                softcap: None,
                window: None,
            },
            n,
            width,
            keys: halves(values(n * 2 * 64, 1)),
            vals: halves(values(n * 2 * 64, 2)),
            q: values(n * width, 3),
        }
    }
}

#[test]
fn a_prompt_row_attends_alone_as_it_does_beside_the_rest_of_its_prompt() {
    // What a prefix-cache hit relies on: the prompt's last position recomputed alone.
    let Rows {
        heads,
        n,
        width,
        keys,
        vals,
        q,
    } = Rows::new();
    for rows in [2, 5, 16] {
        let together = attend(heads, &q[(n - rows) * width..], &keys, &vals, n, rows, true);
        let alone = attend(heads, &q[(n - 1) * width..], &keys, &vals, n, 1, true);
        assert_eq!(
            alone[..],
            together[(rows - 1) * width..],
            "beside {rows} rows"
        );
    }
}

#[test]
fn a_decoding_row_attends_alone_as_it_does_beside_other_decoding_rows() {
    // What checking drafts relies on: each drafted position gets what a plain decoding step at
    // that position gets.
    let Rows {
        heads,
        n,
        keys,
        vals,
        q,
        ..
    } = Rows::new();
    for rows in [2, 5, 9] {
        assert_each_row_as_alone(heads, &q, &keys, &vals, n, rows);
    }
}

/// Each of the last `rows` of `n` positions, attended together as decoding rows, gets what
/// it gets alone.
fn assert_each_row_as_alone(
    heads: Heads,
    q: &[f32],
    keys: &[f16],
    vals: &[f16],
    n: usize,
    rows: usize,
) {
    let width = heads.query * heads.dim;
    let together = attend(heads, &q[(n - rows) * width..], keys, vals, n, rows, false);
    for i in 0..rows {
        let at = n - rows + i;
        let alone = attend(heads, &q[at * width..], keys, vals, at + 1, 1, false);
        assert_eq!(
            alone[..],
            together[i * width..(i + 1) * width],
            "{heads:?}: row {i} of {rows}"
        );
    }
}

#[test]
fn decoding_rows_in_blocks_match_each_row_alone_with_windows_and_other_shapes() {
    // Rows are scored in blocks that read each key once for all of them: under a sliding
    // window (rows see different first positions) and in the shapes taken one head at a
    // time, each row still gets what it gets alone.
    let n = 41;
    for (query, kv, dim, window) in [
        (6, 2, 64, Some(8)),
        (6, 2, 64, Some(40)),
        (18, 2, 64, None),
        (4, 2, 24, Some(5)),
    ] {
        let heads = Heads {
            query,
            kv,
            dim,
            scale: 1.0 / (dim as f32).sqrt(),
            softcap: Some(30.0),
            window,
        };
        let halves = |v: Vec<f32>| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let keys = halves(values(n * kv * dim, 4));
        let vals = halves(values(n * kv * dim, 5));
        let q = values(n * query * dim, 6);
        for rows in [3, 6, 17] {
            assert_each_row_as_alone(heads, &q, &keys, &vals, n, rows);
        }
    }
}
