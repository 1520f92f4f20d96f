//! The decisions of `sweep --rates search`: which rate to run next, and when to stop.
//!
//! Start at the probe's saturation estimate; **bracket** the SLO crossing with a level that
//! passes (the SLO met, not saturated) and one that fails (not met, or saturated) by halving
//! the lowest failing rate (down to `--min-rate`) or doubling the highest passing one (up to
//! `--max-rate`; a step that would end within the precision of either limit goes to it);
//! then **bisect**: offer the rate expected to sustain the geometric mid-point of the
//! bracket's sustained rates (`reports::search` defines the ends) until its upper end is
//! within `--precision` of its lower end, or `--max-levels` levels have run. A level whose
//! verdict is unknown (too few requests) is run again once with twice the requests; it is
//! never an end of the bracket, and a second unknown ends the search. The search only
//! decides: the sweep runs each level.

use anyhow::{bail, Result};
use clap::Args;
use reports::search::{
    Bracket, BracketEnd, SearchEnd, SearchPath, SearchStep, SearchVerdict, StepReason,
};

/// The options of a knee search (shared by `sweep --rates search` and `tune`).
#[derive(Args, Debug, Clone, Default)]
pub struct SearchArgs {
    /// Knee search: stop when the bracket's upper end is within this fraction of its lower
    /// end [default: 0.10].
    #[arg(long)]
    pub precision: Option<f64>,
    /// Knee search: run at most this many levels, re-runs included [default: 8].
    #[arg(long)]
    pub max_levels: Option<usize>,
    /// Knee search: halve no lower than this rate (req/s) [default: the probe's saturation
    /// estimate / 8].
    #[arg(long)]
    pub min_rate: Option<f64>,
    /// Knee search: offer no more than this rate (req/s) [default: 4 × the probe's
    /// saturation estimate].
    #[arg(long)]
    pub max_rate: Option<f64>,
}

pub const DEFAULT_PRECISION: f64 = 0.10;
pub const DEFAULT_MAX_LEVELS: usize = 8;

impl SearchArgs {
    /// The flags given, by name: refused where no search runs.
    pub fn given(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        if self.precision.is_some() {
            given.push("--precision");
        }
        if self.max_levels.is_some() {
            given.push("--max-levels");
        }
        if self.min_rate.is_some() {
            given.push("--min-rate");
        }
        if self.max_rate.is_some() {
            given.push("--max-rate");
        }
        given
    }

    /// The search's settings around the probe's saturation `estimate` (req/s).
    pub fn settings(&self, estimate: f64) -> Result<SearchPath> {
        let precision = self.precision.unwrap_or(DEFAULT_PRECISION);
        if !(precision.is_finite() && precision >= 0.001) {
            bail!("--precision {precision}: expected a fraction of at least 0.001 (0.10 = 10%)");
        }
        let max_levels = self.max_levels.unwrap_or(DEFAULT_MAX_LEVELS);
        if max_levels < 2 {
            bail!("--max-levels {max_levels}: a bracket needs at least 2 levels");
        }
        let min_rate = self.min_rate.unwrap_or(round_rate(estimate / 8.0));
        let max_rate = self.max_rate.unwrap_or(round_rate(estimate * 4.0));
        for (flag, r) in [("--min-rate", min_rate), ("--max-rate", max_rate)] {
            if !(r.is_finite() && r > 0.0) {
                bail!("{flag} {r}: expected a positive rate in requests/s");
            }
        }
        if min_rate >= max_rate {
            let named = |flag: &str, given: bool, what: &str| {
                if given {
                    flag.to_string()
                } else {
                    format!("{flag} (by default {what} of the probe's {estimate:.3} req/s)")
                }
            };
            bail!(
                "{} {min_rate} must be below {} {max_rate} req/s",
                named("--min-rate", self.min_rate.is_some(), "1/8"),
                named("--max-rate", self.max_rate.is_some(), "4×")
            );
        }
        Ok(SearchPath {
            precision,
            max_levels,
            min_rate,
            max_rate,
            start_rate: round_rate(estimate.clamp(min_rate, max_rate)),
            steps: Vec::new(),
            end: None,
            end_reason: None,
        })
    }
}

/// What the sweep does next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// Run a level at `rate`; a re-run holds twice the requests of the level before.
    Run { rate: f64, reason: StepReason },
    /// The search is over ([`SearchPath::end`] says why).
    End,
}

/// A rate rounded to 4 significant digits (rates in files and folder names stay readable).
fn round_rate(rate: f64) -> f64 {
    if rate <= 0.0 || !rate.is_finite() {
        return rate;
    }
    let scale = 10f64.powi(3 - rate.log10().floor() as i32);
    (rate * scale).round() / scale
}

