//! Rotary position embeddings as a layer uses them: the base, the scaling, and the inverse
//! frequencies both are turned into.

use anyhow::bail;

/// Llama 3.x `rope_scaling` with `rope_type = "llama3"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// One layer's RoPE table: rotate-half over the whole head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub scaling: Option<Llama3RopeScaling>,
}

impl RopeSpec {
    /// The inverse frequencies (`head_dim / 2` of them), scaled when configured.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let base = (0..head_dim / 2)
            .map(|i| 1.0f32 / (self.theta as f64).powf((2 * i) as f64 / head_dim as f64) as f32);
        match self.scaling {
            None => base.collect(),
            Some(s) => base.map(|f| llama3_scale(f, &s)).collect(),
        }
    }
}

/// Llama 3 frequency scaling (transformers' `_compute_llama3_parameters`).
fn llama3_scale(inv_freq: f32, s: &Llama3RopeScaling) -> f32 {
    let old_ctx = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_ctx / s.low_freq_factor;
    let high_freq_wavelen = old_ctx / s.high_freq_factor;
    let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
    if wavelen < high_freq_wavelen {
        inv_freq
    } else if wavelen > low_freq_wavelen {
        inv_freq / s.factor
    } else {
        let smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq
    }
}

/// The per-frequency divisors that Llama 3 rope scaling applies (llama.cpp
/// stores exactly these in `rope_freqs.weight`).
pub fn llama3_rope_factors(
    scaling: &Llama3RopeScaling,
    rope_theta: f32,
    head_dim: usize,
) -> Vec<f32> {
    let old_context = scaling.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_context / scaling.low_freq_factor;
    let high_freq_wavelen = old_context / scaling.high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / rope_theta.powf(2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                scaling.factor
            } else {
                let smooth = (old_context / wavelen - scaling.low_freq_factor)
                    / (scaling.high_freq_factor - scaling.low_freq_factor);
                1.0 / ((1.0 - smooth) / scaling.factor + smooth)
            }
        })
        .collect()
}

/// Recovers Llama 3 rope scaling from llama.cpp's factor table: `factor` is the
/// largest entry; the other parameters are those of every Llama 3.1/3.2/3.3
/// release (low 1, high 4, original context 8192), checked against the table.
pub fn llama3_scaling_from_factors(
    factors: &[f32],
    rope_theta: f32,
    head_dim: usize,
) -> anyhow::Result<Llama3RopeScaling> {
    if factors.len() != head_dim / 2 {
        bail!("{} factors for head_dim {head_dim}", factors.len());
    }
    let scaling = Llama3RopeScaling {
        factor: factors.iter().cloned().fold(1.0, f32::max),
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let expected = llama3_rope_factors(&scaling, rope_theta, head_dim);
    for (i, (got, want)) in factors.iter().zip(&expected).enumerate() {
        if (got - want).abs() > 1e-3 * want.abs() {
            bail!("factor {i} is {got}, Llama 3 scaling {scaling:?} gives {want}");
        }
    }
    Ok(scaling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_divides_low_and_blends_medium_frequencies() {
        let scaling = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let rope = |scaling| RopeSpec {
            theta: 500_000.0,
            scaling,
        };
        let plain = rope(None).inv_freq(128);
        let scaled = rope(Some(scaling)).inv_freq(128);
        assert_eq!(plain.len(), 64);
        assert!((plain[1] - 500_000f32.powf(-2.0 / 128.0)).abs() < 1e-7);
        let mut regimes = [0; 3];
        for (&p, &s) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f32::consts::PI / p;
            if wavelen < 8192.0 / 4.0 {
                assert_eq!(s, p);
                regimes[0] += 1;
            } else if wavelen > 8192.0 {
                assert!((s - p / 8.0).abs() <= 1e-6 * p);
                regimes[1] += 1;
            } else {
                let smooth = (8192.0 / wavelen - 1.0) / 3.0;
                let want = (1.0 - smooth) * p / 8.0 + smooth * p;
                assert!((s - want).abs() <= 1e-6 * p);
                regimes[2] += 1;
            }
        }
        assert!(regimes.iter().all(|&n| n > 0), "{regimes:?}");
    }
}
