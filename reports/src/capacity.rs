//! Capacity plans from a sweep: the max sustainable QPS under an SLO, and the instances, GPUs
//! and cost needed for a target load.
//!
//! Definitions (the rates of docs/ARCHITECTURE.md, made precise):
//! - a level passes when every SLO target holds and it did not saturate;
//! - max sustainable QPS = the sustained rate ([`crate::rates`]) of the highest passing level;
//! - levels run at one offered rate (`--repeats`) are pooled: their requests together, saturated
//!   when at least half of them were;
//! - the interpolated crossing lies between that level (its sustained rate r1) and the next
//!   higher level that failed, saturated or with the SLO not met (its sustained rate r2: the
//!   load it did not carry, or for a saturated level what it completed, the server's
//!   throughput, which caps the crossing; a level between them whose verdict is unknown, too
//!   few requests, bounds nothing): for each target that the higher level breaks, the rate
//!   where the straight line through the two levels' percentile values meets the limit,
//!   clamped to [r1, r2]; the crossing is the smallest over targets. Its CI comes from
//!   resampling both boundary levels' requests (seeded percentile bootstrap): one run's
//!   sampling error; when the higher level saturated, r2 is itself uncertain (k completions: a
//!   Poisson count, relative error 1/√k), so each replicate also redraws it. An interval that
//!   still has no width is reported as none (a note says so), never as a point;
//! - the crossing between runs: each run of a sweep with `--repeats` (the levels of one
//!   repeat index, the search's own being run 0) gives its own crossing between its highest
//!   passing level and the next failing one ([`run_crossing`]: an arrival rate, interpolated
//!   on the reciprocal of the percentiles); the Student t-interval of their mean (R − 1
//!   degrees of freedom) covers the variation from run to run, which no resampling of one
//!   run's requests can;
//! - instances = ⌈target QPS × headroom / max QPS⌉: the headroom inflates the load before
//!   rounding, so every instance runs at most at max QPS / headroom (applying it to the
//!   rounded GPU count instead could give fractional GPUs); GPUs = instances × GPUs per
//!   instance. The measured level sizes the fleet, or with at least
//!   [`MIN_RUNS_TO_SIZE_BETWEEN`] runs the lower end of the crossing between runs (what the
//!   next run on the same machine may find), whichever is lower;
//! - target QPS = the given QPS, or daily requests / 86 400 × peak factor.

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::samples::LatencySamples;
use crate::server_metrics::ServerView;
use crate::slo::{SloCheck, SloSpec, SloVerdict};
use crate::stats::{percentile_linear, t_interval, Bootstrap, ConfidenceInterval, Statistic};

/// Default headroom factor on the target load.
pub const DEFAULT_HEADROOM: f64 = 1.2;

/// Runs from which a plan sizes from the crossing between runs.
pub const MIN_RUNS_TO_SIZE_BETWEEN: usize = 3;

/// One level of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepLevel {
    /// The offered rate (see [`crate::rates`]).
    pub offered_rate: f64,
    /// The completed rate (over the same requests as `scheduled_rate` when known).
    #[serde(alias = "achieved_rate")]
    pub completed_rate: f64,
    /// The scheduled rate of the level's measured requests.
    #[serde(default)]
    pub scheduled_rate: Option<f64>,
    /// Why the level was called saturated or not (decided by the sweep).
    #[serde(default)]
    pub saturation_rule: Option<String>,
    /// Output tokens/s over the measurement window.
    pub output_tokens_per_s: f64,
    /// Saturated by `crate::saturation::judge` (decided by the sweep).
    pub saturated: bool,
    pub samples: LatencySamples,
    /// The server's own view of the level (its `/metrics`), when it exposes one.
    #[serde(default)]
    pub server: Option<ServerView>,
    /// The level over time (its `timeline.json`), when its folder has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<crate::timeline::Timeline>,
    /// What limited the level (its `summary.json`'s diagnosis), when diagnosed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<crate::diagnosis::Diagnosis>,
    /// Which run of a sweep with `--repeats` the level belongs to (`None`: the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<usize>,
}

impl SweepLevel {
    /// The level's sustained rate ([`crate::rates::sustained`]): every rate of a plan is
    /// this one, never the offered rate.
    pub fn sustained_rate(&self) -> f64 {
        crate::rates::sustained(
            self.offered_rate,
            self.scheduled_rate,
            self.completed_rate,
            self.saturated,
        )
    }

