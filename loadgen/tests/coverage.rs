//! The capacity's intervals and the saturation verdicts are honest: the real knee search
//! (`knee_search`, with `--repeats 3`), the real saturation judgement and the real SLO check
//! and capacity plan (`reports`) run on a seeded simulated server whose speed changes from
//! one level run to the next, and the between-run interval must cover the true capacity.
//!
//! The server: 4 FIFO slots; a request holds a slot for (0.05 s + X) / s, X ~ Exp(mean
//! 0.31 s), and its first token comes 0.05 s / s after its service starts. The speed s is
//! drawn for every level run from Uniform[0.9, 1.1]. Arrivals follow the exact-rate Poisson
//! schedule a sweep level runs (5 s warm-up, 25 s window). The SLO is `ttft:p90:L`, with L the
//! median p90 TTFT at 0.8 utilisation, so the crossing sits there, where no saturation rule
//! should fire.
//!
//! The true capacity λ̄ is the arrival rate at which one level run (same warm-up, window and
//! schedule, fresh s) meets the SLO with probability ½. This file computes it with its own
//! event simulation and nearest-rank percentile ([`truth`]), sharing no code with the search,
//! the saturation rules or `reports`.

use loadgen::experiments::sweep::knee_search::{self, Measured, Next, RepeatRun};
use loadgen::load::schedule::{scale_to_rate, Arrival, Extent, ScheduleSpec, Window};
use loadgen::spec::search::SearchArgs;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use reports::capacity::{capacity_plan, PlanOptions, SweepLevel, TargetLoad};
use reports::records::{ChunkTokensSource, CountSource, Phase, RequestRecord};
use reports::samples::LatencySamples;
use reports::saturation::{judge, level_rates, JudgeContext, SaturationState, WaitingGauge};
use reports::slo::SloSpec;
use reports::stats::Bootstrap;

const SLOTS: usize = 4;
const FIRST_TOKEN_S: f64 = 0.05;
const MEAN_X_S: f64 = 0.31;
/// Requests/s the server completes at s = 1.
const CAPACITY: f64 = SLOTS as f64 / (FIRST_TOKEN_S + MEAN_X_S);
const WARMUP_S: f64 = 5.0;
const WINDOW_S: f64 = 25.0;
const SEARCHES: usize = 400;
const REPEATS: usize = 3;

/// One level run's sends (exact-rate schedule) and the server's answers to them, as the
/// records `loadgen run` writes, and its waiting gauge as scraped every 2 s (`loadgen run`'s
/// default) over the measured window.
fn level_run(rate: f64, seed: u64) -> (Vec<RequestRecord>, JudgeContext) {
    let mut rng = StdRng::seed_from_u64(seed);
    let speed = rng.random_range(0.9..1.1);
    let end = WARMUP_S + WINDOW_S;
    let draw = ScheduleSpec {
        arrival: Arrival::Poisson,
        rate,
        ramp_up: None,
    }
    .generate(Extent::Until(4.0 * end), seed ^ 0x5C4E)
    .unwrap();
    let window = Window {
        warmup_s: WARMUP_S,
        duration_s: Some(WINDOW_S),
    };
    let (sends, _) = scale_to_rate(&draw, rate, window, Some(end)).unwrap();
    let x = Exp::new(1.0 / MEAN_X_S).unwrap();
    let mut free = [0.0f64; SLOTS];
    let mut waits: Vec<(f64, f64)> = Vec::new();
    let records = sends
        .iter()
        .enumerate()
        .map(|(i, &at)| {
            let slot = (0..SLOTS)
                .min_by(|&a, &b| free[a].total_cmp(&free[b]))
                .unwrap();
            let start = free[slot].max(at);
            waits.push((at, start));
            free[slot] = start + (FIRST_TOKEN_S + x.sample(&mut rng)) / speed;
            let first = start + FIRST_TOKEN_S / speed;
            let phase = if at < WARMUP_S {
                Phase::Warmup
            } else {
                Phase::Measured
            };
            record(i as u64, phase, at * 1e3, first * 1e3, free[slot] * 1e3)
        })
        .collect();
    let readings = (0..)
        .map(|k| WARMUP_S + (seed % 2000) as f64 / 1000.0 + 2.0 * k as f64)
        .take_while(|&t| t <= end)
        .map(|t| {
            let waiting = waits
                .iter()
                .filter(|&&(at, start)| at <= t && t < start)
                .count();
            (t * 1e3, waiting as f64)
        })
        .collect();
    (
        records,
        JudgeContext {
            waiting: Some(WaitingGauge { readings }),
        },
    )
}

