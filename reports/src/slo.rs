//! Percentile SLOs on a run or sweep level: `ttft:p99:500ms,tpot:p99:50ms`.
//!
//! Each target is `metric[:pNN]:limit`; without a percentile the target is on p99 (so
//! `ttft:500ms` means `ttft:p99:500ms`). Metrics: `ttft`, `ttfa` (time to first answer token,
//! alias `time_to_first_answer`), `tpot`, `e2el` (alias `e2e`).
//! Limits take `ms` or `s`; a bare number is milliseconds (as in `metrics::parse_slos`).
//! Percentiles are nearest-rank, consistent with the HDR histograms of the summaries.

use std::fmt;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::metrics::PERCENTILE_CI_LEVEL;
use crate::metrics::{Slo, SloMetric};
use crate::samples::{metric_label, LatencySamples};
use crate::stats::{min_sample_for_quantile, percentile_nearest_rank};

/// Percentile used when a target does not name one.
pub const DEFAULT_PERCENTILE: f64 = 99.0;

/// One bound: the `percentile` of `metric` must be ≤ `limit_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SloTarget {
    pub metric: SloMetric,
    pub percentile: f64,
    pub limit_ms: f64,
}

/// A set of targets, all of which must hold, and the share of failed requests allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloSpec {
    pub targets: Vec<SloTarget>,
    /// Failed requests over all measured ones above this share: not met (`--max-error-rate`).
    #[serde(default = "default_max_error_rate")]
    pub max_error_rate: f64,
}

/// `--max-error-rate` unless given: 1% of the measured requests may fail.
pub const DEFAULT_MAX_ERROR_RATE: f64 = 0.01;

fn default_max_error_rate() -> f64 {
    DEFAULT_MAX_ERROR_RATE
}

impl Default for SloSpec {
    fn default() -> SloSpec {
        SloSpec {
            targets: Vec::new(),
            max_error_rate: DEFAULT_MAX_ERROR_RATE,
        }
    }
}

/// An SLO's verdict on a sample: met, not met, or unknown because the sample cannot bound a
/// target's percentile (too few requests: the "p99" of 39 is their maximum).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloVerdict {
    Met,
    NotMet,
    #[default]
    Unknown,
}

impl fmt::Display for SloVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SloVerdict::Met => "met",
            SloVerdict::NotMet => "not met",
            SloVerdict::Unknown => "unknown (too few)",
        })
    }
}

/// The outcome of one target on one sample set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: SloTarget,
    /// `None` when the samples hold no value of the metric (counts as not met).
    pub observed_ms: Option<f64>,
    pub met: bool,
    /// The sample is large enough to bound the percentile from above (95% confidence);
    /// without it the target is neither met nor not met.
    #[serde(default = "bounded_by_default")]
    pub bounded: bool,
}

/// Checks saved before `bounded` existed were taken as bounded.
fn bounded_by_default() -> bool {
    true
}

impl TargetCheck {
    /// observed / limit (how far over or under the limit), when observed.
    pub fn ratio_to_limit(&self) -> Option<f64> {
        self.observed_ms.map(|v| v / self.target.limit_ms)
    }
}

/// The outcome of every target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SloCheck {
    pub targets: Vec<TargetCheck>,
    /// The verdict is [`SloVerdict::Met`].
    pub met: bool,
    #[serde(default)]
    pub verdict: SloVerdict,
    /// Failed over all measured requests.
    #[serde(default)]
    pub error_rate: f64,
}

impl SloCheck {
    /// The largest observed/limit ratio over the targets (∞ when a metric had no data).
    pub fn worst_ratio(&self) -> f64 {
        self.targets
            .iter()
            .map(|t| t.ratio_to_limit().unwrap_or(f64::INFINITY))
            .fold(0.0, f64::max)
    }
}

impl SloSpec {
    /// The measured requests a window must hold for the [`PERCENTILE_CI_LEVEL`] interval of
    /// this SLO's highest percentile to have an upper bound (p90: 35, p99: 368, p99.9: 3,688).
    pub fn min_requests(&self) -> u64 {
        let highest = self
            .targets
            .iter()
            .map(|t| t.percentile)
            .fold(0.0, f64::max);
        min_sample_for_quantile(highest / 100.0, PERCENTILE_CI_LEVEL)
    }

