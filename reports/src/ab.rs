//! A/B verdicts: is A or B faster on each latency metric, and by how much?
//!
//! Per metric: the ratio B/A of medians and of p99s with 95% percentile-bootstrap CIs
//! (nearest-rank statistics; paired resampling when paired); a rank test on per-request values
//! — Wilcoxon signed-rank on paired differences B − A when requests are paired by id, else
//! Mann–Whitney U — whose p-values are Holm-corrected across the metrics tested; and Welch's
//! t-test on the per-round p99s (also Holm-corrected, reported beside the verdict).
//!
//! The verdict adds practical significance: a smallest effect that matters, the margin m
//! (`--min-effect`, by default 2% of A's median, at least 1 ms for TTFT and E2E and 0.1 ms for
//! TPOT), as a band [1 − m, 1 + m] on the median ratio B/A. **B slower** (or **B faster**) when
//! the Holm-corrected rank test is significant at α in that direction *and* the ratio's CI lies
//! wholly beyond the band; **equivalent** when the CI lies wholly inside it (two one-sided
//! tests, each at (1 − confidence) / 2 ≤ α); **inconclusive** otherwise, with the number of
//! requests per side that would likely decide it (the CI's half-width shrinks like 1/√n). All
//! metrics are latencies (lower is better).

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
/// The smallest effect that matters, as a fraction of A's median.
pub const DEFAULT_MIN_EFFECT: f64 = 0.02;

/// The smallest absolute difference that matters for `metric`, in ms: below this no latency
/// difference is worth acting on, whatever its share of A's value.
pub fn min_effect_floor_ms(metric: SloMetric) -> f64 {
    match metric {
        SloMetric::Ttft | SloMetric::TimeToFirstAnswer | SloMetric::E2el => 1.0,
        SloMetric::Tpot => 0.1,
    }
}

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
    /// B's values are larger beyond the margin, significantly.
    BSlower,
    /// B's values are smaller beyond the margin, significantly.
    BFaster,
    /// The median ratio's CI lies inside the margin.
    Equivalent,
    /// Neither: more data would be needed.
    Inconclusive,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::BSlower => "B slower",
            Verdict::BFaster => "B faster",
            Verdict::Equivalent => "equivalent",
            Verdict::Inconclusive => "inconclusive",
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
    /// Rounds of side A that hold this metric.
    #[serde(default)]
    pub rounds_a: usize,
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
    /// The margin m on the median ratio: max(min effect, floor / median A).
    pub margin: Option<f64>,
    pub verdict: Verdict,
    /// When inconclusive: about how many requests per side would likely decide.
    pub requests_to_decide: Option<u64>,
    /// The same in rounds of this comparison's size.
    pub rounds_to_decide: Option<u64>,
    /// Paired differences B − A (ms), for the histogram; empty when unpaired.
    #[serde(skip)]
    pub differences: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbReport {
    pub pairing: Pairing,
    pub alpha: f64,
    /// The smallest effect that matters, as a fraction of A's median.
    pub min_effect: f64,
    pub bootstrap: Bootstrap,
    pub metrics: Vec<MetricVerdict>,
    pub notes: Vec<String>,
}

impl MetricVerdict {
    /// The verdict with its margin and, when inconclusive, what would likely decide it:
    /// "inconclusive (margin ±2.0%; about 970 requests per side, 3 rounds, would likely decide)".
    pub fn verdict_text(&self) -> String {
        let Some(margin) = self.margin else {
            return format!("{} (too few values)", self.verdict);
        };
        let margin = format!("margin ±{:.1}%", margin * 100.0);
        match (self.requests_to_decide, self.rounds_to_decide) {
            (Some(n), Some(r)) => format!(
                "{} ({margin}; about {n} requests per side, {r} round{}, would likely decide)",
                self.verdict,
                if r == 1 { "" } else { "s" }
            ),
            _ => format!("{} ({margin})", self.verdict),
        }
    }
}