fn record(id: u64, phase: Phase, sent_ms: f64, first_ms: f64, end_ms: f64) -> RequestRecord {
    RequestRecord {
        id,
        phase,
        scheduled_ms: sent_ms,
        queue_ms: 0.0,
        sent_ms,
        first_token_ms: Some(first_ms),
        first_answer_ms: Some(first_ms),
        end_ms,
        chunk_ms: vec![first_ms, end_ms],
        chunk_tokens: vec![1, 1],
        chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
        prompt_tokens: 16,
        prompt_tokens_source: CountSource::Usage,
        output_tokens: 2,
        output_tokens_source: CountSource::Usage,
        reasoning_tokens: 0,
        reasoning_tokens_source: CountSource::Counted,
        requested_output_tokens: 2,
        short_output: false,
        prefix_group: None,
        cached_tokens: None,
        server_timing: None,
        session: None,
        class: None,
        connect_ms: None,
        http_status: Some(200),
        error: None,
    }
}

/// The test's own reading of a level run: the nearest-rank p-th percentile of the measured
/// TTFTs (ms).
fn p_ttft(records: &[RequestRecord], p: f64) -> f64 {
    let mut ttfts: Vec<f64> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .map(|r| r.first_token_ms.unwrap() - r.sent_ms)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * ttfts.len() as f64).ceil().max(1.0) as usize;
    ttfts[rank - 1]
}

/// The true capacity under `limit_ms` and the share of `runs` level runs that met it at each
/// rate tried: a bisection on the pass share (the same seeds at every rate) to 0.25%.
fn truth(limit_ms: f64, runs: u64) -> f64 {
    let pass_share = |rate: f64| {
        (0..runs)
            .filter(|&k| p_ttft(&level_run(rate, 1_000_000 + k).0, 90.0) <= limit_ms)
            .count() as f64
            / runs as f64
    };
    let (mut low, mut high) = (0.5 * CAPACITY, 1.1 * CAPACITY);
    while high / low - 1.0 > 0.0025 {
        let mid = (low * high).sqrt();
        if pass_share(mid) >= 0.5 {
            low = mid;
        } else {
            high = mid;
        }
    }
    (low * high).sqrt()
}

/// A level run as the sweep measures it: its records judged, its SLO checked.
struct Level {
    sweep: SweepLevel,
    measured: Measured,
}

fn measure(rate: f64, seed: u64, slo: &SloSpec, repeat: usize) -> Level {
    let (records, context) = level_run(rate, seed);
    let saturation = judge(&records, &context);
    let rates = level_rates(&records).unwrap();
    let samples = LatencySamples::from_records(&records);
    let saturated = saturation.state == SaturationState::Saturated;
    let verdict = knee_search::verdict(saturated, Some(slo.check(&samples).verdict));
    Level {
        measured: Measured {
            dir: format!("level-{seed}"),
            offered_rate: rate,
            scheduled_rate: Some(rates.scheduled),
            completed_rate: rates.completed,
            verdict,
        },
        sweep: SweepLevel {
            offered_rate: rate,
            completed_rate: rates.completed,
            scheduled_rate: Some(rates.scheduled),
            saturation_rule: Some(saturation.rule),
            output_tokens_per_s: 2.0 * rates.completed,
            saturated,
            samples,
            server: None,
            timeline: None,
            diagnosis: None,
            repeat: (repeat > 0).then_some(repeat),
        },
    }
}

/// One seeded search with its repeats, as `sweep --rates search --repeats 3` runs it; the
/// plan's between-run and single-run intervals of the crossing.
/// An interval's (lower, upper) ends, req/s.
type Ends = Option<(f64, f64)>;

fn search(search_seed: u64, slo: &SloSpec) -> (Ends, Ends) {
    let mut path = SearchArgs {
        precision: Some(0.10),
        ..SearchArgs::default()
    }
    .settings(CAPACITY)
    .unwrap();
    let mut levels: Vec<SweepLevel> = Vec::new();
    let mut seed = search_seed * 1000;
    let mut next = knee_search::start(&mut path, false);
    while let Next::Run { rate, reason } = next {
        seed += 1;
        let level = measure(rate, seed, slo, 0);
        levels.push(level.sweep);
        next = knee_search::record(&mut path, level.measured, reason);
    }
    let mut done: Vec<RepeatRun> = Vec::new();
    while let Some(repeat) = knee_search::next_repeat(&path, REPEATS, &done) {
        seed += 1;
        let level = measure(repeat.rate, seed, slo, repeat.repeat);
        done.push(RepeatRun {
            repeat: repeat.repeat,
            rate: repeat.rate,
            verdict: level.measured.verdict,
        });
        levels.push(level.sweep);
    }
    let options = PlanOptions {
        target: TargetLoad::Qps(10.0),
        gpus_per_instance: 1,
        headroom: 1.2,
        gpu_hour_usd: None,
        bootstrap: Bootstrap {
            resamples: 200,
            ..Bootstrap::default()
        },
    };
    let plan = capacity_plan(&levels, slo, &options).unwrap();
    (
        plan.crossing_between_runs.map(|c| (c.lower, c.upper)),
        plan.crossing.map(|c| (c.lower, c.upper)),
    )
}