/// The bracket of `steps` (see `reports::search`).
pub fn bracket(steps: &[SearchStep]) -> Bracket {
    let passing = steps
        .iter()
        .filter(|s| s.verdict.passes())
        .max_by(|a, b| a.sustained_rate.total_cmp(&b.sustained_rate));
    let lower = passing.map(|s| BracketEnd {
        dir: s.dir.clone(),
        rate: s.sustained_rate,
    });
    let floor = lower.as_ref().map_or(0.0, |l| l.rate);
    // The passing level's sustained / offered: what its seeded draw held of the rate asked.
    let held = passing.map_or(1.0, |s| s.sustained_rate / s.offered_rate);
    let upper = steps
        .iter()
        .filter(|s| s.verdict.fails())
        .map(|s| {
            let rate = if s.sustained_rate > floor {
                s.sustained_rate
            } else {
                s.offered_rate * held
            };
            BracketEnd {
                dir: s.dir.clone(),
                rate,
            }
        })
        .filter(|e| e.rate > floor)
        .min_by(|a, b| a.rate.total_cmp(&b.rate));
    Bracket { lower, upper }
}

/// The offered rate expected to sustain the bracket's geometric mid-point. A seeded schedule
/// holds the same unit gaps at every rate, so a passing level's scheduled / offered ratio (its
/// draw: 0.8 when 56 requests came out sparse) carries over: the mid-point scaled by the lower
/// level's offered / sustained. Should that fall outside the two levels' offered rates, their
/// geometric mid-point.
fn bisecting_offer(steps: &[SearchStep], lower: &BracketEnd, upper: &BracketEnd) -> f64 {
    let offered = |dir: &str| {
        steps
            .iter()
            .find(|s| s.dir == dir)
            .map_or(f64::NAN, |s| s.offered_rate)
    };
    let (low, high) = (offered(&lower.dir), offered(&upper.dir));
    let scaled = (lower.rate * upper.rate).sqrt() * low / lower.rate;
    if scaled > low && scaled < high {
        scaled
    } else {
        (low * high).sqrt()
    }
}

/// Records a level's result in `path` and decides what comes next; at an end, sets
/// [`SearchPath::end`] and its reason.
pub fn record(
    path: &mut SearchPath,
    dir: String,
    offered_rate: f64,
    sustained_rate: f64,
    reason: StepReason,
    verdict: SearchVerdict,
) -> Next {
    let mut step = SearchStep {
        dir,
        offered_rate,
        sustained_rate,
        reason,
        verdict,
        bracket: Bracket::default(),
    };
    let mut steps = path.steps.clone();
    steps.push(step.clone());
    step.bracket = bracket(&steps);
    path.steps.push(step);
    next(path)
}

/// The first level, or the end when the probe's unloaded step already missed the SLO.
pub fn start(path: &mut SearchPath, unloaded_missed: bool) -> Next {
    if unloaded_missed {
        finish(
            path,
            SearchEnd::NotMetUnloaded,
            "not met even unloaded: the probe's concurrency-1 step already missed the SLO".into(),
        );
        return Next::End;
    }
    Next::Run {
        rate: path.start_rate,
        reason: StepReason::Start,
    }
}

fn finish(path: &mut SearchPath, end: SearchEnd, reason: String) {
    path.end = Some(end);
    path.end_reason = Some(reason);
}

/// Ends the search when interrupted during (or before) the level at `offered_rate`, unless
/// it had already ended.
pub fn interrupt(path: &mut SearchPath, offered_rate: f64) {
    if path.end.is_some() {
        return;
    }
    finish(
        path,
        SearchEnd::Interrupted,
        format!("interrupted at the level at {offered_rate} req/s"),
    );
}

