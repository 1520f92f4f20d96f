//! The decisions of `sweep --rates search`: which rate to run next, and when to stop.
//!
//! Start at the probe's saturation estimate; **bracket** the SLO crossing with a level that
//! passes (the SLO met, not saturated) and one that fails (not met, or saturated) by halving
//! the lowest failing rate (down to `--min-rate`) or doubling the highest passing one (up to
//! `--max-rate`; a step that would end within the precision of either limit goes to it);
//! then **bisect**: offer the geometric mid-point of the bracket's ends (`reports::search`
//! defines them: a passing level's sustained rate below, a failing level's scheduled rate
//! above) until its upper end is within `--precision` of its lower end, or `--max-levels`
//! levels have run. A level whose verdict is unknown (too few requests) is run again once
//! with twice the requests; it is never an end of the bracket, and a second unknown ends the
//! search. With `--repeats R`, [`next_repeat`] then runs each end of the final bracket R − 1
//! more times. The search only decides: the sweep runs each level.

use reports::search::{
    Bracket, BracketEnd, SearchEnd, SearchPath, SearchStep, SearchVerdict, StepReason,
};
use reports::slo::SloVerdict;
use serde::{Deserialize, Serialize};

use crate::spec::search::round_rate;

/// What the sweep does next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// Run a level at `rate`; a re-run holds twice the requests of the level before.
    Run { rate: f64, reason: StepReason },
    /// The search is over ([`SearchPath::end`] says why).
    End,
}

/// The bracket of `steps` (see `reports::search`).
pub fn bracket(steps: &[SearchStep]) -> Bracket {
    let lower = steps
        .iter()
        .filter(|s| s.verdict.passes())
        .max_by(|a, b| a.sustained_rate.total_cmp(&b.sustained_rate))
        .map(|s| BracketEnd {
            dir: s.dir.clone(),
            rate: s.sustained_rate,
        });
    let floor = lower.as_ref().map_or(0.0, |l| l.rate);
    let upper = steps
        .iter()
        .filter(|s| s.verdict.fails())
        .map(|s| BracketEnd {
            dir: s.dir.clone(),
            rate: s.load_rate(),
        })
        .filter(|e| e.rate > floor)
        .min_by(|a, b| a.rate.total_cmp(&b.rate));
    Bracket { lower, upper }
}

/// What a level measured, as the search reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The level's run folder.
    pub dir: String,
    pub offered_rate: f64,
    /// The scheduled rate of its measured requests, when it has two.
    pub scheduled_rate: Option<f64>,
    pub completed_rate: f64,
    pub verdict: SearchVerdict,
}

/// A level's verdict for the search: saturated counts as failing, an SLO verdict of unknown
/// (too few requests) bounds nothing.
pub fn verdict(saturated: bool, slo: Option<SloVerdict>) -> SearchVerdict {
    if saturated {
        return SearchVerdict::Saturated;
    }
    match slo {
        Some(SloVerdict::Met) => SearchVerdict::Met,
        Some(SloVerdict::NotMet) => SearchVerdict::NotMet,
        Some(SloVerdict::Unknown) | None => SearchVerdict::Unknown,
    }
}