#[test]
fn between_run_intervals_cover_the_true_capacity() {
    // L: the median p90 TTFT at 0.8 utilisation.
    let mut p90s: Vec<f64> = (0..501)
        .map(|k| p_ttft(&level_run(0.8 * CAPACITY, 5_000_000 + k).0, 90.0))
        .collect();
    p90s.sort_by(f64::total_cmp);
    let limit_ms = p90s[250].round();
    let slo = SloSpec::parse(&format!("ttft:p90:{limit_ms}ms")).unwrap();
    let true_capacity = truth(limit_ms, 2000);
    println!(
        "SLO ttft:p90:{limit_ms}ms; capacity at s = 1: {CAPACITY:.3} req/s; true capacity \
         λ̄ = {true_capacity:.3} req/s ({:.3} utilisation)",
        true_capacity / CAPACITY
    );

    let (mut covered, mut single_covered, mut widths) = (0, 0, Vec::new());
    for k in 0..SEARCHES as u64 {
        let (between, single) = search(k, &slo);
        if let Some((lower, upper)) = between {
            widths.push((upper - lower) / true_capacity);
            if (lower..=upper).contains(&true_capacity) {
                covered += 1;
            }
        } else {
            widths.push(f64::INFINITY);
        }
        if single.is_some_and(|(lower, upper)| (lower..=upper).contains(&true_capacity)) {
            single_covered += 1;
        }
    }
    widths.sort_by(f64::total_cmp);
    let median_width = widths[widths.len() / 2];
    let share = |n: usize| n as f64 / SEARCHES as f64;
    println!(
        "{SEARCHES} searches with --repeats {REPEATS}: the between-run 95% interval covered \
         λ̄ in {:.1}% (median width {:.1}% of λ̄); the single-run interval in {:.1}%",
        100.0 * share(covered),
        100.0 * median_width,
        100.0 * share(single_covered)
    );
    assert!(share(covered) >= 0.90, "coverage {}", share(covered));
    assert!(median_width <= 0.45, "median width {median_width}");
}

/// The share of `runs` level runs at `utilisation` × the s = 1 capacity (fresh s for each)
/// that the saturation rules call saturated, with the server's waiting gauge scraped or not.
fn saturated_share(utilisation: f64, runs: u64, gauge: bool) -> f64 {
    (0..runs)
        .filter(|&k| {
            let (records, context) = level_run(utilisation * CAPACITY, 9_000_000 + k);
            let context = if gauge {
                context
            } else {
                JudgeContext::default()
            };
            judge(&records, &context).state == SaturationState::Saturated
        })
        .count() as f64
        / runs as f64
}

/// Issue 54's bounds on the saturation verdicts: at most 1% of levels at 0.8 utilisation
/// saturated, at least 99% at 1.2, the server's waiting gauge scraped as `loadgen run` does
/// by default. The speed draw puts real utilisation anywhere in 0.73–0.89 and 1.09–1.33.
/// Without the gauge the capacity rule tests against a utilisation of 1 rather than 0.9
/// (see `reports::saturation`): its false positives at 0.8 are held to the same 1%, and its
/// share at 1.2 is printed, not asserted.
#[test]
fn saturation_verdicts_hold_their_false_positive_rates() {
    let runs = 2000;
    let (at_08, at_12) = (
        saturated_share(0.8, runs, true),
        saturated_share(1.2, runs, true),
    );
    let (bare_08, bare_12) = (
        saturated_share(0.8, runs, false),
        saturated_share(1.2, runs, false),
    );
    println!(
        "saturated over {runs} level runs each: {:.2}% at 0.8 utilisation, {:.2}% at 1.2; \
         without the waiting gauge {:.2}% and {:.2}%",
        100.0 * at_08,
        100.0 * at_12,
        100.0 * bare_08,
        100.0 * bare_12
    );
    assert!(at_08 <= 0.01, "{at_08} of levels at 0.8 called saturated");
    assert!(at_12 >= 0.99, "{at_12} of levels at 1.2 called saturated");
    assert!(
        bare_08 <= 0.01,
        "{bare_08} of levels at 0.8 called saturated"
    );
}