fn next(path: &mut SearchPath) -> Next {
    let bracket = path.bracket();
    let last = path.steps.last().expect("a level was recorded").clone();
    if let Some(width) = bracket.relative_width() {
        if width <= path.precision {
            finish(
                path,
                SearchEnd::Converged,
                format!(
                    "converged: the bracket {bracket} is within --precision {:.0}%",
                    path.precision * 100.0
                ),
            );
            return Next::End;
        }
    }
    // A limit reached while bracketing ends the search whatever the levels left.
    let highest_pass = path
        .steps
        .iter()
        .filter(|s| s.verdict.passes())
        .map(|s| s.offered_rate)
        .fold(0.0, f64::max);
    let lowest_fail = path
        .steps
        .iter()
        .filter(|s| s.verdict.fails())
        .map(|s| s.offered_rate)
        .fold(f64::INFINITY, f64::min);
    match (&bracket.lower, &bracket.upper) {
        (Some(_), None) if highest_pass >= path.max_rate => {
            finish(
                path,
                SearchEnd::MetAtMaxRate,
                format!(
                    "met at the highest rate tried ({highest_pass} req/s, --max-rate): the knee \
                     lies higher"
                ),
            );
            return Next::End;
        }
        (None, Some(_)) if lowest_fail <= path.min_rate => {
            finish(
                path,
                SearchEnd::NotMetAtMinRate,
                format!(
                    "not met at the lowest rate tried ({lowest_fail} req/s, --min-rate): the \
                     knee lies lower, if anywhere"
                ),
            );
            return Next::End;
        }
        _ => {}
    }
    if last.verdict == SearchVerdict::Unknown && last.reason == StepReason::Rerun {
        finish(
            path,
            SearchEnd::StillUnknown,
            format!(
                "the verdict at {} req/s stayed unknown with twice the requests: the bracket \
                 stays {bracket}; give the levels more requests (--min-requests, --duration)",
                last.offered_rate
            ),
        );
        return Next::End;
    }
    if path.steps.len() >= path.max_levels {
        finish(
            path,
            SearchEnd::MaxLevels,
            format!(
                "ran --max-levels {} levels: the bracket is {bracket}",
                path.max_levels
            ),
        );
        return Next::End;
    }
    if last.verdict == SearchVerdict::Unknown {
        return Next::Run {
            rate: last.offered_rate,
            reason: StepReason::Rerun,
        };
    }
    match (&bracket.lower, &bracket.upper) {
        (Some(lower), Some(upper)) => {
            let rate = round_rate(bisecting_offer(&path.steps, lower, upper));
            let offered = |dir: &str| {
                path.steps
                    .iter()
                    .find(|s| s.dir == dir)
                    .map_or(f64::NAN, |s| s.offered_rate)
            };
            let inside = rate > offered(&lower.dir) && rate < offered(&upper.dir);
            if !inside || path.steps.iter().any(|s| s.offered_rate == rate) {
                finish(
                    path,
                    SearchEnd::Unresolved,
                    format!(
                        "the bracket {bracket} cannot be narrowed: the next rate, {rate} req/s, \
                         is not between its ends' offered rates or already ran"
                    ),
                );
                return Next::End;
            }
            Next::Run {
                rate,
                reason: StepReason::Bisecting,
            }
        }
        (Some(_), None) => {
            // A doubling that would leave --max-rate within the precision goes there.
            let doubled = 2.0 * highest_pass;
            Next::Run {
                rate: if doubled * (1.0 + path.precision) >= path.max_rate {
                    path.max_rate
                } else {
                    round_rate(doubled)
                },
                reason: StepReason::Doubling,
            }
        }
        (None, _) => {
            let halved = lowest_fail / 2.0;
            Next::Run {
                rate: if halved <= path.min_rate * (1.0 + path.precision) {
                    path.min_rate
                } else {
                    round_rate(halved)
                },
                reason: StepReason::Halving,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(estimate: f64) -> SearchPath {
        SearchArgs::default().settings(estimate).unwrap()
    }

    /// Runs the search against a server whose SLO holds up to `knee` req/s (sustained = offered).
    fn search(path: &mut SearchPath, knee: f64) -> Vec<(f64, StepReason)> {
        let mut run = Vec::new();
        let mut next = start(path, false);
        while let Next::Run { rate, reason } = next {
            run.push((rate, reason));
            let verdict = if rate <= knee {
                SearchVerdict::Met
            } else {
                SearchVerdict::NotMet
            };
            let dir = format!("level-{:02}", run.len() - 1);
            next = record(path, dir, rate, rate, reason, verdict);
        }
        run
    }

    #[test]
    fn halves_then_bisects_to_the_precision() {
        let mut path = settings(10.0);
        let run = search(&mut path, 6.3);
        let rates: Vec<f64> = run.iter().map(|r| r.0).collect();
        // 10 fails, 5 passes; then √50 = 7.071 fails, √(5·7.071) = 5.946 passes,
        // √(5.946·7.071) = 6.484 fails: 6.484 / 5.946 = 1.0905 ≤ 1.1.
        assert_eq!(rates, vec![10.0, 5.0, 7.071, 5.946, 6.484]);
        assert_eq!(run[1].1, StepReason::Halving);
        assert_eq!(run[2].1, StepReason::Bisecting);
        assert_eq!(path.end, Some(SearchEnd::Converged));
        let b = path.bracket();
        assert_eq!(b.lower.unwrap().rate, 5.946);
        assert_eq!(b.upper.unwrap().rate, 6.484);
    }

    #[test]
    fn doubles_until_a_level_fails() {
        let mut path = settings(10.0);
        let run = search(&mut path, 27.0);
        assert_eq!(
            run[..3],
            [
                (10.0, StepReason::Start),
                (20.0, StepReason::Doubling),
                (40.0, StepReason::Doubling)
            ]
        );
        let b = path.bracket();
        assert!(b.lower.unwrap().rate <= 27.0 && b.upper.unwrap().rate > 27.0);
        assert!(run.len() <= DEFAULT_MAX_LEVELS);
    }

    #[test]
    fn ends_at_the_rate_limits_and_unloaded() {
        let mut path = settings(10.0);
        let run = search(&mut path, 1000.0);
        assert_eq!(
            run.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![10.0, 20.0, 40.0]
        );
        assert_eq!(path.end, Some(SearchEnd::MetAtMaxRate));
        let mut path = settings(10.0);
        let run = search(&mut path, 0.5);
        assert_eq!(
            run.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![10.0, 5.0, 2.5, 1.25]
        );
        assert_eq!(path.end, Some(SearchEnd::NotMetAtMinRate));
        let mut path = settings(10.0);
        assert_eq!(start(&mut path, true), Next::End);
        assert_eq!(path.end, Some(SearchEnd::NotMetUnloaded));
    }

    #[test]
    fn max_levels_caps_the_search() {
        let mut path = SearchArgs {
            max_levels: Some(3),
            precision: Some(0.001),
            ..SearchArgs::default()
        }
        .settings(10.0)
        .unwrap();
        let run = search(&mut path, 6.3);
        assert_eq!(run.len(), 3);
        assert_eq!(path.end, Some(SearchEnd::MaxLevels));
    }

    #[test]
    fn an_unknown_level_is_rerun_once_and_never_an_end() {
        let mut path = settings(10.0);
        let next = record(
            &mut path,
            "level-00".into(),
            10.0,
            10.0,
            StepReason::Start,
            SearchVerdict::Unknown,
        );
        assert_eq!(
            next,
            Next::Run {
                rate: 10.0,
                reason: StepReason::Rerun
            }
        );
        assert_eq!(path.bracket(), Bracket::default());
        let next = record(
            &mut path,
            "level-01".into(),
            10.0,
            10.0,
            StepReason::Rerun,
            SearchVerdict::Unknown,
        );
        assert_eq!(next, Next::End);
        assert_eq!(path.end, Some(SearchEnd::StillUnknown));
    }

    #[test]
    fn a_saturated_level_bounds_the_bracket_by_its_completed_rate() {
        let mut path = settings(10.0);
        record(
            &mut path,
            "level-00".into(),
            10.0,
            7.5,
            StepReason::Start,
            SearchVerdict::Saturated,
        );
        // The passing level's schedule held 4 req/s of the 5 offered: offering 1.25 × the
        // mid-point √(4 × 7.5) = 5.477 is expected to sustain it.
        let next = record(
            &mut path,
            "level-01".into(),
            5.0,
            4.0,
            StepReason::Halving,
            SearchVerdict::Met,
        );
        let b = path.bracket();
        assert_eq!(b.upper.as_ref().unwrap().rate, 7.5);
        assert_eq!(
            next,
            Next::Run {
                rate: 6.847,
                reason: StepReason::Bisecting
            }
        );
        // A failing level that sustained no more than the passing one bounds by its offered
        // rate scaled by what the passing level's draw held (4.5 of 5 offered): 9 × 0.9.
        let steps = vec![
            SearchStep {
                dir: "a".into(),
                offered_rate: 9.0,
                sustained_rate: 4.0,
                reason: StepReason::Start,
                verdict: SearchVerdict::Saturated,
                bracket: Bracket::default(),
            },
            SearchStep {
                dir: "b".into(),
                offered_rate: 5.0,
                sustained_rate: 4.5,
                reason: StepReason::Halving,
                verdict: SearchVerdict::Met,
                bracket: Bracket::default(),
            },
        ];
        assert!((bracket(&steps).upper.unwrap().rate - 8.1).abs() < 1e-12);
    }

    #[test]
    fn settings_refuse_nonsense() {
        assert!(SearchArgs {
            precision: Some(0.0),
            ..SearchArgs::default()
        }
        .settings(10.0)
        .is_err());
        assert!(SearchArgs {
            min_rate: Some(5.0),
            max_rate: Some(4.0),
            ..SearchArgs::default()
        }
        .settings(10.0)
        .is_err());
        let path = SearchArgs {
            max_rate: Some(6.0),
            ..SearchArgs::default()
        }
        .settings(10.0)
        .unwrap();
        assert_eq!((path.start_rate, path.min_rate), (6.0, 1.25));
        assert_eq!(round_rate(7.0710678), 7.071);
        assert_eq!(round_rate(0.123456), 0.1235);
    }
}