    /// Parses `metric[:pNN]:limit[,…]`, e.g. `ttft:p99:500ms,tpot:50ms`.
    pub fn parse(text: &str) -> Result<SloSpec> {
        let mut targets = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            targets.push(parse_target(part).with_context(|| format!("SLO target `{part}`"))?);
        }
        if targets.is_empty() {
            bail!("SLO `{text}`: no targets (expected e.g. ttft:p99:500ms,tpot:p99:50ms)");
        }
        Ok(SloSpec {
            targets,
            max_error_rate: DEFAULT_MAX_ERROR_RATE,
        })
    }

    /// The same limits as per-request bounds, for goodput (`metrics::MetricsOptions::slos`).
    pub fn per_request(&self) -> Vec<Slo> {
        self.targets
            .iter()
            .map(|t| Slo {
                metric: t.metric,
                limit_ms: t.limit_ms,
            })
            .collect()
    }

    /// Checks every target against `samples`: not met when a target's bounded percentile
    /// passes its limit or more than `max_error_rate` of the measured requests failed;
    /// unknown when otherwise a target's percentile is not bounded by the sample; met else.
    pub fn check(&self, samples: &LatencySamples) -> SloCheck {
        let targets: Vec<TargetCheck> = self
            .targets
            .iter()
            .map(|&target| {
                // A request that never answered is beyond any bound on its first answer.
                let values = match target.metric {
                    SloMetric::TimeToFirstAnswer => samples
                        .requests
                        .iter()
                        .map(|r| r.ttfa_ms.unwrap_or(f64::INFINITY))
                        .collect(),
                    metric => samples.values(metric),
                };
                let observed_ms = percentile_nearest_rank(&values, target.percentile);
                let needed =
                    min_sample_for_quantile(target.percentile / 100.0, PERCENTILE_CI_LEVEL);
                TargetCheck {
                    target,
                    observed_ms,
                    met: observed_ms.is_some_and(|v| v <= target.limit_ms),
                    bounded: values.len() as u64 >= needed,
                }
            })
            .collect();
        let measured = samples.schedule_lag_ms.len().max(samples.requests.len());
        let failed = measured - samples.requests.len();
        let error_rate = if measured > 0 {
            failed as f64 / measured as f64
        } else {
            0.0
        };
        let verdict =
            if error_rate > self.max_error_rate || targets.iter().any(|t| t.bounded && !t.met) {
                SloVerdict::NotMet
            } else if targets.iter().any(|t| !t.bounded) {
                SloVerdict::Unknown
            } else {
                SloVerdict::Met
            };
        SloCheck {
            targets,
            met: verdict == SloVerdict::Met,
            verdict,
            error_rate,
        }
    }
}

fn parse_target(part: &str) -> Result<SloTarget> {
    let fields: Vec<&str> = part.split(':').map(str::trim).collect();
    let (name, percentile, limit) = match fields.as_slice() {
        [name, limit] => (*name, DEFAULT_PERCENTILE, *limit),
        [name, percentile, limit] => (*name, parse_percentile(percentile)?, *limit),
        _ => bail!("expected metric:limit or metric:pNN:limit, e.g. ttft:p99:500ms"),
    };
    let metric = match name {
        "ttft" => SloMetric::Ttft,
        "ttfa" | "time_to_first_answer" => SloMetric::TimeToFirstAnswer,
        "tpot" => SloMetric::Tpot,
        "e2el" | "e2e" => SloMetric::E2el,
        other => bail!("unknown metric `{other}` (ttft, ttfa, tpot, e2el)"),
    };
    Ok(SloTarget {
        metric,
        percentile,
        limit_ms: parse_limit_ms(limit)?,
    })
}

fn parse_percentile(text: &str) -> Result<f64> {
    let number = text
        .strip_prefix('p')
        .with_context(|| format!("percentile `{text}` must look like p99 or p99.9"))?;
    let value: f64 = number
        .parse()
        .with_context(|| format!("percentile `{text}` is not a number"))?;
    if !(0.0..=100.0).contains(&value) {
        bail!("percentile `{text}` is outside 0–100");
    }
    Ok(value)
}

/// A limit in ms from `250ms`, `1.5s` or a bare number of milliseconds.
pub(crate) fn parse_limit_ms(text: &str) -> Result<f64> {
    let (number, scale) = if let Some(v) = text.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = text.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .with_context(|| format!("limit `{text}` is not a number with ms or s"))?;
    if !(value.is_finite() && value > 0.0) {
        bail!("limit `{text}` must be positive");
    }
    Ok(value * scale)
}

