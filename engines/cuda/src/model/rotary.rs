//! Rotary inverse frequencies, computed once per model in f32 the way `transformers` computes
//! them, for both devices: the global layers' (with the model's scaling) and, where a family
//! gives its sliding layers a base of their own (Gemma 3), theirs (unscaled).

use super::{ModelSpec, RopeScaling};

/// The inverse frequencies of each kind of layer.
#[derive(Debug, Clone, PartialEq)]
pub struct RotaryTables {
    /// Every layer's, or the global layers' where `local` is set.
    pub global: Vec<f32>,
    /// The sliding layers' own.
    pub local: Option<Vec<f32>>,
}

impl RotaryTables {
    /// The tables of `spec`.
    pub fn new(spec: &ModelSpec) -> Self {
        Self {
            global: scaled(&plain(spec.head_dim, spec.rope_theta), &spec.rope_scaling),
            local: spec
                .arch
                .local_rope_theta
                .map(|theta| plain(spec.head_dim, theta)),
        }
    }

    /// Layer `layer`'s table.
    pub fn layer(&self, spec: &ModelSpec, layer: usize) -> &[f32] {
        match &self.local {
            Some(local) if spec.arch.local_rope(layer) => local,
            _ => &self.global,
        }
    }
}

/// `1 / theta^(2i / dim)` for each rotated pair.
pub fn plain(dim: usize, theta: f32) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
        .collect()
}

fn scaled(base: &[f32], scaling: &RopeScaling) -> Vec<f32> {
    match scaling {
        RopeScaling::None => base.to_vec(),
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Factors(factors) => base.iter().zip(factors).map(|(f, s)| f / s).collect(),
        &RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => {
            let low_wavelen = original_max_position / low_freq_factor;
            let high_wavelen = original_max_position / high_freq_factor;
            base.iter()
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
                .collect()
        }
    }
}
