//! An encoder embedding model (BERT, Nomic BERT) on the CPU: every input's tokens attend to
//! each other in both directions, so a batch of inputs is one pass with no KV cache. The
//! products run the decoder's kernels over all inputs' rows at once; attention runs per input
//! and head on the device's pool. Weights stay in their own precision and inputs f32 unless
//! the engine is told to round float weights to bytes ([`FloatWeights::Int8`], see
//! [`byte_layer`]).

use rayon::prelude::*;

use super::attention::{axpy, dot, lanes, lanes_mut};
use super::linalg::{gelu_erf, rope, rotary_angles};
use super::matmul::{Activations, FloatWeights, Matrix, linear};
use super::simd::{Isa, Kernel, Simd};
use crate::device::{Batch, Device, DeviceError};
use crate::model::encoder::{EncoderMlp, EncoderSpec, Positions};
use crate::model::pooling::{PoolingMode, pool};
use crate::model::{ModelError, Packed, Weights};

/// A LayerNorm's weight and bias.
#[derive(Debug)]
struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// One block.
#[derive(Debug)]
struct Block {
    qkv: Matrix,
    qkv_bias: Option<Vec<f32>>,
    o: Matrix,
    o_bias: Option<Vec<f32>>,
    attn_norm: Norm,
    /// Up (Gelu), or gate then up stacked (SwiGLU).
    up: Matrix,
    up_bias: Option<Vec<f32>>,
    down: Matrix,
    down_bias: Option<Vec<f32>>,
    out_norm: Norm,
}

/// An encoder loaded for the CPU.
#[derive(Debug)]
pub struct EncoderDevice {
    spec: EncoderSpec,
    embed: Packed,
    positions: Option<Packed>,
    token_type: Option<Vec<f32>>,
    embed_norm: Norm,
    blocks: Vec<Block>,
    inv_freq: Vec<f32>,
    num_blocks: u32,
    pool: rayon::ThreadPool,
}