impl fmt::Display for SloTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} p{} ≤ {} ms",
            metric_label(self.metric),
            self.percentile,
            self.limit_ms
        )
    }
}

impl fmt::Display for SloSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.targets.iter().map(ToString::to_string).collect();
        write!(f, "{}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::samples::RequestSample;

    #[test]
    fn parses_full_and_short_forms() {
        let spec = SloSpec::parse("ttft:p99:500ms, tpot:50ms,e2e:p90:2s").unwrap();
        assert_eq!(
            spec.targets,
            vec![
                SloTarget {
                    metric: SloMetric::Ttft,
                    percentile: 99.0,
                    limit_ms: 500.0
                },
                SloTarget {
                    metric: SloMetric::Tpot,
                    percentile: 99.0,
                    limit_ms: 50.0
                },
                SloTarget {
                    metric: SloMetric::E2el,
                    percentile: 90.0,
                    limit_ms: 2000.0
                },
            ]
        );
        for bad in [
            "",
            "ttft",
            "foo:1ms",
            "ttft:q99:1ms",
            "ttft:p101:1ms",
            "ttft:-3ms",
            "ttft:abc",
            "ttft:5x",
        ] {
            assert!(SloSpec::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn check_uses_nearest_rank_percentile() {
        let requests = (1..=100)
            .map(|i| RequestSample {
                id: i,
                ttft_ms: i as f64,
                ttfa_ms: (i > 10).then_some(2.0 * i as f64),
                tpot_ms: None,
                e2el_ms: 10.0 * i as f64,
            })
            .collect();
        let samples = LatencySamples {
            requests,
            schedule_lag_ms: vec![],
        };
        let spec = SloSpec::parse("ttft:p90:90ms,e2el:p50:500ms").unwrap();
        let check = spec.check(&samples);
        assert!(check.met);
        assert_eq!(check.verdict, SloVerdict::Met);
        assert_eq!(check.targets[0].observed_ms, Some(90.0));
        assert_eq!(check.targets[1].observed_ms, Some(500.0));
        // 100 values cannot bound a p99 (368 can): neither met nor not met, whatever its
        // value says.
        let p99 = SloSpec::parse("ttft:p99:99ms").unwrap().check(&samples);
        assert_eq!(p99.targets[0].observed_ms, Some(99.0));
        assert_eq!((p99.verdict, p99.met), (SloVerdict::Unknown, false));
        // A bounded target that fails decides, whatever the unbounded one says.
        let both = SloSpec::parse("ttft:p99:1s,ttft:p50:10ms")
            .unwrap()
            .check(&samples);
        assert_eq!(both.verdict, SloVerdict::NotMet);
        // Failed requests count: 2 failures in 102 measured pass the 1% default.
        let failing = LatencySamples {
            schedule_lag_ms: vec![0.0; 102],
            ..samples.clone()
        };
        let check = spec.check(&failing);
        assert_eq!(check.verdict, SloVerdict::NotMet);
        assert!((check.error_rate - 2.0 / 102.0).abs() < 1e-12);
        let lenient = SloSpec {
            max_error_rate: 0.05,
            ..spec.clone()
        };
        assert_eq!(lenient.check(&failing).verdict, SloVerdict::Met);
        // TTFA: 90 requests answered at 22, 24, …, 200 ms and 10 never did, which miss any
        // bound: the p90 is the 90th of the 100, 200 ms.
        let ttfa = SloSpec::parse("ttfa:p90:184ms").unwrap().check(&samples);
        assert_eq!(ttfa.targets[0].observed_ms, Some(200.0));
        assert_eq!(ttfa.verdict, SloVerdict::NotMet);
        assert!(
            SloSpec::parse("ttfa:p90:200ms")
                .unwrap()
                .check(&samples)
                .met
        );
        assert_eq!(
            SloSpec::parse("ttfa:p91:3600s")
                .unwrap()
                .check(&samples)
                .verdict,
            SloVerdict::NotMet,
            "the 91st is one that never answered"
        );
        let strict = SloSpec::parse("ttft:p90:89.5ms").unwrap().check(&samples);
        assert_eq!(strict.verdict, SloVerdict::NotMet);
        // No TPOT values at all: not met, and the worst ratio says so.
        let tpot = SloSpec::parse("tpot:50ms").unwrap().check(&samples);
        assert!(!tpot.met && tpot.worst_ratio().is_infinite());
    }
}
