//! Rotary inverse frequencies, computed once per model in f32 the way `transformers` computes
//! them, for both devices: the global layers' (with the model's scaling) and, where a family
//! gives its sliding layers a base of their own (Gemma 3), theirs (unscaled). Each table has
//! one entry per rotated pair: `rotary_dim / 2`, fewer than `head_dim / 2` where only a head's
//! leading part rotates (Phi-4-mini).
//!
//! LongRoPE picks its short or long factors once, by the context the engine serves (as
//! llama.cpp does): `transformers` picks them per forward pass by the sequence's length, so the
//! two agree wherever the served context and the sequence fall on the same side of the trained
//! context.

use super::{ModelSpec, RopeScaling};

/// The inverse frequencies of each kind of layer.
#[derive(Debug, Clone, PartialEq)]
pub struct RotaryTables {
    /// Every layer's, or the global layers' where `local` is set.
    pub global: Vec<f32>,
    /// The sliding layers' own.
    pub local: Option<Vec<f32>>,
    /// Scale of the global layers' cosines and sines (LongRoPE's attention factor; else 1).
    pub global_scale: f32,
}

impl RotaryTables {
    /// The tables of `spec`.
    pub fn new(spec: &ModelSpec) -> Self {
        let base = plain(spec.rotary_dim, spec.rope_theta);
        let (global, global_scale) = scaled(&base, &spec.rope_scaling, spec.max_context);
        Self {
            global,
            global_scale,
            local: spec
                .arch
                .local_rope_theta
                .map(|theta| plain(spec.rotary_dim, theta)),
        }
    }
}

/// `1 / theta^(2i / dim)` for each rotated pair.
pub fn plain(dim: usize, theta: f32) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
        .collect()
}

/// The scaled table, and the scale of its cosines and sines, for a served `context`.
fn scaled(base: &[f32], scaling: &RopeScaling, context: usize) -> (Vec<f32>, f32) {
    match scaling {
        RopeScaling::None => (base.to_vec(), 1.0),
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Factors(factors) => (divided(base, factors), 1.0),
        RopeScaling::LongRope {
            short,
            long,
            original_max_position,
            attention_factor,
        } => {
            let factors = if context > *original_max_position {
                long
            } else {
                short
            };
            (divided(base, factors), *attention_factor)
        }
        &RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => {
            let low_wavelen = original_max_position / low_freq_factor;
            let high_wavelen = original_max_position / high_freq_factor;
            let table = base
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original_max_position / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect();
            (table, 1.0)
        }
    }
}

fn divided(base: &[f32], factors: &[f32]) -> Vec<f32> {
    base.iter().zip(factors).map(|(f, s)| f / s).collect()
}
