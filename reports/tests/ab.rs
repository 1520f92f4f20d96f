//! A/B verdicts on synthetic data with fixed seeds.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reports::ab::{compare, AbInput, Pairing, Verdict};
use reports::metrics::SloMetric;
use reports::samples::{LatencySamples, RequestSample};
use reports::stats::Bootstrap;

const ROUNDS: usize = 4;
const REQUESTS: u64 = 100;

fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Per-request base latencies shared by both sides (the same request list), log-normal.
struct Workload {
    base: Vec<[f64; 3]>,
}

impl Workload {
    fn new(rng: &mut StdRng, n: u64) -> Workload {
        let base = (0..n)
            .map(|_| {
                [
                    (100f64.ln() + 0.5 * standard_normal(rng)).exp(),
                    (20f64.ln() + 0.3 * standard_normal(rng)).exp(),
                    (2000f64.ln() + 0.4 * standard_normal(rng)).exp(),
                ]
            })
            .collect();
        Workload { base }
    }

    /// One round: each request's base latencies times independent noise and a per-metric factor.
    fn round(&self, rng: &mut StdRng, factors: [f64; 3]) -> LatencySamples {
        let mut noisy =
            |value: f64, factor: f64| value * factor * (0.1 * standard_normal(rng)).exp();
        let requests = self
            .base
            .iter()
            .enumerate()
            .map(|(id, b)| RequestSample {
                id: id as u64,
                ttft_ms: noisy(b[0], factors[0]),
                // The answer starts after some reasoning: TTFT's factor moves it too.
                ttfa_ms: Some(noisy(1.5 * b[0], factors[0])),
                tpot_ms: Some(noisy(b[1], factors[1])),
                e2el_ms: noisy(b[2], factors[2]),
            })
            .collect();
        LatencySamples {
            requests,
            schedule_lag_ms: vec![0.0; self.base.len()],
        }
    }
}

fn settings(seed: u64) -> Bootstrap {
    Bootstrap {
        resamples: 400,
        confidence: 0.95,
        seed,
    }
}

/// Paired A/B run: `ROUNDS` rounds per side over the same request list.
fn paired_verdicts(seed: u64, b_factors: [f64; 3]) -> Vec<(SloMetric, Verdict)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let workload = Workload::new(&mut rng, REQUESTS);
    let a: Vec<LatencySamples> = (0..ROUNDS)
        .map(|_| workload.round(&mut rng, [1.0; 3]))
        .collect();
    let b: Vec<LatencySamples> = (0..ROUNDS)
        .map(|_| workload.round(&mut rng, b_factors))
        .collect();
    let input = AbInput::from_rounds(&a, &b, true);
    assert_eq!(input.pairing, Pairing::Paired);
    let report = compare(&input, 0.05, 0.02, settings(seed));
    for v in &report.metrics {
        assert_eq!(v.n_a, ROUNDS * REQUESTS as usize);
        assert_eq!(v.differences.len(), v.n_a);
        assert!(v.welch.is_some(), "4 rounds per side allow Welch");
    }
    report
        .metrics
        .iter()
        .map(|v| (v.metric, v.verdict))
        .collect()
}

fn undecided(v: &Verdict) -> bool {
    matches!(v, Verdict::Equivalent | Verdict::Inconclusive)
}

#[test]
fn a_a_paired_is_equivalent_or_inconclusive_in_at_least_19_of_20_seeds() {
    let runs: Vec<Vec<(SloMetric, Verdict)>> = (0..20)
        .map(|seed| paired_verdicts(seed, [1.0; 3]))
        .collect();
    let clean = runs
        .iter()
        .filter(|r| r.iter().all(|(_, v)| undecided(v)))
        .count();
    assert!(clean >= 19, "only {clean} of 20 A/A runs were undecided");
}

