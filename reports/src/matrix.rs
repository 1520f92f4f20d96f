//! A benchmark matrix (`loadgen matrix`): workload rows, each with a question, a hypothesis
//! and expectations the run can refute, and what each row found (`matrix.json`).
//!
//! An expectation is one statement in a small syntax:
//! - `METRIC:PNN OP LIMIT`: a latency percentile against a limit. METRIC is `ttft`, `ttfa`
//!   (time to first answer token), `tpot`, `itl` (per-token inter-token latency) or `e2e`;
//!   PNN one of `p50`, `p90`, `p95`, `p99`, `p99.9`; OP `<`, `<=`, `>` or `>=`; LIMIT a time
//!   (`250ms`, `1.5s`, a bare number is milliseconds) or a multiple of the roofline's time
//!   per output token (the larger of its memory and compute sides), `bound` or `F * bound` (for `tpot` and `itl` only).
//!   Example: `ttft:p95 < 1s`, `tpot:p50 < 1.5 * bound`.
//! - `regime = NAME` or `regime != NAME`: the diagnosis's regime (`server-errors`,
//!   `client-bound`, `kv-pressure`, `queueing`, `cold-cache`, `prefill-interference`,
//!   `tail`, `decode-memory-bound`, `decode-compute-bound`, `prefill-compute-bound`,
//!   `step-overhead`, `undetermined`).
//! - `capacity OP RATE`: for knee-search rows, the rate (requests/s, `req/s` optional) at
//!   which the SLO breaks. Example: `capacity > 2 req/s`.
//!
//! A latency or capacity statement is decided by an interval, never by a point: a
//! percentile by its 95% distribution-free interval (order statistics), the capacity by the
//! search's bracket (whose upper end failed, so the capacity lies strictly below it). A
//! regime statement is decided by the diagnosis's verdict, a rule applied to the run's
//! medians whose evidence is reported beside it; an undetermined regime decides nothing.
//! It is **confirmed** when the whole interval satisfies it, **refuted** when the whole
//! interval violates it, and **inconclusive** otherwise (an interval across the limit, a
//! sample too small to bound the percentile, an unknown bound, an undetermined regime).
//! A row is refuted when one of its expectations is, confirmed when all are, and
//! inconclusive otherwise (a row without expectations is inconclusive).
//!
//! A row run several times (`--repeats R`) decides each statement across its runs as well
//! as within each ([`Expectation::decide_across`]): a latency statement by the Student
//! t-interval over the runs' observed percentiles, each over its own limit (a multiple of the
//! bound moves with the batch measured), with one degree of freedom fewer than the runs
//! measured, and only when every run's own interval decided the same way; a regime or
//! capacity statement when every run decided it the same way. With one run measured (the
//! others failed or were cut short), that run decides, as without repeats. Runs that disagree leave it inconclusive: the verdict the
//! next run would not repeat is not given.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::capacity::usd_per_million_tokens;
use crate::diagnosis::{Diagnosis, Regime};
use crate::latency::DistStats;
use crate::slo::parse_limit_ms;
use crate::stats::t_interval;

/// The file a matrix writes into its folder.
pub const MATRIX_FILE: &str = "matrix.json";

/// What the data says of a statement or a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Confirmed,
    Refuted,
    Inconclusive,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Confirmed => "confirmed",
            Verdict::Refuted => "refuted",
            Verdict::Inconclusive => "inconclusive",
        })
    }
}

/// A latency metric an expectation can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyMetric {
    Ttft,
    Ttfa,
    Tpot,
    Itl,
    E2e,
}