    /// The load the level's schedule held: its scheduled rate, else its offered rate.
    pub fn load_rate(&self) -> f64 {
        self.scheduled_rate.unwrap_or(self.offered_rate)
    }
}

/// The levels run at each offered rate pooled into one (ascending): their requests
/// together, mean rates, saturated when at least half of them were.
fn pool(levels: &[SweepLevel]) -> Vec<(SweepLevel, usize)> {
    let mut sorted: Vec<&SweepLevel> = levels.iter().collect();
    sorted.sort_by(|a, b| a.offered_rate.total_cmp(&b.offered_rate));
    let mut pooled: Vec<(SweepLevel, usize)> = Vec::new();
    for group in sorted.chunk_by(|a, b| a.offered_rate == b.offered_rate) {
        let n = group.len();
        if n == 1 {
            pooled.push((group[0].clone(), 1));
            continue;
        }
        let mean =
            |f: &dyn Fn(&SweepLevel) -> f64| group.iter().map(|l| f(l)).sum::<f64>() / n as f64;
        let mut level = group[0].clone();
        level.completed_rate = mean(&|l| l.completed_rate);
        level.output_tokens_per_s = mean(&|l| l.output_tokens_per_s);
        level.scheduled_rate = group
            .iter()
            .map(|l| l.scheduled_rate)
            .sum::<Option<f64>>()
            .map(|sum| sum / n as f64);
        level.saturated = 2 * group.iter().filter(|l| l.saturated).count() >= n;
        level.samples = LatencySamples {
            requests: group
                .iter()
                .flat_map(|l| l.samples.requests.clone())
                .collect(),
            schedule_lag_ms: group
                .iter()
                .flat_map(|l| l.samples.schedule_lag_ms.clone())
                .collect(),
        };
        level.repeat = None;
        pooled.push((level, n));
    }
    pooled
}

/// Whether `level` passes under `slo`: met, and not saturated.
fn passes(level: &SweepLevel, slo: &SloSpec) -> bool {
    !level.saturated && slo.check(&level.samples).met
}

/// Whether `level` bounds the crossing from above: saturated, or the SLO not met.
fn fails(level: &SweepLevel, slo: &SloSpec) -> bool {
    level.saturated || slo.check(&level.samples).verdict == SloVerdict::NotMet
}

/// One run's crossing (the levels of one repeat index) between its highest passing level and
/// the lowest failing level above it; `None` when the run brackets none. It is an arrival
/// rate: the levels stand at their scheduled rates (a saturated upper level at what it
/// completed, which caps it), and for each target the reciprocal of its percentile is
/// interpolated linearly, clamped to the two levels' rates, the smallest crossing over
/// targets kept (the upper level's rate when it broke no target: it failed by saturation). A queue's latency grows
/// like 1 / (capacity − rate), convex in the rate, so a straight line through the latencies
/// themselves would put every run's crossing low (by 4% on the simulated server of
/// `loadgen/tests/coverage.rs`) and the mean of a few runs' crossings would miss the
/// capacity more often than its interval admits; the reciprocal is about linear in the rate.
pub fn run_crossing(levels: &[&SweepLevel], slo: &SloSpec) -> Option<f64> {
    let low = levels
        .iter()
        .filter(|l| passes(l, slo))
        .max_by(|a, b| a.sustained_rate().total_cmp(&b.sustained_rate()))?;
    let high = levels
        .iter()
        .filter(|l| fails(l, slo) && l.load_rate() > low.sustained_rate())
        .min_by(|a, b| a.load_rate().total_cmp(&b.load_rate()))?;
    let r1 = low.load_rate();
    let r2 = if high.saturated {
        high.sustained_rate()
    } else {
        high.load_rate()
    }
    .max(r1);
    let crossing = slo
        .targets
        .iter()
        .map(|t| {
            let p = Statistic::Percentile(t.percentile);
            let v1 = p.compute(&mut low.samples.values(t.metric));
            let v2 = p.compute(&mut high.samples.values(t.metric));
            match (v1, v2) {
                (Some(v1), Some(v2)) if v1 > 0.0 && v2 > 0.0 => {
                    interpolate(r1, -1.0 / v1, r2, -1.0 / v2, -1.0 / t.limit_ms)
                }
                _ => r1,
            }
        })
        .fold(r2, f64::min);
    Some(crossing)
}