impl EncoderDevice {
    /// Loads the encoder at `path`; `num_blocks` is what the device reports to the scheduler
    /// (it keeps no cache).
    pub fn load(
        path: &std::path::Path,
        spec: &EncoderSpec,
        num_blocks: u32,
        threads: usize,
        inputs: Activations,
        float_weights: FloatWeights,
    ) -> Result<Self, ModelError> {
        let w = Weights::open(path)?;
        let (d, f) = (spec.hidden_size, spec.intermediate_size);
        // Checkpoints name tensors with or without the model's prefix.
        let name = |n: &str| -> String {
            ["", "bert.", "model."]
                .iter()
                .map(|p| format!("{p}{n}"))
                .find(|full| w.contains(full))
                .unwrap_or_else(|| n.to_string())
        };
        let vector = |n: &str, len: usize| w.get(&name(n), &[len]).map(|t| t.data);
        let optional = |n: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            if w.contains(&name(n)) {
                vector(n, len).map(Some)
            } else {
                Ok(None)
            }
        };
        let matrix = |n: &str, rows: usize| w.packed(&name(n), &[rows, d]);
        let norm = |n: &str| -> Result<Norm, ModelError> {
            Ok(Norm {
                weight: vector(&format!("{n}.weight"), d)?,
                bias: vector(&format!("{n}.bias"), d)?,
            })
        };
        let layer = |packed: Packed| byte_layer(packed, inputs, float_weights);
        let nomic = spec.mlp == EncoderMlp::SwiGlu;
        let mut blocks = Vec::with_capacity(spec.num_layers);
        for l in 0..spec.num_layers {
            let b = if nomic {
                format!("encoder.layers.{l}")
            } else {
                format!("encoder.layer.{l}")
            };
            let block = if nomic {
                Block {
                    qkv: layer(matrix(&format!("{b}.attn.Wqkv.weight"), 3 * d)?),
                    qkv_bias: optional(&format!("{b}.attn.Wqkv.bias"), 3 * d)?,
                    o: layer(w.packed(&name(&format!("{b}.attn.out_proj.weight")), &[d, d])?),
                    o_bias: optional(&format!("{b}.attn.out_proj.bias"), d)?,
                    attn_norm: norm(&format!("{b}.norm1"))?,
                    up: layer(Packed::stack(vec![
                        matrix(&format!("{b}.mlp.fc12.weight"), f)?,
                        matrix(&format!("{b}.mlp.fc11.weight"), f)?,
                    ])),
                    up_bias: None,
                    down: layer(w.packed(&name(&format!("{b}.mlp.fc2.weight")), &[d, f])?),
                    down_bias: optional(&format!("{b}.mlp.fc2.bias"), d)?,
                    out_norm: norm(&format!("{b}.norm2"))?,
                }
            } else {
                let part = |p: &str| format!("{b}.attention.self.{p}");
                let biases = [
                    vector(&part("query.bias"), d)?,
                    vector(&part("key.bias"), d)?,
                    vector(&part("value.bias"), d)?,
                ];
                Block {
                    qkv: layer(Packed::stack(vec![
                        matrix(&part("query.weight"), d)?,
                        matrix(&part("key.weight"), d)?,
                        matrix(&part("value.weight"), d)?,
                    ])),
                    qkv_bias: Some(biases.concat()),
                    o: layer(matrix(&format!("{b}.attention.output.dense.weight"), d)?),
                    o_bias: Some(vector(&format!("{b}.attention.output.dense.bias"), d)?),
                    attn_norm: norm(&format!("{b}.attention.output.LayerNorm"))?,
                    up: layer(matrix(&format!("{b}.intermediate.dense.weight"), f)?),
                    up_bias: Some(vector(&format!("{b}.intermediate.dense.bias"), f)?),
                    down: layer(w.packed(&name(&format!("{b}.output.dense.weight")), &[d, f])?),
                    down_bias: Some(vector(&format!("{b}.output.dense.bias"), d)?),
                    out_norm: norm(&format!("{b}.output.LayerNorm"))?,
                }
            };
            blocks.push(block);
        }
        let embed_norm = if nomic && w.contains(&name("emb_ln.weight")) {
            norm("emb_ln")?
        } else {
            norm("embeddings.LayerNorm")?
        };
        let positions = match spec.positions {
            Positions::Absolute => Some(w.packed(
                &name("embeddings.position_embeddings.weight"),
                &[spec.max_positions, d],
            )?),
            Positions::Rotary(_) => None,
        };
        // Every input is one segment: type 0's row is added to every token.
        let types = name("embeddings.token_type_embeddings.weight");
        let token_type = if w.contains(&types) {
            Some(w.get(&types, &[spec.type_vocab_size, d])?.data[..d].to_vec())
        } else {
            None
        };
        let inv_freq = match spec.positions {
            Positions::Rotary(theta) => crate::model::rotary::plain(spec.head_dim(), theta),
            Positions::Absolute => Vec::new(),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("turnpike-cpu-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start CPU threads: {e}")))?;
        Ok(Self {
            embed: w.packed(
                &name("embeddings.word_embeddings.weight"),
                &[spec.vocab_size, d],
            )?,
            spec: spec.clone(),
            positions,
            token_type,
            embed_norm,
            blocks,
            inv_freq,
            num_blocks,
            pool,
        })
    }

    /// The last hidden states of each input, rows of `hidden_size`, one vector per input.
    fn states(&self, inputs: &[Vec<u32>]) -> Result<Vec<f32>, DeviceError> {
        let spec = &self.spec;
        let (d, f, nh) = (spec.hidden_size, spec.intermediate_size, spec.num_heads);
        let hd = spec.head_dim();
        let t: usize = inputs.iter().map(Vec::len).sum();
        let mut x = vec![0.0f32; t * d];
        let mut rows = x.chunks_exact_mut(d);
        let mut extra = vec![0.0f32; d];
        for tokens in inputs {
            if tokens.len() > spec.max_positions {
                return Err(DeviceError::InvalidBatch(format!(
                    "an input of {} tokens is longer than the model's {}",
                    tokens.len(),
                    spec.max_positions
                )));
            }
            for (pos, &tok) in tokens.iter().enumerate() {
                let Some(row) = rows.next() else { break };
                if tok as usize >= spec.vocab_size {
                    return Err(DeviceError::InvalidBatch(format!(
                        "token {tok} is outside the vocabulary"
                    )));
                }
                self.embed.row_into(tok as usize, row);
                if let Some(positions) = &self.positions {
                    positions.row_into(pos, &mut extra);
                    row.iter_mut().zip(&extra).for_each(|(v, p)| *v += p);
                }
                if let Some(types) = &self.token_type {
                    row.iter_mut().zip(types).for_each(|(v, p)| *v += p);
                }
            }
        }
        layer_norm(&mut x, &self.embed_norm, spec.eps);
        let mut qkv = vec![0.0f32; t * 3 * d];
        let mut attn = vec![0.0f32; t * d];
        let mut proj = vec![0.0f32; t * d];
        let up_rows = match spec.mlp {
            EncoderMlp::Gelu => f,
            EncoderMlp::SwiGlu => 2 * f,
        };
        let mut up = vec![0.0f32; t * up_rows];
        let mut act = vec![0.0f32; t * f];
        let starts: Vec<usize> = inputs
            .iter()
            .scan(0, |at, tokens| {
                let start = *at;
                *at += tokens.len();
                Some(start)
            })
            .collect();
        // Each row's position within its input, and (rotary models) its angles, once for
        // every block.
        let angles = (!self.inv_freq.is_empty()).then(|| {
            let positions = inputs.iter().flat_map(|tokens| 0..tokens.len());
            rotary_angles(
                positions.collect::<Vec<_>>().into_iter(),
                &self.inv_freq,
                1.0,
            )
        });
        for block in &self.blocks {
            linear(&x, 0, &block.qkv, block.qkv_bias.as_deref(), &mut qkv);
            if let Some((cos, sin)) = &angles {
                let half = self.inv_freq.len();
                qkv.par_chunks_mut(3 * d)
                    .zip(cos.par_chunks(half).zip(sin.par_chunks(half)))
                    .for_each(|(row, (c, s))| rope(&mut row[..2 * d], hd, c, s));
            }
            attend(&qkv, inputs, &starts, nh, hd, &mut attn);
            linear(&attn, 0, &block.o, block.o_bias.as_deref(), &mut proj);
            x.par_iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            layer_norm(&mut x, &block.attn_norm, spec.eps);
            linear(&x, 0, &block.up, block.up_bias.as_deref(), &mut up);
            match spec.mlp {
                EncoderMlp::Gelu => gelu_erf(&up, &mut act),
                EncoderMlp::SwiGlu => {
                    act.par_chunks_mut(f)
                        .zip(up.par_chunks(2 * f))
                        .for_each(|(a, gu)| {
                            let (gate, up) = gu.split_at(f);
                            for ((a, g), u) in a.iter_mut().zip(gate).zip(up) {
                                *a = g / (1.0 + (-g).exp()) * u;
                            }
                        })
                }
            }
            linear(&act, 0, &block.down, block.down_bias.as_deref(), &mut proj);
            x.par_iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            layer_norm(&mut x, &block.out_norm, spec.eps);
        }
        Ok(x)
    }
}