impl LatencyMetric {
    fn parse(name: &str) -> Result<LatencyMetric> {
        Ok(match name {
            "ttft" => LatencyMetric::Ttft,
            "ttfa" => LatencyMetric::Ttfa,
            "tpot" => LatencyMetric::Tpot,
            "itl" => LatencyMetric::Itl,
            "e2e" | "e2el" => LatencyMetric::E2e,
            other => {
                bail!("unknown metric `{other}` (ttft, ttfa, tpot, itl, e2e, regime, capacity)")
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            LatencyMetric::Ttft => "ttft",
            LatencyMetric::Ttfa => "ttfa",
            LatencyMetric::Tpot => "tpot",
            LatencyMetric::Itl => "itl",
            LatencyMetric::E2e => "e2e",
        }
    }

    /// The distribution's name in a summary's `metrics`.
    fn summary_key(self) -> &'static str {
        match self {
            LatencyMetric::Ttft => "ttft",
            LatencyMetric::Ttfa => "time_to_first_answer",
            LatencyMetric::Tpot => "tpot",
            LatencyMetric::Itl => "token_itl",
            LatencyMetric::E2e => "e2el",
        }
    }

    /// A per-token time, which the decode bound is in the units of.
    fn per_token(self) -> bool {
        matches!(self, LatencyMetric::Tpot | LatencyMetric::Itl)
    }
}

/// `<`, `<=`, `>` or `>=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Comparison {
    fn symbol(self) -> &'static str {
        match self {
            Comparison::Less => "<",
            Comparison::LessOrEqual => "<=",
            Comparison::Greater => ">",
            Comparison::GreaterOrEqual => ">=",
        }
    }

    fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Comparison::Less => value < limit,
            Comparison::LessOrEqual => value <= limit,
            Comparison::Greater => value > limit,
            Comparison::GreaterOrEqual => value >= limit,
        }
    }

    /// The verdict on an interval `[lower, upper]` (`None`: beyond the sample, unknown):
    /// confirmed when every value in it satisfies the comparison, refuted when none does.
    fn decide(self, lower: Option<f64>, upper: Option<f64>, limit: f64) -> Verdict {
        let (all_end, none_end) = match self {
            // Every value < limit when the upper end is; none when the lower end is not.
            Comparison::Less | Comparison::LessOrEqual => (upper, lower),
            Comparison::Greater | Comparison::GreaterOrEqual => (lower, upper),
        };
        if all_end.is_some_and(|v| self.holds(v, limit)) {
            Verdict::Confirmed
        } else if none_end.is_some_and(|v| !self.holds(v, limit)) {
            Verdict::Refuted
        } else {
            Verdict::Inconclusive
        }
    }
}

/// A latency limit: a time, or a multiple of the decode bound's time per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    Ms(f64),
    TimesBound(f64),
}

/// One statement a row's run can refute (see the module doc for the syntax).
#[derive(Debug, Clone, PartialEq)]
pub enum Expectation {
    Latency {
        metric: LatencyMetric,
        /// 0–1.
        quantile: f64,
        comparison: Comparison,
        limit: Limit,
    },
    Regime {
        equal: bool,
        regime: Regime,
    },
    Capacity {
        comparison: Comparison,
        rate: f64,
    },
}

fn number(text: &str, what: &str) -> Result<f64> {
    let value: f64 = text
        .trim()
        .parse()
        .with_context(|| format!("{what} `{}` is not a number", text.trim()))?;
    if !(value.is_finite() && value > 0.0) {
        bail!("{what} `{}` must be a positive number", text.trim());
    }
    Ok(value)
}

fn parse_limit(text: &str) -> Result<Limit> {
    let text = text.trim();
    if text == "bound" {
        return Ok(Limit::TimesBound(1.0));
    }
    if let Some((factor, rest)) = text.split_once('*') {
        if rest.trim() != "bound" {
            bail!("`{text}`: a product must be `F * bound`");
        }
        return Ok(Limit::TimesBound(number(factor, "the factor")?));
    }
    Ok(Limit::Ms(parse_limit_ms(text)?))
}

/// The percentiles a statement may name: those a summary reports with their intervals.
const QUANTILES: [(&str, f64); 5] = [
    ("p50", 0.5),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
];

fn parse_quantile(text: &str) -> Result<f64> {
    let text = text.trim();
    QUANTILES
        .iter()
        .find(|(name, _)| *name == text)
        .map(|(_, q)| *q)
        .with_context(|| format!("percentile `{text}`: one of p50, p90, p95, p99, p99.9"))
}

fn quantile_name(q: f64) -> &'static str {
    QUANTILES
        .iter()
        .find(|(_, level)| *level == q)
        .map_or("p?", |(name, _)| name)
}

