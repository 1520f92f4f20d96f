//! A/B verdicts: is A or B faster on each latency metric, and by how much?
//!
//! Per metric: the ratio B/A of medians and of p99s with 95% percentile-bootstrap CIs
//! (nearest-rank statistics; paired resampling when paired); a rank test on per-request values
//! — Wilcoxon signed-rank on paired differences B − A when requests are paired by id, else
//! Mann–Whitney U — whose p-values are Holm-corrected across the metrics tested; and Welch's
//! t-test on the per-round p99s (also Holm-corrected, reported beside the verdict).
//! The verdict follows the corrected rank-test p-value at α, its direction the test's: B's
//! values tend to be larger → "A faster". All metrics are latencies (lower is better).

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::metrics::SloMetric;
use crate::samples::{LatencySamples, LATENCY_METRICS};
use crate::stats::{
    bootstrap_ratio_ci, holm_adjust, mann_whitney_u, percentile_nearest_rank, welch_t_test,
    wilcoxon_signed_rank, Bootstrap, ConfidenceInterval, RankTest, Statistic, WelchTest,
};

/// Significance level of the verdicts.
pub const DEFAULT_ALPHA: f64 = 0.05;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pairing {
    /// Requests matched by (round, request id): Wilcoxon signed-rank on differences.
    Paired,
    /// Independent samples: Mann–Whitney U.
    Unpaired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    AFaster,
    BFaster,
    NoSignificantDifference,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::AFaster => "A faster",
            Verdict::BFaster => "B faster",
            Verdict::NoSignificantDifference => "no significant difference",
        })
    }
}

/// The values of one metric on both sides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricSamples {
    /// Per-request values; with [`Pairing::Paired`], `a[i]` and `b[i]` are the same request.
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    /// p99 of each round (nearest rank).
    pub a_round_p99: Vec<f64>,
    pub b_round_p99: Vec<f64>,
}

/// Everything the A/B analysis needs, for every latency metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbInput {
    pub pairing: Pairing,
    pub metrics: Vec<(SloMetric, MetricSamples)>,
    /// Why the input is unpaired, when pairing was asked for but impossible.
    pub notes: Vec<String>,
}

impl AbInput {
    /// Builds the input from per-round samples of each side. With `pair_by_id`, round k of A
    /// is matched with round k of B by request id (requests missing on either side, or without
    /// the metric, are left out); if no request matches, the input falls back to unpaired and
    /// says so.
    pub fn from_rounds(a: &[LatencySamples], b: &[LatencySamples], pair_by_id: bool) -> AbInput {
        let mut notes = Vec::new();
        let mut pairing = if pair_by_id {
            Pairing::Paired
        } else {
            Pairing::Unpaired
        };
        if pair_by_id && !a.iter().zip(b).any(|(ra, rb)| shares_an_id(ra, rb)) {
            notes.push(
                "Pairing by request id was asked for but no request id appears on both sides: \
                 unpaired tests used."
                    .to_string(),
            );
            pairing = Pairing::Unpaired;
        }
        let metrics = LATENCY_METRICS
            .iter()
            .map(|&metric| (metric, metric_samples(a, b, metric, pairing)))
            .collect();
        AbInput {
            pairing,
            metrics,
            notes,
        }
    }
}

fn shares_an_id(a: &LatencySamples, b: &LatencySamples) -> bool {
    let ids: std::collections::HashSet<u64> = a.requests.iter().map(|r| r.id).collect();
    b.requests.iter().any(|r| ids.contains(&r.id))
}

fn metric_samples(
    a_rounds: &[LatencySamples],
    b_rounds: &[LatencySamples],
    metric: SloMetric,
    pairing: Pairing,
) -> MetricSamples {
    let mut samples = MetricSamples::default();
    match pairing {
        Pairing::Paired => {
            for (ra, rb) in a_rounds.iter().zip(b_rounds) {
                let b_by_id: HashMap<u64, f64> = rb
                    .requests
                    .iter()
                    .filter_map(|r| Some((r.id, r.value(metric)?)))
                    .collect();
                for request in &ra.requests {
                    if let (Some(va), Some(&vb)) = (request.value(metric), b_by_id.get(&request.id))
                    {
                        samples.a.push(va);
                        samples.b.push(vb);
                    }
                }
            }
        }
        Pairing::Unpaired => {
            samples.a = a_rounds.iter().flat_map(|r| r.values(metric)).collect();
            samples.b = b_rounds.iter().flat_map(|r| r.values(metric)).collect();
        }
    }
    let round_p99 = |r: &LatencySamples| percentile_nearest_rank(&r.values(metric), 99.0);
    samples.a_round_p99 = a_rounds.iter().filter_map(round_p99).collect();
    samples.b_round_p99 = b_rounds.iter().filter_map(round_p99).collect();
    samples
}