impl AbReport {
    /// One sentence for the top of a report, in the four verdict words: "B (llama-server) is
    /// faster on TTFT: median 28% lower (95% CI 16–36%, p < 0.001); TPOT: inconclusive;
    /// E2E: equivalent (within ±2.0%)".
    pub fn headline(&self, b_label: &str) -> String {
        let parts: Vec<String> = self
            .metrics
            .iter()
            .map(|v| {
                let label = crate::samples::metric_label(v.metric);
                match (v.verdict, v.median_ratio) {
                    (Verdict::BSlower | Verdict::BFaster, Some(ci)) => {
                        let (word, change, lo, hi) = if v.verdict == Verdict::BFaster {
                            ("faster", "lower", 1.0 - ci.upper, 1.0 - ci.lower)
                        } else {
                            ("slower", "higher", ci.lower - 1.0, ci.upper - 1.0)
                        };
                        format!(
                            "{word} on {label}: median {:.0}% {change} (95% CI {:.0}–{:.0}%, {})",
                            (ci.estimate - 1.0).abs() * 100.0,
                            lo * 100.0,
                            hi * 100.0,
                            p_text(v.p_adjusted)
                        )
                    }
                    (Verdict::Equivalent, _) => format!(
                        "{label}: equivalent (within ±{:.1}%)",
                        v.margin.unwrap_or(0.0) * 100.0
                    ),
                    _ => format!("{label}: inconclusive"),
                }
            })
            .collect();
        format!("B ({b_label}): {}.", parts.join("; "))
    }
}

fn p_text(p: Option<f64>) -> String {
    match p {
        Some(p) if p < 0.001 => "p < 0.001".into(),
        Some(p) => format!("p = {p:.3}"),
        None => "p unknown".into(),
    }
}

/// Runs the analysis of every metric in `input`; `min_effect` is the smallest effect that
/// matters as a fraction of A's median (see the module doc).
pub fn compare(input: &AbInput, alpha: f64, min_effect: f64, bootstrap: Bootstrap) -> AbReport {
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
        decide(verdict, alpha, min_effect);
    }
    let mut notes = input.notes.clone();
    notes.push(format!(
        "{} tests on per-request values; p-values Holm-corrected across the {} metrics tested; \
         α = {alpha}. Smallest effect that matters: {:.1}% of A's median (at least 1 ms for \
         TTFT and E2E, 0.1 ms for TPOT).",
        if paired {
            "Paired (Wilcoxon signed-rank on B − A by request id)"
        } else {
            "Unpaired (Mann–Whitney U)"
        },
        rank_p.iter().flatten().count(),
        min_effect * 100.0
    ));
    AbReport {
        pairing: input.pairing,
        alpha,
        min_effect,
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
        rounds_a: s.a_round_p99.len(),
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
        margin: None,
        verdict: Verdict::Inconclusive,
        requests_to_decide: None,
        rounds_to_decide: None,
        differences,
    }
}

/// Sets the margin, the verdict and, when inconclusive, the sample size that would likely
/// decide (see the module doc).
fn decide(v: &mut MetricVerdict, alpha: f64, min_effect: f64) {
    let (Some(ci), Some(median_a)) = (v.median_ratio, v.median_a) else {
        v.verdict = Verdict::Inconclusive;
        return;
    };
    let margin = if median_a > 0.0 {
        min_effect.max(min_effect_floor_ms(v.metric) / median_a)
    } else {
        min_effect
    };
    v.margin = Some(margin);
    let significant = |direction: i8| matches!((v.rank_test, v.p_adjusted), (Some(t), Some(p)) if p <= alpha && t.direction == direction);
    v.verdict = if significant(1) && ci.lower > 1.0 + margin {
        Verdict::BSlower
    } else if significant(-1) && ci.upper < 1.0 - margin {
        Verdict::BFaster
    } else if ci.lower >= 1.0 - margin && ci.upper <= 1.0 + margin {
        Verdict::Equivalent
    } else {
        Verdict::Inconclusive
    };
    if v.verdict == Verdict::Inconclusive {
        // The CI must shrink until it fits inside the band or clears it.
        let half_width = (ci.upper - ci.lower) / 2.0;
        let distance = (ci.estimate - 1.0).abs();
        let room = (margin - distance).abs();
        let n = v.n_a.min(v.n_b) as f64;
        if room > 1e-9 && half_width > 0.0 && n > 0.0 {
            let needed = (n * (half_width / room).powi(2)).ceil().min(1e12) as u64;
            let rounds = v.rounds_a.max(1);
            v.requests_to_decide = Some(needed.max(v.n_a.min(v.n_b) as u64 + 1));
            v.rounds_to_decide = v
                .requests_to_decide
                .map(|r| r.div_ceil((n / rounds as f64).ceil().max(1.0) as u64));
        }
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