impl Expectation {
    /// Parses one statement; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Expectation> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("regime") {
            let rest = rest.trim_start();
            let (equal, name) = if let Some(name) = rest.strip_prefix("!=") {
                (false, name.trim())
            } else if let Some(name) = rest.strip_prefix('=') {
                (true, name.trim())
            } else {
                bail!("`{text}`: a regime is compared with = or !=, e.g. `regime = decode-memory-bound`");
            };
            let regime: Regime = serde_json::from_value(serde_json::json!(name))
                .map_err(|_| anyhow::anyhow!("unknown regime `{name}` (server-errors, decode-memory-bound, prefill-compute-bound, queueing, kv-pressure, cold-cache, tail, client-bound)"))?;
            if regime == Regime::Undetermined {
                bail!("`{text}`: `undetermined` is no regime the run could show or rule out");
            }
            return Ok(Expectation::Regime { equal, regime });
        }
        // Two-character operators first, so that `<=` is not read as `<`.
        let (left, comparison, right) = [
            ("<=", Comparison::LessOrEqual),
            (">=", Comparison::GreaterOrEqual),
            ("<", Comparison::Less),
            (">", Comparison::Greater),
        ]
        .into_iter()
        .find_map(|(symbol, c)| {
            text.split_once(symbol)
                .map(|(l, r)| (l.trim(), c, r.trim()))
        })
        .with_context(|| {
            format!("`{text}`: expected `METRIC:PNN < LIMIT`, `regime = NAME` or `capacity > RATE`")
        })?;
        if left == "capacity" {
            let rate = right.strip_suffix("req/s").unwrap_or(right).trim();
            return Ok(Expectation::Capacity {
                comparison,
                rate: number(rate, "the rate (req/s)")?,
            });
        }
        let (metric, percentile) = left.split_once(':').with_context(|| {
            format!("`{left}`: name a percentile, e.g. `{left}:p95` (or `regime`, `capacity`)")
        })?;
        let metric = LatencyMetric::parse(metric.trim())?;
        let limit = parse_limit(right)?;
        if matches!(limit, Limit::TimesBound(_)) && !metric.per_token() {
            bail!(
                "`{text}`: the bound is a time per output token, for tpot and itl; {} is not one",
                metric.name()
            );
        }
        Ok(Expectation::Latency {
            metric,
            quantile: parse_quantile(percentile)?,
            comparison,
            limit,
        })
    }

    /// Whether the statement is about a knee search's capacity.
    pub fn is_capacity(&self) -> bool {
        matches!(self, Expectation::Capacity { .. })
    }
}

impl fmt::Display for Expectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expectation::Latency {
                metric,
                quantile,
                comparison,
                limit,
            } => {
                let limit = match limit {
                    Limit::Ms(ms) => format!("{ms}ms"),
                    Limit::TimesBound(k) if *k == 1.0 => "bound".into(),
                    Limit::TimesBound(k) => format!("{k} * bound"),
                };
                write!(
                    f,
                    "{}:{} {} {limit}",
                    metric.name(),
                    quantile_name(*quantile),
                    comparison.symbol()
                )
            }
            Expectation::Regime { equal, regime } => {
                write!(f, "regime {} {regime}", if *equal { "=" } else { "!=" })
            }
            Expectation::Capacity { comparison, rate } => {
                write!(f, "capacity {} {rate} req/s", comparison.symbol())
            }
        }
    }
}

/// A knee search's bracket of the SLO crossing, requests/s: the highest passing rate and
/// the lowest failing one above it (`None`: no level on that side).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityBracket {
    pub lower: Option<f64>,
    pub upper: Option<f64>,
}

/// What a row measured, that its expectations are decided on.
pub struct Evidence<'a> {
    /// The summary's distributions (a knee-search row: its knee level's).
    pub metrics: &'a BTreeMap<String, DistStats>,
    pub diagnosis: Option<&'a Diagnosis>,
    /// Knee-search rows only.
    pub capacity: Option<CapacityBracket>,
}

/// One expectation and how the data decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decided {
    /// The statement, written canonically.
    pub expectation: String,
    pub verdict: Verdict,
    /// The measured value (a percentile in ms, a capacity in req/s); null when none.
    pub observed: Option<f64>,
    /// The interval that decided, `[lower, upper]`; an end is null where it lies beyond
    /// the sample (or no level ran on that side of a bracket).
    pub interval: Option<[Option<f64>; 2]>,
    /// The limit the statement compares with (ms, req/s), the bound's multiple worked out.
    pub limit: Option<f64>,
    /// Why, in words.
    pub reason: String,
}

fn fmt_end(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.3}"))
}

