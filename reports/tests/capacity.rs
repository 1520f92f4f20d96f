//! Capacity plans on synthetic sweeps with known percentiles.

use reports::capacity::{capacity_plan, PlanOptions, SweepLevel, TargetLoad};
use reports::samples::{LatencySamples, RequestSample};
use reports::slo::SloSpec;
use reports::stats::Bootstrap;

/// A level whose TTFTs are scale·i/400 for i = 1..=400 (enough to bound a p99), so its
/// nearest-rank p99 is 0.99·scale.
fn level(rate: f64, ttft_scale: f64, saturated: bool) -> SweepLevel {
    let requests = (1..=400)
        .map(|i| RequestSample {
            id: i,
            ttft_ms: ttft_scale * i as f64 / 400.0,
            ttfa_ms: Some(ttft_scale * i as f64 / 400.0),
            tpot_ms: Some(10.0),
            e2el_ms: 1000.0,
        })
        .collect();
    SweepLevel {
        offered_rate: rate,
        completed_rate: if saturated { rate * 0.8 } else { rate },
        output_tokens_per_s: rate * 100.0,
        saturated,
        samples: LatencySamples {
            requests,
            schedule_lag_ms: vec![],
        },
        server: None,
        timeline: None,
        scheduled_rate: None,
        saturation_rule: None,
        diagnosis: None,
        repeat: None,
    }
}

fn options(target: TargetLoad) -> PlanOptions {
    PlanOptions {
        target,
        gpus_per_instance: 2,
        headroom: 1.2,
        gpu_hour_usd: Some(2.5),
        bootstrap: Bootstrap::default(),
    }
}

fn sweep() -> Vec<SweepLevel> {
    // p99 TTFT: 198, 297, 445.5, 693 ms; given out of order on purpose.
    vec![
        level(8.0, 700.0, false),
        level(1.0, 200.0, false),
        level(4.0, 450.0, false),
        level(2.0, 300.0, false),
    ]
}

#[test]
fn plan_from_a_sweep_that_crosses_the_slo() {
    let slo = SloSpec::parse("ttft:p99:500ms,tpot:p99:50ms").unwrap();
    let plan = capacity_plan(&sweep(), &slo, &options(TargetLoad::Qps(50.0))).unwrap();
    let passed: Vec<bool> = plan.levels.iter().map(|l| l.passed).collect();
    assert_eq!(passed, vec![true, true, true, false]);
    let max = plan.max_sustainable.unwrap();
    assert_eq!((max.level_index, max.offered_rate), (2, 4.0));

    // 4 + (500 − 445.5) / (693 − 445.5) · (8 − 4)
    let crossing = plan.crossing.unwrap();
    assert!((crossing.estimate - (4.0 + 54.5 / 247.5 * 4.0)).abs() < 1e-9);
    assert!(4.0 <= crossing.lower && crossing.lower <= crossing.estimate);
    assert!(crossing.estimate <= crossing.upper && crossing.upper <= 8.0);

    // ⌈50 · 1.2 / 4⌉ = 15 instances, × 2 GPUs.
    let sizing = plan.sizing.unwrap();
    assert_eq!((sizing.instances, sizing.gpus), (15, 30));
    let cost = sizing.cost.unwrap();
    // One instance (2 GPUs · $2.5) makes 400 tok/s = 1.44 M tok/h.
    assert!((cost.usd_per_million_output_tokens_at_capacity - 5.0 / 1.44).abs() < 1e-9);
    // Fleet $75/h for 50 req/s · 100 tok = 18 M tok/h.
    assert!((cost.fleet_usd_per_hour - 75.0).abs() < 1e-9);
    assert!((cost.usd_per_million_output_tokens_at_target - 75.0 / 18.0).abs() < 1e-9);
}

#[test]
fn daily_volume_with_peak_factor() {
    let slo = SloSpec::parse("ttft:500ms").unwrap();
    let target = TargetLoad::Daily {
        requests: 5e6,
        peak_factor: 2.0,
    };
    let plan = capacity_plan(&sweep(), &slo, &options(target)).unwrap();
    let sizing = plan.sizing.unwrap();
    // 5e6 / 86400 · 2 = 115.74 req/s; · 1.2 / 4 = 34.7 → 35 instances.
    assert!((sizing.target_qps - 5e6 / 86_400.0 * 2.0).abs() < 1e-9);
    assert_eq!(sizing.instances, 35);
}

#[test]
fn sweep_that_never_met_the_slo_has_no_plan() {
    let slo = SloSpec::parse("ttft:p99:100ms").unwrap();
    let plan = capacity_plan(&sweep(), &slo, &options(TargetLoad::Qps(10.0))).unwrap();
    assert!(plan.max_sustainable.is_none() && plan.sizing.is_none() && plan.crossing.is_none());
    assert!(plan.notes[0].contains("No level met the SLO"));
}

#[test]
fn slo_met_everywhere_says_the_limit_is_higher() {
    let slo = SloSpec::parse("ttft:p99:1s").unwrap();
    let plan = capacity_plan(&sweep(), &slo, &options(TargetLoad::Qps(10.0))).unwrap();
    assert_eq!(plan.max_sustainable.unwrap().offered_rate, 8.0);
    assert!(plan.crossing.is_none());
    assert!(plan.notes[0].contains("true limit is higher"));
    // ⌈10 · 1.2 / 8⌉ = 2
    assert_eq!(plan.sizing.unwrap().instances, 2);
}