/// A layer's matrix as products multiply it: with [`FloatWeights::Int8`] float weights are
/// rounded to 8-bit codes in groups of 32, and under [`Activations::Int8`] every product with
/// 8-bit codes rounds its inputs to bytes, one pass each. Measured on a 12-layer BERT-base
/// shape against f32 (cosine of mean-pooled vectors): the weights' rounding alone gives
/// 0.99993, the inputs' alone 0.999995, so a second pass over the inputs would double the
/// arithmetic for nothing (groups of 128 were 10% faster again but fell to 0.9999). A vector
/// of one token ([CLS] pooling) keeps less: a few hundredths of its values' scale. So it is
/// the operator's choice, not the default.
fn byte_layer(packed: Packed, inputs: Activations, float_weights: FloatWeights) -> Matrix {
    let packed = match float_weights {
        FloatWeights::Int8 => packed.rounded_to_q8(32).unwrap_or(packed),
        FloatWeights::Shipped => packed,
    };
    // One byte pass per row (a new matrix's second pass is `Never`).
    let mut matrix = Matrix::new(packed);
    matrix.round_inputs(inputs);
    matrix.tiles_only();
    matrix
}

/// Bidirectional attention of each input over itself: `qkv` rows hold q, k and v (`nh` heads
/// of `hd` each); writes `out` rows of `nh · hd`. One task per query row, on the device's
/// lanes.
fn attend(
    qkv: &[f32],
    inputs: &[Vec<u32>],
    starts: &[usize],
    nh: usize,
    hd: usize,
    out: &mut [f32],
) {
    let d = nh * hd;
    let mut tasks: Vec<(usize, usize, usize, &mut [f32])> = Vec::new();
    let mut rest = out;
    for (tokens, &start) in inputs.iter().zip(starts) {
        let (mine, tail) = rest.split_at_mut(tokens.len() * d);
        rest = tail;
        for (i, row) in mine.chunks_exact_mut(d).enumerate() {
            tasks.push((start, tokens.len(), start + i, row));
        }
    }
    let isa = Isa::detected();
    tasks
        .into_par_iter()
        .for_each_init(Vec::new, |scores, (start, len, row, out)| {
            isa.run(QueryRow {
                keys: &qkv[start * 3 * d..(start + len) * 3 * d],
                q: &qkv[row * 3 * d..row * 3 * d + d],
                hd,
                out,
                scores,
            })
        });
}

