//! Rotary position embeddings as a layer uses them: the base, how many leading dimensions
//! of each head rotate, the scaling (Llama 3's, YaRN's or LongRoPE's), and the cosine and
//! sine tables they are turned into.

use anyhow::bail;

/// Llama 3.x `rope_scaling` with `rope_type = "llama3"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// YaRN (`rope_type = "yarn"`, Qwen's long-context configs), as transformers'
/// `_compute_yarn_parameters` computes it: frequencies between extrapolation (high ones
/// kept) and interpolation (low ones divided by `factor`) along a linear ramp over the
/// dimensions between `beta_fast` and `beta_slow` rotations, and the cosine and sine
/// multiplied by `attention_factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnRopeScaling {
    pub factor: f32,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `0.1 ln(factor) + 1` unless the config gives it.
    pub attention_factor: f32,
    /// Round the ramp's ends outwards to whole dimensions (transformers' default).
    pub truncate: bool,
}

impl YarnRopeScaling {
    /// The attention factor the paper suggests for `factor`.
    pub fn default_attention_factor(factor: f32) -> f32 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * factor.ln() + 1.0
        }
    }
}

/// LongRoPE (`rope_type = "longrope"`, `"su"` in older configs: Phi-3 and Phi-4): each
/// frequency divided by its own factor, from the short list for a context within the
/// original one and from the long list beyond it, and the cosine and sine multiplied by
/// `attention_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRopeScaling {
    /// One divisor per frequency (`rotary_dim / 2`), for contexts up to the original one.
    pub short_factor: Vec<f32>,
    /// One divisor per frequency, for longer contexts.
    pub long_factor: Vec<f32>,
    pub original_max_position_embeddings: usize,
    /// `sqrt(1 + ln(s) / ln(original))` for `s = max_position_embeddings / original` unless
    /// the config gives it (transformers, vLLM and llama.cpp's converter agree).
    pub attention_factor: f32,
}

impl LongRopeScaling {
    /// The attention factor for a context stretched `factor` times past `original`.
    pub fn default_attention_factor(factor: f64, original: usize) -> f32 {
        if factor <= 1.0 {
            1.0
        } else {
            (1.0 + factor.ln() / (original as f64).ln()).sqrt() as f32
        }
    }

    /// The factors a model serving contexts of up to `positions` tokens uses: the long ones
    /// past the original context. The choice is made once for the model, as vLLM and
    /// llama.cpp make it from the served context length, not per sequence as transformers
    /// does, so that a sequence's cached keys never change tables as it grows.
    pub fn factors_for(&self, positions: usize) -> &[f32] {
        if self.uses_long_factors(positions) {
            &self.long_factor
        } else {
            &self.short_factor
        }
    }

    /// Whether a model serving contexts of up to `positions` tokens uses the long factors.
    pub fn uses_long_factors(&self, positions: usize) -> bool {
        positions > self.original_max_position_embeddings
    }
}

/// How a layer's RoPE frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (`rope_type = "linear"`: position interpolation,
    /// Gemma 3's global layers from 4B up).
    Linear {
        factor: f32,
    },
    Llama3(Llama3RopeScaling),
    Yarn(YarnRopeScaling),
    LongRope(LongRopeScaling),
}

/// One layer's RoPE: rotate-half over the first `rotary_dim` dimensions of each q and k
/// head (the whole head unless the config sets a `partial_rotary_factor`); the rest pass
/// through unrotated.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    /// Even, at most the head dimension.
    pub rotary_dim: usize,
    pub scaling: Option<RopeScaling>,
}

impl RopeSpec {
    /// The inverse frequencies (`rotary_dim / 2` of them), scaled when configured, for a
    /// model serving contexts of up to `positions` tokens (LongRoPE's factors depend on it).
    pub fn inv_freq(&self, positions: usize) -> Vec<f32> {
        let dim = self.rotary_dim;
        let base = (0..dim / 2)
            .map(|i| 1.0f32 / (self.theta as f64).powf((2 * i) as f64 / dim as f64) as f32);
        match &self.scaling {
            None => base.collect(),
            Some(RopeScaling::Linear { factor }) => base.map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3(s)) => base.map(|f| f / llama3_divisor(f, s)).collect(),
            Some(RopeScaling::Yarn(y)) => {
                let ramp = yarn_ramp(y, self.theta, dim);
                base.zip(ramp)
                    .map(|(f, extrapolate)| f / y.factor * (1.0 - extrapolate) + f * extrapolate)
                    .collect()
            }
            Some(RopeScaling::LongRope(l)) => base
                .zip(l.factors_for(positions))
                .map(|(f, divisor)| f / divisor)
                .collect(),
        }
    }

    /// The factor the cosine and sine tables carry (YaRN's and LongRoPE's attention
    /// factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        match &self.scaling {
            Some(RopeScaling::Yarn(y)) => y.attention_factor,
            Some(RopeScaling::LongRope(l)) => l.attention_factor,
            _ => 1.0,
        }
    }

    /// The scaling in words, for `GET /version`, as a model serving contexts of up to
    /// `positions` tokens applies it.
    pub fn describe_scaling(&self, positions: usize) -> String {
        match &self.scaling {
            None => "none".to_string(),
            Some(RopeScaling::Linear { factor }) => format!("linear: factor {factor}"),
            Some(RopeScaling::Llama3(s)) => format!(
                "llama3: factor {} over an original context of {}",
                s.factor, s.original_max_position_embeddings
            ),
            Some(RopeScaling::Yarn(y)) => format!(
                "yarn: factor {} over an original context of {}, attention factor {}",
                y.factor, y.original_max_position_embeddings, y.attention_factor
            ),
            Some(RopeScaling::LongRope(l)) => {
                let original = l.original_max_position_embeddings;
                match l.uses_long_factors(positions) {
                    true => format!(
                        "longrope: the long factors, as the served context ({positions}) exceeds the original {original}"
                    ),
                    false => format!(
                        "longrope: the short factors, as the served context ({positions}) is within the original {original}"
                    ),
                }
            }
        }
    }

    /// Cosine and sine tables `[positions, rotary_dim / 2]` of the angles
    /// `pos * inv_freq[i]` (in f32), times the attention factor, for a model serving
    /// contexts of up to `positions` tokens.
    pub fn tables(&self, positions: usize) -> (Vec<f32>, Vec<f32>) {
        let inv_freq = self.inv_freq(positions);
        let scale = self.attention_factor();
        let mut cos = Vec::with_capacity(positions * inv_freq.len());
        let mut sin = Vec::with_capacity(positions * inv_freq.len());
        for pos in 0..positions {
            for &f in &inv_freq {
                let angle = pos as f32 * f;
                cos.push(angle.cos() * scale);
                sin.push(angle.sin() * scale);
            }
        }
        (cos, sin)
    }
}