impl Expectation {
    /// Decides the statement on `evidence`.
    pub fn decide(&self, evidence: &Evidence<'_>) -> Decided {
        let mut decided = Decided {
            expectation: self.to_string(),
            verdict: Verdict::Inconclusive,
            observed: None,
            interval: None,
            limit: None,
            reason: String::new(),
        };
        match self {
            Expectation::Latency {
                metric,
                quantile,
                comparison,
                limit,
            } => {
                let limit_ms = match limit {
                    Limit::Ms(ms) => Some(*ms),
                    Limit::TimesBound(k) => evidence
                        .diagnosis
                        .and_then(|d| d.bound.as_ref())
                        .map(|b| k * b.tpot_ms),
                };
                let Some(limit_ms) = limit_ms else {
                    decided.reason = match evidence.diagnosis {
                        Some(d) if !d.missing.is_empty() => format!(
                            "the roofline is unknown; the diagnosis lacked: {}",
                            d.missing.join("; ")
                        ),
                        Some(_) => "the roofline was not worked out: no batch was measured".into(),
                        None => "the run was not diagnosed, so the roofline is unknown".into(),
                    };
                    return decided;
                };
                decided.limit = Some(limit_ms);
                let stats = evidence
                    .metrics
                    .get(metric.summary_key())
                    .filter(|s| s.count > 0);
                let Some((value, ci)) = stats.and_then(|s| s.percentile(*quantile)) else {
                    decided.reason = format!("no {} was measured", metric.name());
                    return decided;
                };
                decided.observed = Some(value);
                decided.interval = Some([ci.lower, ci.upper]);
                decided.verdict = comparison.decide(ci.lower, ci.upper, limit_ms);
                decided.reason = format!(
                    "{} {} = {value:.3} ms, 95% interval [{}, {}] ms, limit {limit_ms:.3} ms",
                    metric.name(),
                    quantile_name(*quantile),
                    ci.lower.map_or("below min".into(), |v| format!("{v:.3}")),
                    ci.upper.map_or("above max".into(), |v| format!("{v:.3}")),
                );
                if decided.verdict == Verdict::Inconclusive {
                    decided.reason.push_str(": the interval reaches both sides of the limit, or the sample is too small to bound it");
                }
            }
            Expectation::Regime { equal, regime } => {
                let Some(diagnosis) = evidence.diagnosis else {
                    decided.reason = "the run was not diagnosed".into();
                    return decided;
                };
                if diagnosis.regime == Regime::Undetermined {
                    decided.reason = format!("the regime is undetermined: {}", diagnosis.evidence);
                    return decided;
                }
                let same = diagnosis.regime == *regime;
                decided.verdict = if same == *equal {
                    Verdict::Confirmed
                } else {
                    Verdict::Refuted
                };
                decided.reason = format!("diagnosed {}: {}", diagnosis.regime, diagnosis.evidence);
            }
            Expectation::Capacity { comparison, rate } => {
                let Some(bracket) = evidence.capacity else {
                    decided.reason = "no knee search ran for this row".into();
                    return decided;
                };
                decided.limit = Some(*rate);
                // No passing level: the crossing lies below every rate tried, above 0.
                let lower = bracket.lower.or(Some(0.0));
                decided.interval = Some([lower, bracket.upper]);
                decided.observed = bracket.lower;
                // The upper end failed: the capacity lies strictly below it.
                let below = bracket.upper.is_some_and(|upper| upper <= *rate);
                decided.verdict = match comparison {
                    Comparison::Less | Comparison::LessOrEqual if below => Verdict::Confirmed,
                    Comparison::Greater | Comparison::GreaterOrEqual if below => Verdict::Refuted,
                    _ => comparison.decide(lower, bracket.upper, *rate),
                };
                decided.reason = format!(
                    "the SLO breaks between {} and {} req/s (the search's bracket)",
                    fmt_end(lower),
                    fmt_end(bracket.upper)
                );
            }
        }
        decided
    }
}