/// The crossing of each run of `levels` (by repeat index, the first run first), `None` for
/// a run that brackets none.
pub fn run_crossings(levels: &[SweepLevel], slo: &SloSpec) -> Vec<Option<f64>> {
    let runs = levels
        .iter()
        .map(|l| l.repeat.unwrap_or(0))
        .max()
        .unwrap_or(0)
        + 1;
    (0..runs)
        .map(|r| {
            let run: Vec<&SweepLevel> = levels
                .iter()
                .filter(|l| l.repeat.unwrap_or(0) == r)
                .collect();
            run_crossing(&run, slo)
        })
        .collect()
}

/// The load to plan for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetLoad {
    Qps(f64),
    Daily { requests: f64, peak_factor: f64 },
}

impl TargetLoad {
    /// Peak requests/s to provision for.
    pub fn peak_qps(&self) -> f64 {
        match *self {
            TargetLoad::Qps(qps) => qps,
            TargetLoad::Daily {
                requests,
                peak_factor,
            } => requests / 86_400.0 * peak_factor,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    pub target: TargetLoad,
    pub gpus_per_instance: u32,
    pub headroom: f64,
    pub gpu_hour_usd: Option<f64>,
    pub bootstrap: Bootstrap,
}

/// SLO outcome of one level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelVerdict {
    pub offered_rate: f64,
    /// The runs pooled at this rate (`--repeats`).
    #[serde(default = "one")]
    pub runs: usize,
    #[serde(alias = "achieved_rate")]
    pub completed_rate: f64,
    pub saturated: bool,
    pub check: SloCheck,
    pub passed: bool,
}

/// The highest passing level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MaxSustainable {
    pub level_index: usize,
    /// What the plan sizes from: the level's [`SweepLevel::sustained_rate`].
    #[serde(default)]
    pub sustained_rate: f64,
    /// The level's offered rate, shown beside.
    pub offered_rate: f64,
    #[serde(alias = "achieved_rate")]
    pub completed_rate: f64,
    pub output_tokens_per_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub gpu_hour_usd: f64,
    /// Cost of one instance running at the max sustainable level.
    pub usd_per_million_output_tokens_at_capacity: f64,
    pub fleet_usd_per_hour: f64,
    /// Fleet cost over the output tokens produced at the target load.
    pub usd_per_million_output_tokens_at_target: f64,
}