/// Per frequency, how much of it is extrapolated (kept): 1 above the ramp, 0 below it.
fn yarn_ramp(y: &YarnRopeScaling, theta: f32, head_dim: usize) -> Vec<f32> {
    // The dimension at which a frequency turns `rotations` times over the original context.
    let dim_of = |rotations: f32| {
        let dim = head_dim as f64;
        dim * (y.original_max_position_embeddings as f64
            / (f64::from(rotations) * 2.0 * std::f64::consts::PI))
            .ln()
            / (2.0 * f64::from(theta).ln())
    };
    let (mut low, mut high) = (dim_of(y.beta_fast), dim_of(y.beta_slow));
    if y.truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0), high.min(head_dim as f64 - 1.0));
    let span = if low == high { 0.001 } else { high - low };
    (0..head_dim / 2)
        .map(|i| 1.0 - ((i as f64 - low) / span).clamp(0.0, 1.0) as f32)
        .collect()
}

/// The divisor Llama 3 scaling applies to the frequency `inv_freq` (transformers'
/// `_compute_llama3_parameters`): 1 for high frequencies, `factor` for low ones, a blend
/// between. llama.cpp stores these divisors in `rope_freqs.weight`.
fn llama3_divisor(inv_freq: f32, s: &Llama3RopeScaling) -> f32 {
    let old_ctx = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_ctx / s.low_freq_factor;
    let high_freq_wavelen = old_ctx / s.high_freq_factor;
    let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
    if wavelen < high_freq_wavelen {
        1.0
    } else if wavelen > low_freq_wavelen {
        s.factor
    } else {
        let smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        1.0 / ((1.0 - smooth) / s.factor + smooth)
    }
}

/// The per-frequency divisors that Llama 3 rope scaling applies (llama.cpp
/// stores exactly these in `rope_freqs.weight`).
pub fn llama3_rope_factors(
    scaling: &Llama3RopeScaling,
    rope_theta: f32,
    head_dim: usize,
) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / rope_theta.powf(2.0 * i as f32 / head_dim as f32);
            llama3_divisor(freq, scaling)
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
            rotary_dim: 128,
            scaling,
        };
        let plain = rope(None).inv_freq(8192);
        let scaled = rope(Some(RopeScaling::Llama3(scaling))).inv_freq(8192);
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

    /// Partial rotary: the frequencies span the rotated dimensions only; LongRoPE divides
    /// each by its factor from the list the served context picks, and both lists share the
    /// attention factor.
    #[test]
    fn longrope_picks_its_factors_by_the_served_context() {
        let longrope = LongRopeScaling {
            short_factor: vec![1.0, 2.0, 4.0],
            long_factor: vec![3.0, 5.0, 7.0],
            original_max_position_embeddings: 32,
            attention_factor: LongRopeScaling::default_attention_factor(512.0 / 32.0, 32),
        };
        let spec = RopeSpec {
            theta: 10_000.0,
            rotary_dim: 6,
            scaling: Some(RopeScaling::LongRope(longrope)),
        };
        let plain: Vec<f32> = (0..3)
            .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / 6.0))
            .collect();
        let close = |got: Vec<f32>, divisors: [f32; 3]| {
            for ((g, p), d) in got.iter().zip(&plain).zip(divisors) {
                assert!((g - p / d).abs() <= 1e-6 * p, "{got:?}");
            }
        };
        close(spec.inv_freq(32), [1.0, 2.0, 4.0]);
        close(spec.inv_freq(33), [3.0, 5.0, 7.0]);
        let factor = (1.0 + 16f32.ln() / 32f32.ln()).sqrt();
        assert!((spec.attention_factor() - factor).abs() < 1e-6);
        let (cos, sin) = spec.tables(33);
        assert_eq!(cos.len(), 33 * 3);
        assert!((cos[0] - factor).abs() < 1e-6 && sin[0] == 0.0);
    }
}