/// The analysis of one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricVerdict {
    pub metric: SloMetric,
    pub n_a: usize,
    pub n_b: usize,
    pub median_a: Option<f64>,
    pub median_b: Option<f64>,
    pub p99_a: Option<f64>,
    pub p99_b: Option<f64>,
    /// median(B) / median(A) with its bootstrap CI.
    pub median_ratio: Option<ConfidenceInterval>,
    /// p99(B) / p99(A) with its bootstrap CI.
    pub p99_ratio: Option<ConfidenceInterval>,
    /// Wilcoxon (paired) or Mann–Whitney (unpaired); `None` when untestable.
    pub rank_test: Option<RankTest>,
    /// Holm-corrected p-value of the rank test.
    pub p_adjusted: Option<f64>,
    /// Welch's t-test on per-round p99s (A against B); needs ≥ 2 rounds per side.
    pub welch: Option<WelchTest>,
    pub welch_p_adjusted: Option<f64>,
    pub verdict: Verdict,
    /// Paired differences B − A (ms), for the histogram; empty when unpaired.
    #[serde(skip)]
    pub differences: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbReport {
    pub pairing: Pairing,
    pub alpha: f64,
    pub bootstrap: Bootstrap,
    pub metrics: Vec<MetricVerdict>,
    pub notes: Vec<String>,
}

/// Runs the analysis of every metric in `input`.
pub fn compare(input: &AbInput, alpha: f64, bootstrap: Bootstrap) -> AbReport {
    let paired = input.pairing == Pairing::Paired;
    let mut verdicts: Vec<MetricVerdict> = input
        .metrics
        .iter()
        .map(|(metric, s)| analyse(*metric, s, paired, bootstrap))
        .collect();
    let rank_p: Vec<Option<f64>> = verdicts
        .iter()
        .map(|v| v.rank_test.map(|t| t.p_value))
        .collect();
    let welch_p: Vec<Option<f64>> = verdicts
        .iter()
        .map(|v| v.welch.map(|t| t.p_value))
        .collect();
    let rank_adjusted = holm_over_present(&rank_p);
    let welch_adjusted = holm_over_present(&welch_p);
    for ((verdict, p_adj), welch_adj) in verdicts.iter_mut().zip(rank_adjusted).zip(welch_adjusted)
    {
        verdict.p_adjusted = p_adj;
        verdict.welch_p_adjusted = welch_adj;
        verdict.verdict = match (verdict.rank_test, p_adj) {
            (Some(test), Some(p)) if p <= alpha && test.direction > 0 => Verdict::AFaster,
            (Some(test), Some(p)) if p <= alpha && test.direction < 0 => Verdict::BFaster,
            _ => Verdict::NoSignificantDifference,
        };
    }
    let mut notes = input.notes.clone();
    notes.push(format!(
        "{} tests on per-request values; p-values Holm-corrected across the {} metrics tested; \
         α = {alpha}.",
        if paired {
            "Paired (Wilcoxon signed-rank on B − A by request id)"
        } else {
            "Unpaired (Mann–Whitney U)"
        },
        rank_p.iter().flatten().count()
    ));
    AbReport {
        pairing: input.pairing,
        alpha,
        bootstrap,
        metrics: verdicts,
        notes,
    }
}

fn analyse(
    metric: SloMetric,
    s: &MetricSamples,
    paired: bool,
    settings: Bootstrap,
) -> MetricVerdict {
    let differences: Vec<f64> = if paired {
        s.a.iter().zip(&s.b).map(|(a, b)| b - a).collect()
    } else {
        Vec::new()
    };
    let rank_test = if paired {
        wilcoxon_signed_rank(&differences)
    } else {
        mann_whitney_u(&s.a, &s.b)
    };
    let ratio = |statistic| bootstrap_ratio_ci(&s.a, &s.b, statistic, paired, settings);
    MetricVerdict {
        metric,
        n_a: s.a.len(),
        n_b: s.b.len(),
        median_a: percentile_nearest_rank(&s.a, 50.0),
        median_b: percentile_nearest_rank(&s.b, 50.0),
        p99_a: percentile_nearest_rank(&s.a, 99.0),
        p99_b: percentile_nearest_rank(&s.b, 99.0),
        median_ratio: ratio(Statistic::Median),
        p99_ratio: ratio(Statistic::Percentile(99.0)),
        rank_test,
        p_adjusted: None,
        welch: welch_t_test(&s.a_round_p99, &s.b_round_p99),
        welch_p_adjusted: None,
        verdict: Verdict::NoSignificantDifference,
        differences,
    }
}

/// Holm over the p-values that exist, leaving `None` in place.
fn holm_over_present(p_values: &[Option<f64>]) -> Vec<Option<f64>> {
    let present: Vec<f64> = p_values.iter().flatten().copied().collect();
    let mut adjusted = holm_adjust(&present).into_iter();
    p_values
        .iter()
        .map(|p| p.and_then(|_| adjusted.next()))
        .collect()
}
