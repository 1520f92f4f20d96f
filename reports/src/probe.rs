//! The judgement on a sweep's closed-loop probe (loadgen runs its steps): each step's
//! Little's-law rate and SLO verdict from its records, whether a short step misses the SLO
//! beyond doubt, and the saturation estimate from the steps.

use anyhow::{bail, Context, Result};

use crate::folders::{Probe, ProbeStep};
use crate::metrics::{Metrics, PERCENTILE_CI_LEVEL};
use crate::records::RequestRecord;
use crate::samples::LatencySamples;
use crate::slo::SloSpec;
use crate::stats::quantile_ci;

/// The probe step at `concurrency` whose run measured `metrics` over `records`, checked
/// against `slo` when given.
pub fn measure_step(
    concurrency: usize,
    metrics: &Metrics,
    records: &[RequestRecord],
    slo: Option<&SloSpec>,
) -> ProbeStep {
    let mean_s = metrics.e2el.mean / 1000.0;
    let samples = LatencySamples::from_records(records);
    ProbeStep {
        concurrency,
        completed: metrics.completed,
        failed: metrics.failed,
        throughput: metrics.request_throughput,
        mean_e2el_ms: metrics.e2el.mean,
        little_rate: if mean_s > 0.0 {
            concurrency as f64 / mean_s
        } else {
            0.0
        },
        slo_verdict: slo.map(|s| s.check(&samples).verdict),
        slo_missed: slo.is_some_and(|s| surely_missed(s, &samples)),
    }
}

/// Whether `samples` miss a target of `slo` beyond doubt: the target percentile's 95%
/// interval lies wholly above its limit. A short step cannot bound a high percentile from
/// above (the "p99" of 20 requests is their maximum), but it can from below: when the 4th
/// smallest of 5 values already exceeds the limit, so does the p99.
pub fn surely_missed(slo: &SloSpec, samples: &LatencySamples) -> bool {
    slo.targets.iter().any(|t| {
        let mut values = samples.values(t.metric);
        values.sort_by(f64::total_cmp);
        quantile_ci(&values, t.percentile / 100.0, PERCENTILE_CI_LEVEL)
            .lower
            .is_some_and(|low| low > t.limit_ms)
    })
}

/// The probe's saturation estimate: its step with the highest Little's-law rate.
pub fn saturation_estimate(steps: Vec<ProbeStep>, stop_reason: String) -> Result<Probe> {
    let knee = steps
        .iter()
        .max_by(|a, b| a.little_rate.total_cmp(&b.little_rate))
        .context("the probe has no step")?;
    let saturation_rate = knee.little_rate;
    if !(saturation_rate.is_finite() && saturation_rate > 0.0) {
        bail!("the probe found no positive saturation rate");
    }
    Ok(Probe {
        knee_concurrency: knee.concurrency,
        saturation_rate,
        fractions: Vec::new(),
        stop_reason,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_step_surely_misses_when_even_its_low_values_do() {
        let slo = SloSpec::parse("ttft:p99:100ms").unwrap();
        let samples = |ttfts: &[f64]| LatencySamples {
            requests: ttfts
                .iter()
                .enumerate()
                .map(|(i, &t)| crate::samples::RequestSample {
                    id: i as u64,
                    ttft_ms: t,
                    ttfa_ms: Some(t),
                    tpot_ms: None,
                    e2el_ms: t,
                })
                .collect(),
            schedule_lag_ms: Vec::new(),
        };
        // 5 values: the p99's 95% interval starts at the 4th smallest.
        assert!(surely_missed(
            &slo,
            &samples(&[90.0, 120.0, 130.0, 140.0, 150.0])
        ));
        assert!(!surely_missed(
            &slo,
            &samples(&[90.0, 95.0, 99.0, 100.0, 150.0])
        ));
        // Even 2 values both above the limit put a p99 above it (0.01² chance otherwise),
        // but not a p50 (a 1 in 4 chance).
        assert!(surely_missed(&slo, &samples(&[150.0, 160.0])));
        let p50 = SloSpec::parse("ttft:p50:100ms").unwrap();
        assert!(
            !surely_missed(&p50, &samples(&[150.0, 160.0])),
            "too few to say"
        );
    }
}
