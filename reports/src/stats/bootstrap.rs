//! Seeded percentile-bootstrap confidence intervals for a statistic of one sample and for the
//! ratio of a statistic between two samples.

use super::percentile::{nearest_rank_index, select};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The statistic a bootstrap resamples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    /// Nearest-rank median (HDR-consistent, like [`Statistic::Percentile`] at 50).
    Median,
    /// Nearest-rank percentile, 0–100.
    Percentile(f64),
    Mean,
}

impl Statistic {
    /// Value of the statistic on `values` (reordered in place); `None` when empty.
    pub fn compute(self, values: &mut [f64]) -> Option<f64> {
        match self {
            Statistic::Median => Statistic::Percentile(50.0).compute(values),
            Statistic::Percentile(p) => {
                let index = nearest_rank_index(values.len(), p)?;
                Some(select(values, index))
            }
            Statistic::Mean if values.is_empty() => None,
            Statistic::Mean => Some(values.iter().sum::<f64>() / values.len() as f64),
        }
    }
}

/// Bootstrap settings: number of resamples, confidence level and RNG seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bootstrap {
    pub resamples: usize,
    /// Two-sided confidence level, e.g. 0.95.
    pub confidence: f64,
    pub seed: u64,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            resamples: 2000,
            confidence: 0.95,
            seed: 0x5eed,
        }
    }
}

/// A point estimate with its bootstrap confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ConfidenceInterval {
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
    pub confidence: f64,
}

impl ConfidenceInterval {
    pub fn contains(&self, value: f64) -> bool {
        self.lower <= value && value <= self.upper
    }
}

/// Percentile-bootstrap CI for `statistic` of `sample`. `None` for an empty sample or zero
/// resamples.
pub fn bootstrap_ci(
    sample: &[f64],
    statistic: Statistic,
    settings: Bootstrap,
) -> Option<ConfidenceInterval> {
    let estimate = statistic.compute(&mut sample.to_vec())?;
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut scratch = vec![0.0; sample.len()];
    let replicates = (0..settings.resamples).filter_map(|_| {
        resample_into(sample, &mut scratch, &mut rng);
        statistic.compute(&mut scratch)
    });
    interval(estimate, replicates.collect(), settings.confidence)
}

/// Percentile-bootstrap CI for statistic(b) / statistic(a).
///
/// With `paired`, `a[i]` and `b[i]` belong to the same request and are resampled together
/// (the slices must have equal length); otherwise each sample is resampled independently.
/// `None` when a sample is empty, the paired lengths differ, or the statistic of `a` is zero.
pub fn bootstrap_ratio_ci(
    a: &[f64],
    b: &[f64],
    statistic: Statistic,
    paired: bool,
    settings: Bootstrap,
) -> Option<ConfidenceInterval> {
    if paired && a.len() != b.len() {
        return None;
    }
    let estimate = ratio(
        statistic.compute(&mut a.to_vec())?,
        statistic.compute(&mut b.to_vec())?,
    )?;
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut scratch_a = vec![0.0; a.len()];
    let mut scratch_b = vec![0.0; b.len()];
    let mut replicates = Vec::with_capacity(settings.resamples);
    for _ in 0..settings.resamples {
        if paired {
            for (slot_a, slot_b) in scratch_a.iter_mut().zip(scratch_b.iter_mut()) {
                let i = rng.random_range(0..a.len());
                *slot_a = a[i];
                *slot_b = b[i];
            }
        } else {
            resample_into(a, &mut scratch_a, &mut rng);
            resample_into(b, &mut scratch_b, &mut rng);
        }
        let value_a = statistic.compute(&mut scratch_a);
        let value_b = statistic.compute(&mut scratch_b);
        if let (Some(value_a), Some(value_b)) = (value_a, value_b) {
            if let Some(r) = ratio(value_a, value_b) {
                replicates.push(r);
            }
        }
    }
    interval(estimate, replicates, settings.confidence)
}

fn ratio(denominator: f64, numerator: f64) -> Option<f64> {
    let r = numerator / denominator;
    r.is_finite().then_some(r)
}

fn resample_into(sample: &[f64], out: &mut [f64], rng: &mut StdRng) {
    for slot in out.iter_mut() {
        *slot = sample[rng.random_range(0..sample.len())];
    }
}

/// The (1 − c)/2 and (1 + c)/2 quantiles of the replicates (linear interpolation).
fn interval(
    estimate: f64,
    mut replicates: Vec<f64>,
    confidence: f64,
) -> Option<ConfidenceInterval> {
    if replicates.is_empty() || !(0.0..1.0).contains(&confidence) {
        return None;
    }
    replicates.sort_by(f64::total_cmp);
    let tail = (1.0 - confidence) / 2.0 * 100.0;
    Some(ConfidenceInterval {
        estimate,
        lower: super::percentile_linear(&replicates, tail)?,
        upper: super::percentile_linear(&replicates, 100.0 - tail)?,
        confidence,
    })
}