/// Records a level's result in `path` and decides what comes next; at an end, sets
/// [`SearchPath::end`] and its reason.
pub fn record(path: &mut SearchPath, level: Measured, reason: StepReason) -> Next {
    let mut step = SearchStep {
        sustained_rate: reports::rates::sustained(
            level.offered_rate,
            level.scheduled_rate,
            level.completed_rate,
            level.verdict == SearchVerdict::Saturated,
        ),
        dir: level.dir,
        offered_rate: level.offered_rate,
        scheduled_rate: level.scheduled_rate,
        completed_rate: Some(level.completed_rate),
        reason,
        verdict: level.verdict,
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
            let rate = round_rate((lower.rate * upper.rate).sqrt());
            if !(rate > lower.rate && rate < upper.rate)
                || path.steps.iter().any(|s| s.offered_rate == rate)
            {
                finish(
                    path,
                    SearchEnd::Unresolved,
                    format!(
                        "the bracket {bracket} cannot be narrowed: its mid-point rounds to \
                         {rate} req/s (4 significant digits), an end or a rate already run"
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

/// Which level of a repeat: an end of the search's final bracket, or one further out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepeatSide {
    /// The bracket's lower end's rate.
    Lower,
    /// The bracket's upper end's rate.
    Upper,
    /// Both ends gave the same verdict: × or ÷ (1 + precision) beyond the outermost level.
    Outward,
}

/// A level of a repeat to run next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepeatLevel {
    /// 1 to R − 1 (the search itself is repeat 0).
    pub repeat: usize,
    pub rate: f64,
    pub side: RepeatSide,
}

/// A repeat's level as run: its repeat index, offered rate and verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepeatRun {
    pub repeat: usize,
    pub rate: f64,
    pub verdict: SearchVerdict,
}

/// Levels a repeat runs outward, at most, to bracket its own crossing.
pub const MAX_OUTWARD_LEVELS: usize = 2;

/// After the search, the next level of its `repeats` − 1 repeats, given those run so far
/// (`done`, in order); `None` when every repeat is done, or when the search left no bracket
/// with both ends to repeat. Repeats interleave (lower, upper, lower, upper, …), each at the
/// final bracket's ends, widened to (1 + precision)² around its centre when narrower (see
/// below); when both ends of one repeat give the same
/// verdict, it runs up to [`MAX_OUTWARD_LEVELS`] more levels outward (× or ÷ (1 + precision)
/// beyond its outermost level) until it brackets its own crossing.
pub fn next_repeat(path: &SearchPath, repeats: usize, done: &[RepeatRun]) -> Option<RepeatLevel> {
    let bracket = path.bracket();
    let offered = |end: &Option<BracketEnd>| {
        let dir = &end.as_ref()?.dir;
        path.steps
            .iter()
            .find(|s| &s.dir == dir)
            .map(|s| s.offered_rate)
    };
    let (mut lower, mut upper) = (offered(&bracket.lower)?, offered(&bracket.upper)?);
    // The repeats run at the bracket widened to (1 + precision)² around its centre: a repeat
    // whose verdicts differ finds its crossing between its two rates, so two rates a few
    // percent apart would hold every repeat's crossing near the search's, however far the
    // next run's own lies. On the simulated server of tests/coverage.rs the between-run
    // interval covered the capacity in 87% of searches at the final bracket's own rates
    // and 92.5% at the widened ones.
    let width = (upper / lower).ln();
    let wanted = 2.0 * (1.0 + path.precision).ln();
    if upper > lower && width < wanted {
        let centre = (upper * lower).sqrt();
        lower = round_rate(centre * (-wanted / 2.0).exp());
        upper = round_rate(centre * (wanted / 2.0).exp());
    }
    for repeat in 1..repeats {
        let runs: Vec<&RepeatRun> = done.iter().filter(|r| r.repeat == repeat).collect();
        for (rate, side) in [(lower, RepeatSide::Lower), (upper, RepeatSide::Upper)] {
            if !runs.iter().any(|r| r.rate == rate) {
                return Some(RepeatLevel { repeat, rate, side });
            }
        }
        let highest_pass = runs
            .iter()
            .filter(|r| r.verdict.passes())
            .map(|r| r.rate)
            .reduce(f64::max);
        let bracketed =
            highest_pass.is_some_and(|p| runs.iter().any(|r| r.verdict.fails() && r.rate > p));
        let outward = runs.len() - 2;
        if bracketed || outward >= MAX_OUTWARD_LEVELS {
            continue;
        }
        let step = 1.0 + path.precision;
        let rate = match highest_pass {
            Some(_) => runs.iter().map(|r| r.rate).fold(0.0, f64::max) * step,
            None => runs.iter().map(|r| r.rate).fold(f64::INFINITY, f64::min) / step,
        };
        return Some(RepeatLevel {
            repeat,
            rate: round_rate(rate),
            side: RepeatSide::Outward,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::search::{SearchArgs, DEFAULT_MAX_LEVELS};

    fn settings(estimate: f64) -> SearchPath {
        SearchArgs::default().settings(estimate).unwrap()
    }

    fn measured(
        dir: &str,
        offered: f64,
        scheduled: f64,
        completed: f64,
        verdict: SearchVerdict,
    ) -> Measured {
        Measured {
            dir: dir.into(),
            offered_rate: offered,
            scheduled_rate: Some(scheduled),
            completed_rate: completed,
            verdict,
        }
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
            next = record(path, measured(&dir, rate, rate, rate, verdict), reason);
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
            measured("level-00", 10.0, 10.0, 10.0, SearchVerdict::Unknown),
            StepReason::Start,
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
            measured("level-01", 10.0, 10.0, 10.0, SearchVerdict::Unknown),
            StepReason::Rerun,
        );
        assert_eq!(next, Next::End);
        assert_eq!(path.end, Some(SearchEnd::StillUnknown));
    }

    #[test]
    fn a_saturated_level_bounds_the_bracket_by_its_scheduled_rate() {
        let mut path = settings(4.39);
        // The demo's first search: saturated at 4.39 req/s scheduled (completing 3.66),
        // then met at 2.195 (completing 2.19 over the span of its ends: it kept up, so it
        // sustained its schedule). The upper end is the load not carried, 4.39; the completed
        // rate is the throughput ceiling beside the bracket.
        record(
            &mut path,
            measured("level-00", 4.39, 4.39, 3.658, SearchVerdict::Saturated),
            StepReason::Start,
        );
        let next = record(
            &mut path,
            measured("level-01", 2.195, 2.195, 2.19, SearchVerdict::Met),
            StepReason::Halving,
        );
        let b = path.bracket();
        assert_eq!(b.upper.as_ref().unwrap().rate, 4.39);
        assert_eq!(b.lower.as_ref().unwrap().rate, 2.195);
        assert_eq!(path.throughput_ceiling(), Some(3.658));
        // Bisecting: the geometric mid-point of the ends, √(2.195 × 4.39) = 3.104.
        assert_eq!(
            next,
            Next::Run {
                rate: 3.104,
                reason: StepReason::Bisecting
            }
        );
        // A second saturated level at the mid-point moves the upper end to its own
        // scheduled rate (it completed the same 3.66, which bounded nothing before).
        let next = record(
            &mut path,
            measured("level-02", 3.104, 3.104, 3.0, SearchVerdict::Saturated),
            StepReason::Bisecting,
        );
        assert_eq!(path.bracket().upper.unwrap().rate, 3.104);
        assert_eq!(
            next,
            Next::Run {
                rate: 2.61,
                reason: StepReason::Bisecting
            }
        );
        assert_eq!(path.throughput_ceiling(), Some(3.658));
    }

    #[test]
    fn noisy_servers_converge_within_max_levels() {
        // Each level meets the SLO when its rate is below a knee that moves ±8% from level
        // to level (a seeded draw): the search still ends converged or at --max-levels,
        // never "cannot be narrowed".
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let mut path = settings(10.0);
            let mut next = start(&mut path, false);
            let mut i = 0;
            while let Next::Run { rate, reason } = next {
                let knee = 6.0 * (1.0 + rng.random_range(-0.08..0.08));
                let verdict = if rate <= knee {
                    SearchVerdict::Met
                } else {
                    SearchVerdict::Saturated
                };
                let completed = rate.min(knee * 1.1);
                let dir = format!("level-{i:02}");
                next = record(
                    &mut path,
                    measured(&dir, rate, rate, completed, verdict),
                    reason,
                );
                i += 1;
            }
            assert!(
                matches!(path.end, Some(SearchEnd::Converged | SearchEnd::MaxLevels)),
                "{path:#?}"
            );
        }
    }

    #[test]
    fn repeats_interleave_the_ends_and_step_outward_to_bracket() {
        let mut path = settings(10.0);
        search(&mut path, 6.3);
        // The final bracket [5.946, 6.484] (9% wide) widened to 1.1² around its centre 6.209.
        let (lower, upper) = (5.645, 6.83);
        let mut done = Vec::new();
        let mut order = Vec::new();
        // Repeat 1 brackets; repeat 2 passes at both ends, so it steps outward: 6.83 × 1.1
        // = 7.513 fails.
        while let Some(level) = next_repeat(&path, 3, &done) {
            order.push((level.repeat, level.rate, level.side));
            let verdict = if level.rate <= 6.3 || (level.repeat == 2 && level.rate < 7.0) {
                SearchVerdict::Met
            } else {
                SearchVerdict::NotMet
            };
            done.push(RepeatRun {
                repeat: level.repeat,
                rate: level.rate,
                verdict,
            });
        }
        assert_eq!(
            order,
            vec![
                (1, lower, RepeatSide::Lower),
                (1, upper, RepeatSide::Upper),
                (2, lower, RepeatSide::Lower),
                (2, upper, RepeatSide::Upper),
                (2, 7.513, RepeatSide::Outward),
            ]
        );
        // A repeat failing everywhere steps down, at most MAX_OUTWARD_LEVELS times.
        let mut done = Vec::new();
        while let Some(level) = next_repeat(&path, 2, &done) {
            done.push(RepeatRun {
                repeat: level.repeat,
                rate: level.rate,
                verdict: SearchVerdict::Saturated,
            });
        }
        let rates: Vec<f64> = done.iter().map(|r| r.rate).collect();
        assert_eq!(rates, vec![lower, upper, 5.132, 4.665]);
        assert_eq!(next_repeat(&path, 1, &[]), None, "R = 1 repeats nothing");
        let mut open = settings(10.0);
        search(&mut open, 1000.0);
        assert_eq!(next_repeat(&open, 3, &[]), None, "no upper end to repeat");
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