#[test]
fn a_large_a_a_sample_is_called_equivalent() {
    // 16,000 paired requests (log-normal spread 0.3–0.5, 10% noise per measurement) pin the
    // ratio of medians to about ±0.6%, inside the 2% margin; 4,000 leave it at about ±1.2%.
    let mut rng = StdRng::seed_from_u64(21);
    let workload = Workload::new(&mut rng, 16_000);
    let a = vec![workload.round(&mut rng, [1.0; 3])];
    let b = vec![workload.round(&mut rng, [1.0; 3])];
    let report = compare(
        &AbInput::from_rounds(&a, &b, true),
        0.05,
        0.02,
        settings(21),
    );
    for v in &report.metrics {
        assert_eq!(
            v.verdict,
            Verdict::Equivalent,
            "{:?}: {:?}",
            v.metric,
            v.median_ratio
        );
        assert_eq!(v.requests_to_decide, None);
    }
}

#[test]
fn b_15_percent_slower_is_detected_every_seed() {
    for seed in 0..20 {
        for (metric, verdict) in paired_verdicts(100 + seed, [1.15; 3]) {
            assert_eq!(verdict, Verdict::BSlower, "seed {seed}, {metric:?}");
        }
    }
}

#[test]
fn ttft_10_percent_slower_is_called_b_slower_in_at_least_19_of_20() {
    let slower = (0..20)
        .filter(|&seed| {
            paired_verdicts(300 + seed, [1.10, 1.0, 1.0])[0] == (SloMetric::Ttft, Verdict::BSlower)
        })
        .count();
    assert!(
        slower >= 19,
        "+10% TTFT called B slower in only {slower} of 20"
    );
}

#[test]
fn a_1_percent_difference_under_a_2_percent_margin_is_never_slower() {
    for seed in 0..20 {
        for (metric, verdict) in paired_verdicts(400 + seed, [1.01; 3]) {
            assert_ne!(verdict, Verdict::BSlower, "seed {seed}, {metric:?}");
            assert_ne!(verdict, Verdict::BFaster, "seed {seed}, {metric:?}");
        }
    }
}

#[test]
fn slower_tpot_only_is_attributed_to_tpot() {
    let verdicts = paired_verdicts(7, [1.0, 1.15, 1.0]);
    assert_eq!(verdicts[0].0, SloMetric::Ttft);
    assert!(undecided(&verdicts[0].1), "{verdicts:?}");
    assert_eq!(verdicts[1].0, SloMetric::TimeToFirstAnswer);
    assert!(undecided(&verdicts[1].1), "{verdicts:?}");
    assert_eq!(verdicts[2], (SloMetric::Tpot, Verdict::BSlower));
    // B faster is the mirror image.
    let verdicts = paired_verdicts(7, [1.0, 1.0 / 1.15, 1.0]);
    assert_eq!(verdicts[2], (SloMetric::Tpot, Verdict::BFaster));
}

#[test]
fn a_small_sample_is_inconclusive_and_says_how_many_requests_would_decide() {
    let mut rng = StdRng::seed_from_u64(11);
    let workload = Workload::new(&mut rng, 12);
    let a = vec![workload.round(&mut rng, [1.0; 3])];
    let b = vec![workload.round(&mut rng, [1.0; 3])];
    let report = compare(
        &AbInput::from_rounds(&a, &b, true),
        0.05,
        0.02,
        settings(11),
    );
    let ttft = &report.metrics[0];
    assert_eq!(ttft.verdict, Verdict::Inconclusive, "{ttft:?}");
    let margin = ttft.margin.unwrap();
    assert!(
        (margin - 0.02).abs() < 1e-12,
        "TTFT ≈ 100 ms: the 2% margin exceeds the 1 ms floor"
    );
    let needed = ttft.requests_to_decide.unwrap();
    assert!(needed > 12, "{needed}");
    assert_eq!(ttft.rounds_to_decide, Some(needed.div_ceil(12)));
}

