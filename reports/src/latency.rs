//! One latency distribution's statistics (HDR percentiles with their intervals) and one
//! request's latencies: what every report builds on, below the run's metrics.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::records::RequestRecord;
use crate::stats::{min_sample_for_quantile, quantile_ci, QuantileCi};

/// Summary statistics of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DistStats {
    pub count: u64,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p99_9: f64,
    /// 95% distribution-free confidence intervals of the percentiles (order statistics).
    #[serde(default)]
    pub ci: PercentileCis,
}

/// Confidence level of [`PercentileCis`].
pub const PERCENTILE_CI_LEVEL: f64 = 0.95;

/// The [`PERCENTILE_CI_LEVEL`] intervals of a distribution's reported percentiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PercentileCis {
    pub p50: QuantileCi,
    pub p90: QuantileCi,
    pub p95: QuantileCi,
    pub p99: QuantileCi,
    pub p99_9: QuantileCi,
}

impl DistStats {
    /// A reported percentile `q` for people: "123.45 [95% CI 118.20–130.90]", or, when the
    /// sample cannot bound it from above, "too few (11 < 368); ≥ 95.30": never a number that
    /// is really the maximum.
    pub fn percentile_text(&self, q: f64, digits: usize) -> String {
        let Some((value, ci)) = self.percentile(q).filter(|_| self.count > 0) else {
            return "–".into();
        };
        let needed = min_sample_for_quantile(q, PERCENTILE_CI_LEVEL);
        if self.count < needed {
            let lower = ci
                .lower
                .map_or("min".to_string(), |v| format!("{v:.digits$}"));
            return format!("too few ({} < {needed}); ≥ {lower}", self.count);
        }
        match (ci.lower, ci.upper) {
            // Statistics saved before the intervals existed.
            (None, None) => format!("{value:.digits$}"),
            _ => format!("{value:.digits$} [95% CI {}]", ci.text(digits)),
        }
    }

    /// The percentile `q` (0–1) of those reported, with its interval.
    pub fn percentile(&self, q: f64) -> Option<(f64, QuantileCi)> {
        [
            (0.5, self.p50, self.ci.p50),
            (0.9, self.p90, self.ci.p90),
            (0.95, self.p95, self.ci.p95),
            (0.99, self.p99, self.ci.p99),
            (0.999, self.p99_9, self.ci.p99_9),
        ]
        .into_iter()
        .find(|(level, _, _)| (level - q).abs() < 1e-9)
        .map(|(_, value, ci)| (value, ci))
    }

    /// Statistics of `values_ms`; all zero when empty.
    pub fn from_values(values_ms: &[f64]) -> DistStats {
        if values_ms.is_empty() {
            return DistStats::default();
        }
        let n = values_ms.len() as f64;
        let mean = values_ms.iter().sum::<f64>() / n;
        let var = values_ms.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let hist = histogram_of(values_ms);
        let q = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        // The intervals are order statistics of the values as the histogram holds them (each
        // at its bucket's highest equivalent value, as `value_at_quantile` reports them), so
        // that a percentile always lies inside its own interval.
        let mut sorted: Vec<f64> = values_ms
            .iter()
            .map(|&v| hist.highest_equivalent(to_micros(v)) as f64 / 1000.0)
            .collect();
        sorted.sort_by(f64::total_cmp);
        let ci = |q: f64| quantile_ci(&sorted, q, PERCENTILE_CI_LEVEL);
        DistStats {
            count: values_ms.len() as u64,
            mean,
            std: var.sqrt(),
            min: values_ms.iter().copied().fold(f64::INFINITY, f64::min),
            max: values_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            p50: q(0.50),
            p90: q(0.90),
            p95: q(0.95),
            p99: q(0.99),
            p99_9: q(0.999),
            ci: PercentileCis {
                p50: ci(0.5),
                p90: ci(0.9),
                p95: ci(0.95),
                p99: ci(0.99),
                p99_9: ci(0.999),
            },
        }
    }
}

/// An HDR histogram over 1 µs … 1 hour with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

/// The histogram of `values_ms` (recorded as whole microseconds).
pub fn histogram_of(values_ms: &[f64]) -> Histogram<u64> {
    let mut hist = new_histogram();
    for &v in values_ms {
        hist.saturating_record(to_micros(v));
    }
    hist
}

/// Milliseconds → whole microseconds for the histogram (negative values clamp to 0).
pub fn to_micros(ms: f64) -> u64 {
    (ms * 1000.0).round().max(0.0) as u64
}

/// Per-request latencies of a successful request (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLatency {
    pub ttft: f64,
    /// Time to first answer token; `None` when only reasoning arrived.
    pub ttfa: Option<f64>,
    pub e2el: f64,
    /// `None` for a single-token output.
    pub tpot: Option<f64>,
}

/// TTFT, time to first answer token, E2E and TPOT of one successful request, measured from
/// the actual send.
pub fn request_latency(r: &RequestRecord) -> Option<RequestLatency> {
    if !r.is_success() {
        return None;
    }
    let first = r.first_token_ms?;
    let last = r.chunk_ms.last().copied().unwrap_or(first);
    let tpot = (r.output_tokens > 1).then(|| (last - first) / (r.output_tokens - 1) as f64);
    Some(RequestLatency {
        ttft: first - r.sent_ms,
        ttfa: r.first_answer().map(|answer| answer - r.sent_ms),
        e2el: last - r.sent_ms,
        tpot,
    })
}