#[test]
fn saturated_level_fails_and_bounds_the_crossing() {
    let slo = SloSpec::parse("ttft:p99:1s").unwrap();
    let levels = vec![level(4.0, 300.0, false), level(8.0, 400.0, true)];
    let plan = capacity_plan(&levels, &slo, &options(TargetLoad::Qps(10.0))).unwrap();
    assert_eq!(plan.max_sustainable.unwrap().offered_rate, 4.0);
    // Latency is within the limit at 8 req/s, but only 6.4 req/s completed.
    // The completed rate is a count of completions, so the interval around it has a width
    // (about ±1.96/√k), never zero.
    let crossing = plan.crossing.unwrap();
    assert_eq!(crossing.estimate, 6.4);
    assert!(
        crossing.lower < 6.4 && 6.4 < crossing.upper && crossing.upper < 1.5 * 6.4,
        "{crossing:?}"
    );
    assert!(plan.notes[0].contains("saturated"));
}

#[test]
fn bad_options_are_errors() {
    let slo = SloSpec::parse("ttft:1s").unwrap();
    let mut bad = options(TargetLoad::Qps(10.0));
    bad.headroom = 0.5;
    assert!(capacity_plan(&sweep(), &slo, &bad).is_err());
    assert!(capacity_plan(&[], &slo, &options(TargetLoad::Qps(1.0))).is_err());
    assert!(capacity_plan(&sweep(), &slo, &options(TargetLoad::Qps(0.0))).is_err());
}

/// The demo's case: a level offered at 1.241 req/s whose seeded schedule held 1.096 req/s
/// over its measured requests (and which completed 1.107): the plan sizes from 1.096, so
/// 10 req/s × 1.2 headroom needs 11 instances, where the nominal rate would say 10.
#[test]
fn the_plan_sizes_from_the_sustained_rate() {
    let mut held = level(1.241, 200.0, false);
    held.scheduled_rate = Some(1.096);
    held.completed_rate = 1.107;
    assert!((held.sustained_rate() - 1.096).abs() < 1e-12);
    let slo = SloSpec::parse("ttft:p99:500ms").unwrap();
    let plan = capacity_plan(
        &[held, level(2.5, 700.0, false)],
        &slo,
        &options(TargetLoad::Qps(10.0)),
    )
    .unwrap();
    let max = plan.max_sustainable.unwrap();
    assert_eq!((max.sustained_rate, max.offered_rate), (1.096, 1.241));
    assert_eq!(plan.sizing.unwrap().instances, 11);
    // A saturated level that completed less than its schedule held sustained its
    // completions; one that kept up (its completed rate off by the latencies at the window's
    // edges, the saturation test found no deficit) sustained its schedule.
    let mut slow = level(2.0, 200.0, true);
    slow.scheduled_rate = Some(1.98);
    slow.completed_rate = 1.9;
    assert!((slow.sustained_rate() - 1.9).abs() < 1e-12);
    slow.saturated = false;
    assert!((slow.sustained_rate() - 1.98).abs() < 1e-12);
}

/// A level whose sample cannot bound the SLO's p99 is "unknown (too few)": never the max
/// sustainable level, even when its values look fine.
#[test]
fn a_level_too_small_for_its_percentile_is_unknown_and_not_the_knee() {
    let mut small = level(4.0, 300.0, false);
    small.samples.requests.truncate(100);
    let slo = SloSpec::parse("ttft:p99:500ms").unwrap();
    let plan = capacity_plan(
        &[level(1.0, 200.0, false), small, level(8.0, 700.0, false)],
        &slo,
        &options(TargetLoad::Qps(10.0)),
    )
    .unwrap();
    let verdicts: Vec<reports::slo::SloVerdict> =
        plan.levels.iter().map(|l| l.check.verdict).collect();
    use reports::slo::SloVerdict::*;
    assert_eq!(verdicts, [Met, Unknown, NotMet]);
    assert_eq!(plan.max_sustainable.unwrap().offered_rate, 1.0);
}

#[test]
fn an_unknown_level_neither_passes_nor_bounds_the_crossing() {
    let slo = SloSpec::parse("ttft:p99:500ms").unwrap();
    // 6 req/s with 20 requests: its p99 (their maximum) is not bounded, so its verdict is
    // unknown; the crossing lies between 4 and 8 req/s as without it.
    let mut unknown = level(6.0, 100.0, false);
    unknown.samples.requests.truncate(20);
    let mut levels = sweep();
    levels.push(unknown);
    let plan = capacity_plan(&levels, &slo, &options(TargetLoad::Qps(10.0))).unwrap();
    assert_eq!(plan.max_sustainable.unwrap().offered_rate, 4.0);
    let crossing = plan.crossing.unwrap();
    assert!((crossing.estimate - (4.0 + 54.5 / 247.5 * 4.0)).abs() < 1e-9);
    assert!(plan.notes[0].contains("1 level(s) above 4.000 req/s had too few requests"));
    assert!(plan
        .notes
        .iter()
        .any(|n| n.contains("breaks between 4.000 and 8.000")));
}