/// One query row against every position of its input (`keys`: their qkv rows), as a
/// [`Kernel`].
struct QueryRow<'a> {
    keys: &'a [f32],
    q: &'a [f32],
    hd: usize,
    out: &'a mut [f32],
    scores: &'a mut Vec<f32>,
}

impl Kernel for QueryRow<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd, const T: usize>(self, s: S) {
        let (d, hd) = (self.q.len(), self.hd);
        let scale = 1.0 / (hd as f32).sqrt();
        // Plain loops: a closure would be compiled without the instruction set's features, and
        // the lanes' intrinsics would not inline into it.
        let positions = self.keys.len() / (3 * d);
        for h in 0..self.q.len() / hd {
            let qh = &self.q[h * hd..(h + 1) * hd];
            self.scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in 0..positions {
                let score = dot(s, qh, &self.keys[j * 3 * d + d + h * hd..][..hd]) * scale;
                max = max.max(score);
                self.scores.push(score);
            }
            let mut sum = 0.0;
            for p in self.scores.iter_mut() {
                *p = (*p - max).exp();
                sum += *p;
            }
            for p in self.scores.iter_mut() {
                *p /= sum;
            }
            let o = &mut self.out[h * hd..(h + 1) * hd];
            // Sixteen of the head's values at a time, summed over every position in a
            // register; what is left of the head (under sixteen) position by position.
            let whole = hd / 16 * 16;
            for c in (0..whole).step_by(16) {
                let mut acc = s.zero();
                for (j, &p) in self.scores.iter().enumerate() {
                    let v = lanes(self.keys, j * 3 * d + 2 * d + h * hd + c);
                    acc = s.mul_add(s.splat(p), s.load(v), acc);
                }
                s.store(acc, lanes_mut(o, c));
            }
            let tail = &mut o[whole..];
            tail.fill(0.0);
            for (j, &p) in self.scores.iter().enumerate() {
                axpy(
                    s,
                    p,
                    &self.keys[j * 3 * d + 2 * d + h * hd + whole..][..hd - whole],
                    tail,
                );
            }
        }
    }
}

/// LayerNorm of each row of `x` in place.
fn layer_norm(x: &mut [f32], norm: &Norm, eps: f32) {
    let d = norm.weight.len();
    x.par_chunks_mut(d).for_each(|row| {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
            *v = (*v - mean) * inv * w + b;
        }
    });
}

impl Device for EncoderDevice {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    fn forward(&mut self, _batch: &Batch<'_>) -> Result<Vec<f32>, DeviceError> {
        Err(DeviceError::InvalidBatch(
            "an encoder model serves embeddings only".into(),
        ))
    }

    fn embed(&mut self, tokens: &[u32], mode: PoolingMode) -> Result<Vec<f32>, DeviceError> {
        let mut out = self.embed_batch(&[tokens.to_vec()], mode)?;
        out.pop()
            .ok_or_else(|| DeviceError::InvalidBatch("no tokens to embed".into()))
    }

    fn embed_batch(
        &mut self,
        inputs: &[Vec<u32>],
        mode: PoolingMode,
    ) -> Result<Vec<Vec<f32>>, DeviceError> {
        if inputs.iter().any(Vec::is_empty) {
            return Err(DeviceError::InvalidBatch("no tokens to embed".into()));
        }
        let d = self.spec.hidden_size;
        let states = self.pool.install(|| self.states(inputs))?;
        let mut at = 0;
        Ok(inputs
            .iter()
            .map(|tokens| {
                let rows = &states[at * d..(at + tokens.len()) * d];
                at += tokens.len();
                pool(rows, d, mode)
            })
            .collect())
    }
}
