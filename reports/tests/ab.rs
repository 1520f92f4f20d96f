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
    let report = compare(&input, 0.05, settings(seed));
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

#[test]
fn a_a_paired_is_no_difference_in_at_least_18_of_20_seeds() {
    let clean = (0..20)
        .filter(|&seed| {
            paired_verdicts(seed, [1.0; 3])
                .iter()
                .all(|(_, v)| *v == Verdict::NoSignificantDifference)
        })
        .count();
    assert!(
        clean >= 18,
        "only {clean} of 20 A/A runs found no difference"
    );
}

#[test]
fn b_15_percent_slower_is_detected_every_seed() {
    for seed in 0..20 {
        for (metric, verdict) in paired_verdicts(100 + seed, [1.15; 3]) {
            assert_eq!(verdict, Verdict::AFaster, "seed {seed}, {metric:?}");
        }
    }
}

#[test]
fn slower_tpot_only_is_attributed_to_tpot() {
    let verdicts = paired_verdicts(7, [1.0, 1.15, 1.0]);
    assert_eq!(
        verdicts[0],
        (SloMetric::Ttft, Verdict::NoSignificantDifference)
    );
    assert_eq!(verdicts[1], (SloMetric::Tpot, Verdict::AFaster));
    // B faster is the mirror image.
    let verdicts = paired_verdicts(7, [1.0, 1.0 / 1.15, 1.0]);
    assert_eq!(verdicts[1], (SloMetric::Tpot, Verdict::BFaster));
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
    compare(&input, 0.05, settings(seed))
        .metrics
        .iter()
        .map(|v| v.verdict)
        .collect()
}

#[test]
fn unpaired_a_a_and_a_b() {
    let clean = (0..20)
        .filter(|&seed| {
            unpaired_verdicts(seed, 1.0)
                .iter()
                .all(|v| *v == Verdict::NoSignificantDifference)
        })
        .count();
    assert!(
        clean >= 18,
        "only {clean} of 20 unpaired A/A runs found no difference"
    );
    for seed in 0..5 {
        assert!(unpaired_verdicts(200 + seed, 1.15)
            .iter()
            .all(|v| *v == Verdict::AFaster));
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