#[test]
fn the_absolute_floor_widens_the_margin_of_fast_metrics() {
    // TTFT around 10 ms: 2% would be 0.2 ms, below the 1 ms floor, so the margin is 10%;
    // a true 3% difference is then equivalent, never B slower.
    let mut rng = StdRng::seed_from_u64(5);
    let workload = Workload::new(&mut rng, 4000);
    let scale = |s: LatencySamples, f: f64| LatencySamples {
        requests: s
            .requests
            .into_iter()
            .map(|r| RequestSample {
                ttft_ms: r.ttft_ms / 10.0 * f,
                ttfa_ms: r.ttfa_ms.map(|v| v / 10.0 * f),
                ..r
            })
            .collect(),
        ..s
    };
    let a = vec![scale(workload.round(&mut rng, [1.0; 3]), 1.0)];
    let b = vec![scale(workload.round(&mut rng, [1.0; 3]), 1.03)];
    let report = compare(&AbInput::from_rounds(&a, &b, true), 0.05, 0.02, settings(5));
    let ttft = &report.metrics[0];
    assert!(ttft.margin.unwrap() > 0.09, "{:?}", ttft.margin);
    assert_eq!(ttft.verdict, Verdict::Equivalent, "{ttft:?}");
}

#[test]
fn effect_sizes_bracket_the_true_ratio() {
    let mut rng = StdRng::seed_from_u64(3);
    let workload = Workload::new(&mut rng, 500);
    let a = vec![workload.round(&mut rng, [1.0; 3])];
    let b = vec![workload.round(&mut rng, [1.15; 3])];
    let report = compare(
        &AbInput::from_rounds(&a, &b, true),
        0.05,
        0.02,
        Bootstrap::default(),
    );
    for v in &report.metrics {
        let ci = v.median_ratio.unwrap();
        assert!(
            ci.contains(1.15) && ci.lower > 1.0,
            "{:?}: {ci:?}",
            v.metric
        );
        let p99 = v.p99_ratio.unwrap();
        assert!(p99.contains(1.15), "{:?}: {p99:?}", v.metric);
        assert!(v.welch.is_none(), "one round per side cannot run Welch");
    }
}

/// Unpaired: every side gets its own, independent request list.
fn unpaired_verdicts(seed: u64, b_factor: f64) -> Vec<Verdict> {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = vec![Workload::new(&mut rng, 1000).round(&mut rng, [1.0; 3])];
    let b = vec![Workload::new(&mut rng, 1000).round(&mut rng, [b_factor; 3])];
    let input = AbInput::from_rounds(&a, &b, false);
    assert_eq!(input.pairing, Pairing::Unpaired);
    compare(&input, 0.05, 0.02, settings(seed))
        .metrics
        .iter()
        .map(|v| v.verdict)
        .collect()
}

#[test]
fn unpaired_a_a_and_a_b() {
    let clean = (0..20)
        .filter(|&seed| unpaired_verdicts(seed, 1.0).iter().all(undecided))
        .count();
    assert!(
        clean >= 19,
        "only {clean} of 20 unpaired A/A runs were undecided"
    );
    for seed in 0..5 {
        assert!(unpaired_verdicts(200 + seed, 1.15)
            .iter()
            .all(|v| *v == Verdict::BSlower));
    }
}

#[test]
fn pairing_without_common_ids_falls_back_to_unpaired() {
    let mut rng = StdRng::seed_from_u64(1);
    let a = Workload::new(&mut rng, 50).round(&mut rng, [1.0; 3]);
    let mut b = Workload::new(&mut rng, 50).round(&mut rng, [1.0; 3]);
    for r in &mut b.requests {
        r.id += 1000;
    }
    let input = AbInput::from_rounds(&[a], &[b], true);
    assert_eq!(input.pairing, Pairing::Unpaired);
    assert_eq!(input.notes.len(), 1);
}

#[test]
fn the_headline_says_the_verdicts_in_words() {
    let mut rng = StdRng::seed_from_u64(31);
    let workload = Workload::new(&mut rng, 4000);
    let a = vec![workload.round(&mut rng, [1.0; 3])];
    let b = vec![workload.round(&mut rng, [1.15, 1.0, 1.0])];
    let report = compare(
        &AbInput::from_rounds(&a, &b, true),
        0.05,
        0.02,
        settings(31),
    );
    let headline = report.headline("llama-server");
    assert!(
        headline.starts_with("B (llama-server): slower on TTFT: median 1"),
        "{headline}"
    );
    assert!(headline.contains("% higher (95% CI "), "{headline}");
    assert!(headline.contains("p < 0.001"), "{headline}");
    assert!(
        headline.contains("TPOT: equivalent (within ±2.0%)")
            || headline.contains("TPOT: inconclusive"),
        "{headline}"
    );
}