impl Expectation {
    /// The statement decided across the runs of a row run several times (`runs`: its
    /// decision in each, in order; see the module doc). The interval is the between-run
    /// t-interval of a latency statement, the hull of the runs' brackets of a capacity one.
    pub fn decide_across(&self, runs: &[&Decided]) -> Decided {
        let Some(first) = runs.first() else {
            return self.decide(&Evidence {
                metrics: &BTreeMap::new(),
                diagnosis: None,
                capacity: None,
            });
        };
        // One run measured (the others failed or were cut short): its own decision, as with
        // a single run, and no interval across runs.
        if let [only] = runs {
            let mut decided = (*only).clone();
            decided.reason = format!(
                "1 run measured, so no interval across runs: {}",
                decided.reason
            );
            return decided;
        }
        let agreed = runs
            .iter()
            .all(|d| d.verdict == first.verdict)
            .then_some(first.verdict);
        let each: Vec<String> = runs
            .iter()
            .map(|d| match d.observed {
                Some(v) => format!("{} ({v:.3})", d.verdict),
                None => d.verdict.to_string(),
            })
            .collect();
        let mut decided = Decided {
            expectation: self.to_string(),
            verdict: agreed.unwrap_or(Verdict::Inconclusive),
            observed: None,
            interval: None,
            limit: first.limit,
            reason: format!("{} runs: {}", runs.len(), each.join(", ")),
        };
        match self {
            Expectation::Latency { comparison, .. } => {
                // Each run's value over its own limit (a multiple of the bound differs from
                // run to run with the batch and context measured), compared with 1.
                let ratios: Vec<f64> = runs
                    .iter()
                    .filter_map(|d| d.observed.zip(d.limit).map(|(v, l)| v / l))
                    .collect();
                let between = (ratios.len() == runs.len())
                    .then(|| t_interval(&ratios, 0.95))
                    .flatten();
                let Some(ci) = between else {
                    decided.verdict = Verdict::Inconclusive;
                    decided.reason.push_str(
                        "; a run without a value (or a limit): no interval across the runs",
                    );
                    return decided;
                };
                let limit = runs.iter().filter_map(|d| d.limit).sum::<f64>() / runs.len() as f64;
                decided.limit = Some(limit);
                decided.observed = Some(ci.estimate * limit);
                decided.interval = Some([Some(ci.lower * limit), Some(ci.upper * limit)]);
                let across = comparison.decide(Some(ci.lower), Some(ci.upper), 1.0);
                decided.reason.push_str(&format!(
                    "; across them {:.3} times the limit, 95% t-interval [{:.3}, {:.3}] ({} \
                     degrees of freedom; {:.3} ms, [{:.3}, {:.3}] ms at the mean limit \
                     {limit:.3} ms)",
                    ci.estimate,
                    ci.lower,
                    ci.upper,
                    runs.len() - 1,
                    ci.estimate * limit,
                    ci.lower * limit,
                    ci.upper * limit,
                ));
                decided.verdict = match agreed {
                    Some(v) if v == across => v,
                    _ => {
                        decided.reason.push_str(&format!(
                            ": inconclusive, the interval across the runs says {across} and \
                             the runs' own intervals {}",
                            agreed.map_or("disagree".to_string(), |v| format!("say {v}"))
                        ));
                        Verdict::Inconclusive
                    }
                };
            }
            Expectation::Capacity { .. } => {
                let ends = |pick: fn(&[Option<f64>; 2]) -> Option<f64>| -> Vec<Option<f64>> {
                    runs.iter()
                        .map(|d| d.interval.as_ref().and_then(pick))
                        .collect()
                };
                let hull = |values: Vec<Option<f64>>, min: bool| -> Option<f64> {
                    values.into_iter().try_fold(None::<f64>, |acc, v| {
                        let v = v?;
                        Some(Some(
                            acc.map_or(v, |a| if min { a.min(v) } else { a.max(v) }),
                        ))
                    })?
                };
                decided.interval = Some([hull(ends(|i| i[0]), true), hull(ends(|i| i[1]), false)]);
                decided.observed = runs
                    .iter()
                    .map(|d| d.observed)
                    .collect::<Option<Vec<f64>>>()
                    .map(|v| v.iter().sum::<f64>() / v.len() as f64);
                if agreed.is_none() {
                    decided.reason.push_str(": the runs disagree");
                }
            }
            Expectation::Regime { .. } => {
                if agreed.is_none() {
                    decided.reason.push_str(": the runs disagree");
                }
            }
        }
        decided
    }
}