fn one() -> usize {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sizing {
    /// The capacity of one instance the fleet is sized from, req/s.
    #[serde(default)]
    pub capacity_per_instance: f64,
    /// Where that capacity comes from, in words.
    #[serde(default)]
    pub sized_from: String,
    pub target_qps: f64,
    pub headroom: f64,
    pub instances: u64,
    pub gpus_per_instance: u32,
    pub gpus: u64,
    pub cost: Option<Cost>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityPlan {
    pub slo: SloSpec,
    pub levels: Vec<LevelVerdict>,
    /// `None` when no level met the SLO: then there is no plan.
    pub max_sustainable: Option<MaxSustainable>,
    /// Interpolated max QPS with its bootstrap CI, when a failing level lies above the max:
    /// one run's sampling error (levels at one rate pooled).
    pub crossing: Option<ConfidenceInterval>,
    /// The Student t-interval over the runs' own crossings (`--repeats`): the variation from
    /// run to run included. `None` with fewer than two runs that bracket a crossing.
    #[serde(default)]
    pub crossing_between_runs: Option<ConfidenceInterval>,
    /// Each run's own crossing, the first run first (`None`: that run bracketed none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_crossings: Vec<Option<f64>>,
    /// Boxed: its words make it the largest part of a plan.
    pub sizing: Option<Box<Sizing>>,
    /// Plain-language caveats (never met, met everywhere, crossing set by saturation, …).
    pub notes: Vec<String>,
}

impl CapacityPlan {
    /// Each run's own crossing, comma-separated ("–" for a run that bracketed none).
    pub fn run_crossings_text(&self) -> String {
        self.run_crossings
            .iter()
            .map(|c| c.map_or("–".to_string(), |c| format!("{c:.3}")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Builds the plan. Levels may come in any order; they are sorted by offered rate.
pub fn capacity_plan(
    levels: &[SweepLevel],
    slo: &SloSpec,
    options: &PlanOptions,
) -> Result<CapacityPlan> {
    validate(levels, options)?;
    let pooled = pool(levels);
    let sorted: Vec<&SweepLevel> = pooled.iter().map(|(l, _)| l).collect();
    let verdicts: Vec<LevelVerdict> = pooled
        .iter()
        .map(|(level, runs)| {
            let check = slo.check(&level.samples);
            let passed = check.met && !level.saturated;
            LevelVerdict {
                offered_rate: level.offered_rate,
                runs: *runs,
                completed_rate: level.completed_rate,
                saturated: level.saturated,
                check,
                passed,
            }
        })
        .collect();
    let run_crossings = run_crossings(levels, slo);
    let bracketed: Vec<f64> = run_crossings.iter().flatten().copied().collect();
    let crossing_between_runs = t_interval(&bracketed, options.bootstrap.confidence);
    let mut plan = CapacityPlan {
        slo: slo.clone(),
        levels: verdicts,
        max_sustainable: None,
        crossing: None,
        crossing_between_runs,
        run_crossings: if run_crossings.len() > 1 {
            run_crossings.clone()
        } else {
            Vec::new()
        },
        sizing: None,
        notes: Vec::new(),
    };
    let unbracketed = run_crossings.iter().filter(|c| c.is_none()).count();
    if run_crossings.len() > 1 && unbracketed > 0 {
        plan.notes.push(format!(
            "{unbracketed} of the {} runs bracketed no crossing of their own: the interval \
             between runs is over the other {}.",
            run_crossings.len(),
            bracketed.len()
        ));
    }
    let Some(best) = plan.levels.iter().rposition(|v| v.passed) else {
        plan.notes.push(format!(
            "No level met the SLO ({slo}), not even the lowest rate tested ({:.3} req/s): \
             there is no capacity plan. Sweep lower rates or relax the SLO.",
            sorted[0].offered_rate
        ));
        return Ok(plan);
    };
    let level = sorted[best];
    let max = MaxSustainable {
        level_index: best,
        sustained_rate: level.sustained_rate(),
        offered_rate: level.offered_rate,
        completed_rate: level.completed_rate,
        output_tokens_per_s: level.output_tokens_per_s,
    };
    plan.max_sustainable = Some(max);
    // The next level up that failed: an unknown one (too few requests) bounds nothing.
    let next = (best + 1..sorted.len())
        .find(|&i| sorted[i].saturated || plan.levels[i].check.verdict == SloVerdict::NotMet);
    let unknown_between = plan.levels[best + 1..next.unwrap_or(sorted.len())]
        .iter()
        .filter(|v| v.check.verdict == SloVerdict::Unknown)
        .count();
    if unknown_between > 0 {
        plan.notes.push(format!(
            "{unknown_between} level(s) above {:.3} req/s had too few requests to bound a \
             percentile: they neither pass nor bound the crossing.",
            level.offered_rate
        ));
    }
    match next.map(|i| (i, sorted[i])) {
        None => plan.notes.push(format!(
            "Every level up to the highest tested ({:.3} req/s) met the SLO: the true limit \
             is higher; sweep higher rates for a tighter plan.",
            level.offered_rate
        )),
        Some((i, next)) => {
            let c = crossing(level, next, slo, options.bootstrap);
            if c.upper > c.lower {
                plan.crossing = Some(c);
            } else {
                plan.notes.push(format!(
                    "The crossing is at {:.3} req/s, but no interval can be given: every \
                     resample of the two boundary levels puts it there.",
                    c.estimate
                ));
            }
            if !plan.levels[i].check.met {
                plan.notes.push(format!(
                    "The SLO breaks between {:.3} and {:.3} req/s.",
                    level.offered_rate, next.offered_rate
                ));
            } else {
                plan.notes.push(format!(
                    "The level at {:.3} req/s met the latency targets but saturated: it \
                     completed {:.3} req/s, the server's throughput, which caps the crossing.",
                    next.offered_rate, next.completed_rate
                ));
            }
        }
    }
    plan.notes.push(interval_sentence(
        run_crossings.len(),
        plan.crossing_between_runs.is_some(),
    ));
    let runs = bracketed.len();
    let (capacity, sized_from) = match plan.crossing_between_runs {
        Some(between) if runs >= MIN_RUNS_TO_SIZE_BETWEEN && between.lower < max.sustained_rate => {
            (
                between.lower.max(0.0),
                format!(
                    "the lower end of the crossing between {runs} runs ({:.3} req/s), below the \
                 highest passing level's {:.3}",
                    between.lower, max.sustained_rate
                ),
            )
        }
        _ => (
            max.sustained_rate,
            format!(
                "the highest passing level's sustained rate ({:.3} req/s){}",
                max.sustained_rate,
                if runs >= MIN_RUNS_TO_SIZE_BETWEEN {
                    ", at or below the crossing between runs' lower end"
                } else {
                    ""
                }
            ),
        ),
    };
    if capacity <= 0.0 {
        plan.notes.push(format!(
            "The crossing between runs reaches down to {capacity:.3} req/s: the runs disagree \
             too much to size a fleet from; no sizing."
        ));
        return Ok(plan);
    }
    plan.sizing = Some(Box::new(sizing(&max, capacity, sized_from, options)));
    Ok(plan)
}

fn validate(levels: &[SweepLevel], options: &PlanOptions) -> Result<()> {
    if levels.is_empty() {
        bail!("capacity plan: the sweep has no levels");
    }
    if let Some(bad) = levels
        .iter()
        .find(|l| !(l.offered_rate.is_finite() && l.offered_rate > 0.0))
    {
        bail!(
            "capacity plan: level offered rate {} is not a positive number",
            bad.offered_rate
        );
    }
    let target = options.target.peak_qps();
    if !(target.is_finite() && target > 0.0) {
        bail!("capacity plan: target load {target} req/s is not a positive number");
    }
    if !(options.headroom.is_finite() && options.headroom >= 1.0) {
        bail!(
            "capacity plan: headroom {} must be at least 1",
            options.headroom
        );
    }
    if options.gpus_per_instance == 0 {
        bail!("capacity plan: GPUs per instance must be at least 1");
    }
    if let Some(price) = options.gpu_hour_usd {
        if !(price.is_finite() && price >= 0.0) {
            bail!("capacity plan: GPU-hour price {price} must be a non-negative number");
        }
    }
    Ok(())
}

/// USD per million tokens produced at `tokens_per_s` by what costs `usd_per_hour`.
pub fn usd_per_million_tokens(usd_per_hour: f64, tokens_per_s: f64) -> f64 {
    usd_per_hour / (tokens_per_s * 3600.0) * 1e6
}

/// Which interval is which, in one sentence.
fn interval_sentence(runs: usize, between: bool) -> String {
    if runs <= 1 {
        return "The crossing's interval covers one run's sampling error only (its levels' \
                requests resampled): the next run on the same machine may fall outside it; \
                --repeats 3 measures the variation between runs."
            .into();
    }
    if between {
        format!(
            "Two intervals: `crossing` is one run's sampling error (the levels at each rate \
             pooled, their requests resampled); `crossing between runs` is the Student \
             t-interval over the {runs} runs' own crossings, which includes the variation \
             from run to run."
        )
    } else {
        format!(
            "The crossing's interval covers one run's sampling error only: fewer than two of \
             the {runs} runs bracketed a crossing of their own, so no interval between runs \
             can be given."
        )
    }
}

fn sizing(
    max: &MaxSustainable,
    capacity: f64,
    sized_from: String,
    options: &PlanOptions,
) -> Sizing {
    let target_qps = options.target.peak_qps();
    // The small epsilon keeps 6.000000001 (float noise) from becoming 7 instances.
    let instances = ((target_qps * options.headroom / capacity) - 1e-9)
        .ceil()
        .max(1.0) as u64;
    let gpus = instances * u64::from(options.gpus_per_instance);
    let cost = options.gpu_hour_usd.map(|price| {
        let per_instance_hour = price * f64::from(options.gpus_per_instance);
        let fleet_usd_per_hour = price * gpus as f64;
        let tokens_per_request = max.output_tokens_per_s / max.completed_rate;
        let target_tokens_per_s = target_qps * tokens_per_request;
        Cost {
            gpu_hour_usd: price,
            usd_per_million_output_tokens_at_capacity: usd_per_million_tokens(
                per_instance_hour,
                max.output_tokens_per_s,
            ),
            fleet_usd_per_hour,
            usd_per_million_output_tokens_at_target: usd_per_million_tokens(
                fleet_usd_per_hour,
                target_tokens_per_s,
            ),
        }
    });
    Sizing {
        capacity_per_instance: capacity,
        sized_from,
        target_qps,
        headroom: options.headroom,
        instances,
        gpus_per_instance: options.gpus_per_instance,
        gpus,
        cost,
    }
}

/// Interpolated crossing between a passing level and the next (failing) one, with a CI from
/// resampling both levels' requests.
fn crossing(
    low: &SweepLevel,
    high: &SweepLevel,
    slo: &SloSpec,
    settings: Bootstrap,
) -> ConfidenceInterval {
    let r1 = low.sustained_rate();
    // A saturated level carries no more than it completed: its sustained rate, the server's
    // throughput, caps the crossing.
    let r2 = high.sustained_rate().max(r1);
    let values: Vec<(Vec<f64>, Vec<f64>)> = slo
        .targets
        .iter()
        .map(|t| (low.samples.values(t.metric), high.samples.values(t.metric)))
        .collect();
    let estimate_at = |percentiles: &[(Option<f64>, Option<f64>)], r2: f64| -> f64 {
        slo.targets
            .iter()
            .zip(percentiles)
            .map(|(target, &(v1, v2))| match (v1, v2) {
                (Some(v1), Some(v2)) => interpolate(r1, v1, r2, v2, target.limit_ms),
                // Without data on either side nothing can be interpolated: stay at the passing level.
                _ => r1,
            })
            .fold(r2, f64::min)
    };
    let point: Vec<(Option<f64>, Option<f64>)> = slo
        .targets
        .iter()
        .zip(&values)
        .map(|(t, (a, b))| {
            let p = Statistic::Percentile(t.percentile);
            (p.compute(&mut a.clone()), p.compute(&mut b.clone()))
        })
        .collect();
    let estimate = estimate_at(&point, r2);
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut replicates = Vec::with_capacity(settings.resamples);
    // A saturated level's completed rate counts k completions: redraw it as a Poisson count.
    let completions = high.samples.requests.len().max(1) as f64;
    for _ in 0..settings.resamples {
        let r2_replicate = if high.saturated {
            (r2 * (1.0 + standard_normal(&mut rng) / completions.sqrt())).max(r1)
        } else {
            r2
        };
        let resampled: Vec<(Option<f64>, Option<f64>)> = slo
            .targets
            .iter()
            .zip(&values)
            .map(|(t, (a, b))| {
                let p = Statistic::Percentile(t.percentile);
                (
                    p.compute(&mut resample(a, &mut rng)),
                    p.compute(&mut resample(b, &mut rng)),
                )
            })
            .collect();
        replicates.push(estimate_at(&resampled, r2_replicate));
    }
    let tail = (1.0 - settings.confidence) / 2.0 * 100.0;
    ConfidenceInterval {
        estimate,
        lower: percentile_linear(&replicates, tail).unwrap_or(estimate),
        upper: percentile_linear(&replicates, 100.0 - tail).unwrap_or(estimate),
        confidence: settings.confidence,
    }
}

/// Rate where the line through (r1, v1) and (r2, v2) reaches `limit`, clamped to [r1, r2].
fn interpolate(r1: f64, v1: f64, r2: f64, v2: f64, limit: f64) -> f64 {
    if v2 <= limit {
        r2
    } else if v1 >= limit {
        r1
    } else {
        r1 + (limit - v1) / (v2 - v1) * (r2 - r1)
    }
}

fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn resample(values: &[f64], rng: &mut StdRng) -> Vec<f64> {
    if values.is_empty() {
        return Vec::new();
    }
    (0..values.len())
        .map(|_| values[rng.random_range(0..values.len())])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_is_linear_and_clamped() {
        assert_eq!(interpolate(2.0, 100.0, 4.0, 300.0, 200.0), 3.0);
        assert_eq!(interpolate(2.0, 100.0, 4.0, 150.0, 200.0), 4.0);
        assert_eq!(interpolate(2.0, 250.0, 4.0, 300.0, 200.0), 2.0);
    }

    #[test]
    fn daily_target_uses_peak_factor() {
        let target = TargetLoad::Daily {
            requests: 8_640_000.0,
            peak_factor: 2.0,
        };
        assert_eq!(target.peak_qps(), 200.0);
    }
}