/// The entry of a row run several times (`--repeats`): each statement of `expect` decided
/// across `runs` (each run's own entry, in order, kept under `runs`), the row's figures
/// (TPOT, its ratio to the bound, output rate) the runs' means, its regime theirs where they
/// agree, its capacity the hull of their brackets. A run that failed is kept but decides
/// nothing.
pub fn repeated_row(expect: &[Expectation], runs: Vec<MatrixRow>) -> MatrixRow {
    let measured: Vec<&MatrixRow> = runs.iter().filter(|r| r.error.is_none()).collect();
    let mean = |pick: fn(&MatrixRow) -> Option<f64>| {
        let values: Vec<f64> = measured.iter().filter_map(|r| pick(r)).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let expectations: Vec<Decided> = expect
        .iter()
        .enumerate()
        .map(|(j, e)| {
            let each: Vec<&Decided> = measured
                .iter()
                .filter_map(|r| r.expectations.get(j))
                .collect();
            e.decide_across(&each)
        })
        .collect();
    // The first measured run stands for the row (its folder, its report); a failed one has
    // neither.
    let first = measured
        .first()
        .copied()
        .or(runs.first())
        .cloned()
        .expect("a row ran at least once");
    let agreed_regime = measured
        .iter()
        .all(|r| r.regime == first.regime)
        .then_some(first.regime);
    let output_tok_per_s = mean(|r| r.output_tok_per_s);
    // The cost is inverse to the output rate: the mean rate's, not the mean of the costs.
    let usd_per_million_output_tokens = measured
        .iter()
        .find_map(|r| r.usd_per_million_output_tokens.zip(r.output_tok_per_s))
        .zip(output_tok_per_s)
        .map(|((usd, rate), mean_rate)| usd * rate / mean_rate);
    let capacity = measured
        .iter()
        .filter_map(|r| r.capacity)
        .reduce(|a, b| CapacityBracket {
            lower: a.lower.zip(b.lower).map(|(x, y)| x.min(y)),
            upper: a.upper.zip(b.upper).map(|(x, y)| x.max(y)),
        });
    MatrixRow {
        verdict: row_verdict(&expectations),
        expectations,
        regime: agreed_regime.unwrap_or(Regime::Undetermined),
        regime_evidence: match agreed_regime {
            Some(_) => first.regime_evidence.clone(),
            None => format!(
                "the runs disagree: {}",
                measured
                    .iter()
                    .map(|r| r.regime.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        tpot_p50_ms: mean(|r| r.tpot_p50_ms),
        bound_tpot_ms: mean(|r| r.bound_tpot_ms),
        tpot_over_bound: mean(|r| r.tpot_over_bound),
        output_tok_per_s,
        usd_per_million_output_tokens,
        capacity,
        error: measured.is_empty().then(|| "every run failed".to_string()),
        runs,
        ..first
    }
}

/// A row's verdict from its expectations' (see the module doc).
pub fn row_verdict(decided: &[Decided]) -> Verdict {
    if decided.iter().any(|d| d.verdict == Verdict::Refuted) {
        Verdict::Refuted
    } else if !decided.is_empty() && decided.iter().all(|d| d.verdict == Verdict::Confirmed) {
        Verdict::Confirmed
    } else {
        Verdict::Inconclusive
    }
}

/// USD per million output tokens at `output_tok_per_s` sustained by an instance of `gpus`
/// GPUs at `gpu_hour_usd` each; `None` when nothing was produced.
pub fn usd_per_million_output_tokens(
    gpu_hour_usd: f64,
    gpus: u32,
    output_tok_per_s: f64,
) -> Option<f64> {
    (output_tok_per_s > 0.0)
        .then(|| usd_per_million_tokens(gpu_hour_usd * f64::from(gpus), output_tok_per_s))
}

/// What one row found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixRow {
    pub name: String,
    pub question: String,
    pub hypothesis: String,
    /// Its run folder (a knee-search row: its sweep folder), relative to the matrix's.
    pub folder: String,
    /// The load in words: "rate 2 req/s", "concurrency 8", "knee search".
    pub load: String,
    /// `cold` or `warm`.
    pub prefix: String,
    pub verdict: Verdict,
    pub expectations: Vec<Decided>,
    pub regime: Regime,
    pub regime_evidence: String,
    /// Median TPOT (ms) and the bound's at the observed batch and context.
    pub tpot_p50_ms: Option<f64>,
    pub bound_tpot_ms: Option<f64>,
    /// The side of the roofline that binds at the observed batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_binds: Option<crate::bound::Side>,
    pub tpot_over_bound: Option<f64>,
    /// Output tokens/s sustained over the measured window (a knee-search row: at its knee).
    pub output_tok_per_s: Option<f64>,
    pub usd_per_million_output_tokens: Option<f64>,
    /// Knee-search rows: the bracket of the SLO's crossing.
    pub capacity: Option<CapacityBracket>,
    /// Why the row has no measurement, when it failed.
    pub error: Option<String>,
    /// With `--repeats`: each run's own entry, in the order they ran (the first is the
    /// row's own folder); the fields above are then decided across them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<MatrixRow>,
}

/// `matrix.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixFile {
    pub schema_version: u32,
    /// The matrix file run (or `preset methodology`).
    pub source: String,
    /// `--scale`.
    pub scale: f64,
    /// The server: its URL, or the command that started it.
    pub server: String,
    /// `--gpu-hour-usd` and `--gpus-per-instance`, when given.
    pub gpu_hour_usd: Option<f64>,
    pub gpus_per_instance: u32,
    pub rows: Vec<MatrixRow>,
    /// Why the matrix ended before its last row.
    pub stop_reason: Option<String>,
}

impl MatrixFile {
    pub fn read(path: &Path) -> Result<MatrixFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::QuantileCi;

    fn stats(p50: f64, lower: Option<f64>, upper: Option<f64>) -> BTreeMap<String, DistStats> {
        let mut s = DistStats {
            count: 100,
            p50,
            ..DistStats::default()
        };
        s.ci.p50 = QuantileCi { lower, upper };
        BTreeMap::from([("ttft".to_string(), s), ("tpot".to_string(), s)])
    }

    /// Across runs: confirmed only where every run's own interval and the t-interval over
    /// the runs' values agree; three runs each confirmed on its own but spread across the
    /// limit are inconclusive, as are runs that disagree.
    #[test]
    fn a_statement_is_decided_across_runs_and_within_each() {
        let e = Expectation::parse("ttft:p50 < 100ms").unwrap();
        let run = |p50: f64, lower: f64, upper: f64| {
            e.decide(&Evidence {
                metrics: &stats(p50, Some(lower), Some(upper)),
                diagnosis: None,
                capacity: None,
            })
        };
        let tight = [
            run(60.0, 58.0, 62.0),
            run(61.0, 59.0, 63.0),
            run(62.0, 60.0, 64.0),
        ];
        let decided = e.decide_across(&tight.iter().collect::<Vec<_>>());
        assert_eq!(decided.verdict, Verdict::Confirmed, "{}", decided.reason);
        // mean 61, sd 1: t(2 df) 4.303 × 1 / √3 = 2.484.
        let [lower, upper] = decided.interval.unwrap();
        assert!((lower.unwrap() - 58.516).abs() < 1e-3 && (upper.unwrap() - 63.484).abs() < 1e-3);
        assert!((decided.observed.unwrap() - 61.0).abs() < 1e-9);
        // Each run confirmed on its own, but the runs spread: mean 70, sd 27.8, the
        // t-interval reaches past 100 ms.
        let spread = [
            run(40.0, 38.0, 42.0),
            run(95.0, 93.0, 97.0),
            run(75.0, 73.0, 77.0),
        ];
        let decided = e.decide_across(&spread.iter().collect::<Vec<_>>());
        assert_eq!(decided.verdict, Verdict::Inconclusive, "{}", decided.reason);
        assert!(decided
            .reason
            .contains("the interval across the runs says inconclusive"));
        // One run refuted, two confirmed.
        let split = [
            run(60.0, 58.0, 62.0),
            run(110.0, 105.0, 115.0),
            run(61.0, 59.0, 63.0),
        ];
        let decided = e.decide_across(&split.iter().collect::<Vec<_>>());
        assert_eq!(decided.verdict, Verdict::Inconclusive, "{}", decided.reason);
        assert!(decided.reason.contains("runs' own intervals disagree"));
        // A limit that is a multiple of the bound differs from run to run: each run's value
        // is read against its own (0.9, 0.9 and 0.91 of it), not the values against one.
        let against = |observed: f64, limit: f64| Decided {
            observed: Some(observed),
            limit: Some(limit),
            ..tight[0].clone()
        };
        let bound = [
            against(90.0, 100.0),
            against(45.0, 50.0),
            against(91.0, 100.0),
        ];
        let decided = e.decide_across(&bound.iter().collect::<Vec<_>>());
        assert_eq!(decided.verdict, Verdict::Confirmed, "{}", decided.reason);
        assert!((decided.limit.unwrap() - 250.0 / 3.0).abs() < 1e-9);
        // A regime statement: the runs' verdicts, where they agree.
        let regime = Expectation::parse("regime != queueing").unwrap();
        let confirmed = Decided {
            verdict: Verdict::Confirmed,
            ..tight[0].clone()
        };
        let refuted = Decided {
            verdict: Verdict::Refuted,
            ..tight[0].clone()
        };
        assert_eq!(
            regime.decide_across(&[&confirmed, &confirmed]).verdict,
            Verdict::Confirmed
        );
        assert_eq!(
            regime.decide_across(&[&confirmed, &refuted]).verdict,
            Verdict::Inconclusive
        );
    }

    #[test]
    fn statements_parse_into_their_canonical_form() {
        for (text, canonical) in [
            ("ttft:p95 < 1s", "ttft:p95 < 1000ms"),
            ("tpot:p50 < 1.5 * bound", "tpot:p50 < 1.5 * bound"),
            ("itl:p99<=bound", "itl:p99 <= bound"),
            ("e2el:p99.9 >= 250", "e2e:p99.9 >= 250ms"),
            (
                "regime = decode-memory-bound",
                "regime = decode-memory-bound",
            ),
            ("regime != queueing", "regime != queueing"),
            ("capacity > 2 req/s", "capacity > 2 req/s"),
        ] {
            assert_eq!(Expectation::parse(text).unwrap().to_string(), canonical);
        }
        for (text, says) in [
            ("ttft < 1s", "name a percentile"),
            ("ttft:p42 < 1s", "percentile `p42`"),
            ("ttft:p95 < 2 * bound", "for tpot and itl"),
            ("ttft:p95 < -1s", "positive"),
            ("tpot:p50 ~ 3ms", "expected"),
            ("regime = fast", "unknown regime `fast`"),
            ("regime = undetermined", "no regime the run could show"),
            ("regime != undetermined", "`regime != undetermined`"),
            ("regime <= queueing", "compared with = or !="),
            ("latency:p50 < 1s", "unknown metric `latency`"),
            ("tpot:p50 < 2 * bandwidth", "F * bound"),
        ] {
            let err = format!("{:#}", Expectation::parse(text).unwrap_err());
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn an_interval_wholly_on_one_side_decides_and_one_across_the_limit_does_not() {
        let e = |text: &str, metrics: &BTreeMap<String, DistStats>| {
            Expectation::parse(text).unwrap().decide(&Evidence {
                metrics,
                diagnosis: None,
                capacity: None,
            })
        };
        let tight = stats(100.0, Some(90.0), Some(110.0));
        assert_eq!(e("ttft:p50 < 120ms", &tight).verdict, Verdict::Confirmed);
        assert_eq!(e("ttft:p50 < 80ms", &tight).verdict, Verdict::Refuted);
        assert_eq!(e("ttft:p50 < 100ms", &tight).verdict, Verdict::Inconclusive);
        assert_eq!(e("ttft:p50 > 80ms", &tight).verdict, Verdict::Confirmed);
        assert_eq!(
            e("ttft:p50 >= 110ms", &tight).verdict,
            Verdict::Inconclusive
        );
        assert_eq!(e("ttft:p50 > 110ms", &tight).verdict, Verdict::Refuted);
        // An interval whose upper end lies beyond the sample confirms no upper limit.
        let open = stats(100.0, Some(90.0), None);
        assert_eq!(e("ttft:p50 < 1s", &open).verdict, Verdict::Inconclusive);
        assert_eq!(e("ttft:p50 < 50ms", &open).verdict, Verdict::Refuted);
        let decided = e("ttft:p50 < 120ms", &tight);
        assert_eq!(decided.interval, Some([Some(90.0), Some(110.0)]));
        assert_eq!(
            (decided.observed, decided.limit),
            (Some(100.0), Some(120.0))
        );
        // The bound unknown: nothing to compare with.
        let unknown = e("tpot:p50 < 2 * bound", &tight);
        assert_eq!(unknown.verdict, Verdict::Inconclusive);
        assert!(
            unknown.reason.contains("not diagnosed"),
            "{}",
            unknown.reason
        );
    }

    #[test]
    fn capacity_is_decided_by_the_bracket() {
        let metrics = BTreeMap::new();
        let decide = |text: &str, lower: Option<f64>, upper: Option<f64>| {
            Expectation::parse(text)
                .unwrap()
                .decide(&Evidence {
                    metrics: &metrics,
                    diagnosis: None,
                    capacity: Some(CapacityBracket { lower, upper }),
                })
                .verdict
        };
        assert_eq!(
            decide("capacity > 2", Some(3.0), Some(3.3)),
            Verdict::Confirmed
        );
        assert_eq!(
            decide("capacity > 4", Some(3.0), Some(3.3)),
            Verdict::Refuted
        );
        assert_eq!(
            decide("capacity > 3.1", Some(3.0), Some(3.3)),
            Verdict::Inconclusive
        );
        assert_eq!(decide("capacity > 2", Some(3.0), None), Verdict::Confirmed);
        assert_eq!(decide("capacity > 2", None, Some(1.5)), Verdict::Refuted);
        assert_eq!(
            decide("capacity < 1", None, Some(1.5)),
            Verdict::Inconclusive
        );
    }

    #[test]
    fn a_row_is_refuted_by_one_statement_and_confirmed_by_all() {
        let d = |verdict| Decided {
            expectation: String::new(),
            verdict,
            observed: None,
            interval: None,
            limit: None,
            reason: String::new(),
        };
        use Verdict::*;
        assert_eq!(row_verdict(&[d(Confirmed), d(Refuted)]), Refuted);
        assert_eq!(row_verdict(&[d(Confirmed), d(Confirmed)]), Confirmed);
        assert_eq!(row_verdict(&[d(Confirmed), d(Inconclusive)]), Inconclusive);
        assert_eq!(row_verdict(&[]), Inconclusive);
    }

    #[test]
    fn cost_follows_the_sustained_output_rate() {
        // $2/GPU-hour × 2 GPUs = $4/h; 1,000 tok/s = 3.6 M tok/h: $1.111 per million.
        let cost = usd_per_million_output_tokens(2.0, 2, 1000.0).unwrap();
        assert!((cost - 4.0 / 3.6).abs() < 1e-9, "{cost}");
        let half = usd_per_million_output_tokens(2.0, 2, 500.0).unwrap();
        assert!((half - 2.0 * cost).abs() < 1e-9);
        assert_eq!(usd_per_million_output_tokens(2.0, 1, 0.0), None);
    }
}
