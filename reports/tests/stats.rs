//! Statistics against reference values computed with scipy 1.17.1 (the call is quoted above
//! each value), bootstrap coverage on synthetic data, and Holm on a hand-worked example.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reports::stats::*;

fn close(actual: f64, expected: f64, tolerance: f64) {
    assert!(
        (actual - expected).abs() <= tolerance,
        "expected {expected}, got {actual}"
    );
}

#[test]
fn wilcoxon_exact_matches_scipy() {
    // scipy.stats.wilcoxon(d, method="exact") -> statistic=5.0, pvalue=0.0390625
    let d = [0.952, -0.147, 1.022, 0.43, 0.62, 0.59, 0.49, -0.08, 0.01];
    let test = wilcoxon_signed_rank(&d).unwrap();
    assert_eq!(test.method, PMethod::Exact);
    assert_eq!(test.statistic, 5.0);
    close(test.p_value, 0.0390625, 1e-12);
    assert_eq!(test.direction, 1);

    // scipy.stats.wilcoxon(d, method="exact") -> statistic=65.0, pvalue=0.14290618896484375
    let d = [
        0.5, -1.2, 2.3, -0.1, 0.7, 1.9, -2.8, 3.3, 0.25, -0.6, 1.1, 1.45, -0.35, 2.05, 0.9, -1.7,
        2.6, 0.05, 1.3, -0.95,
    ];
    let test = wilcoxon_signed_rank(&d).unwrap();
    assert_eq!(test.statistic, 65.0);
    close(test.p_value, 0.14290618896484375, 1e-12);
    // Negating every difference flips the direction, not the p-value.
    let negated: Vec<f64> = d.iter().map(|x| -x).collect();
    let flipped = wilcoxon_signed_rank(&negated).unwrap();
    assert_eq!(flipped.direction, -1);
    close(flipped.p_value, test.p_value, 1e-15);
}

#[test]
fn wilcoxon_normal_approximation_with_ties_and_zeros_matches_scipy() {
    // d = [((i * 7) % 11) - 4 for i in range(60)]
    // scipy.stats.wilcoxon(d, method="approx", correction=True, zero_method="wilcox")
    //   -> statistic=495.0, pvalue=0.020921122942308305
    let d: Vec<f64> = (0..60).map(|i| ((i * 7) % 11) as f64 - 4.0).collect();
    let test = wilcoxon_signed_rank(&d).unwrap();
    assert_eq!(test.method, PMethod::Normal);
    assert_eq!(test.n, 55); // five zeros dropped
    assert_eq!(test.statistic, 495.0);
    close(test.p_value, 0.020921122942308305, 1e-9);
}

#[test]
fn welch_matches_scipy() {
    // scipy.stats.ttest_ind(a, b, equal_var=False)
    //   -> statistic=-3.39968057326893, pvalue=0.004320666553378208, df=13.98707907612669
    let a = [12.1, 14.3, 11.8, 13.9, 15.2, 12.7, 13.3];
    let b = [14.9, 16.2, 13.1, 17.8, 15.5, 16.9, 14.4, 18.2, 15.0];
    let test = welch_t_test(&a, &b).unwrap();
    close(test.t, -3.39968057326893, 1e-10);
    close(test.df, 13.98707907612669, 1e-9);
    close(test.p_value, 0.004320666553378208, 1e-8);
}

#[test]
fn mann_whitney_matches_scipy() {
    // scipy.stats.mannwhitneyu(x, y, method="exact") -> statistic=6.0, pvalue=0.03496503496503496
    let x = [1.1, 2.3, 0.7, 3.4, 2.9, 1.8];
    let y = [2.2, 3.9, 4.1, 2.6, 5.0, 3.1, 4.4];
    let test = mann_whitney_u(&x, &y).unwrap();
    assert_eq!(test.method, PMethod::Exact);
    assert_eq!(test.statistic, 6.0);
    close(test.p_value, 0.03496503496503496, 1e-12);
    assert_eq!(test.direction, 1);

    // x = [(i * 3) % 10 for i in range(30)]; y = [(i * 7) % 13 for i in range(35)]
    // scipy.stats.mannwhitneyu(x, y, method="asymptotic", use_continuity=True)
    //   -> statistic=426.0, pvalue=0.19332463613612316
    let x: Vec<f64> = (0..30).map(|i| ((i * 3) % 10) as f64).collect();
    let y: Vec<f64> = (0..35).map(|i| ((i * 7) % 13) as f64).collect();
    let test = mann_whitney_u(&x, &y).unwrap();
    assert_eq!(test.method, PMethod::Normal);
    assert_eq!(test.statistic, 426.0);
    close(test.p_value, 0.19332463613612316, 1e-9);
}

#[test]
fn holm_matches_hand_worked_example() {
    // Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max 0.06.
    let adjusted = holm_adjust(&[0.01, 0.04, 0.03, 0.005]);
    let expected = [0.03, 0.06, 0.06, 0.02];
    for (a, e) in adjusted.iter().zip(expected) {
        close(*a, e, 1e-12);
    }
    // At α = 0.05 exactly the two smallest are rejected.
    let rejected: Vec<bool> = adjusted.iter().map(|p| *p <= 0.05).collect();
    assert_eq!(rejected, vec![true, false, false, true]);
    assert_eq!(holm_adjust(&[0.6, 0.9]), vec![1.0, 1.0]);
    assert!(holm_adjust(&[]).is_empty());
}

fn normal_sample(rng: &mut StdRng, n: usize, mean: f64, sd: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            // Box–Muller.
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random();
            mean + sd * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        })
        .collect()
}

#[test]
fn bootstrap_median_ci_covers_true_median_at_nominal_rate() {
    let mut rng = StdRng::seed_from_u64(42);
    let trials = 200;
    let mut covered = 0;
    for trial in 0..trials {
        let sample = normal_sample(&mut rng, 101, 10.0, 2.0);
        let settings = Bootstrap {
            resamples: 1000,
            confidence: 0.95,
            seed: trial,
        };
        let ci = bootstrap_ci(&sample, Statistic::Median, settings).unwrap();
        assert!(ci.lower <= ci.estimate && ci.estimate <= ci.upper);
        covered += usize::from(ci.contains(10.0));
    }
    assert!(
        (180..=198).contains(&covered),
        "95% CI covered the true median in {covered} of {trials} trials"
    );
}

#[test]
fn bootstrap_ratio_ci_finds_the_true_ratio() {
    let mut rng = StdRng::seed_from_u64(7);
    let a = normal_sample(&mut rng, 400, 100.0, 10.0);
    let b_unpaired: Vec<f64> = normal_sample(&mut rng, 400, 100.0, 10.0)
        .iter()
        .map(|x| x * 1.15)
        .collect();
    let settings = Bootstrap::default();
    for statistic in [Statistic::Median, Statistic::Percentile(99.0)] {
        let ci = bootstrap_ratio_ci(&a, &b_unpaired, statistic, false, settings).unwrap();
        assert!(
            ci.contains(1.15) && !ci.contains(1.0),
            "{statistic:?}: {ci:?}"
        );
    }
    // Paired: b = a · 1.1 exactly, so every resample gives exactly 1.1.
    let b_paired: Vec<f64> = a.iter().map(|x| x * 1.1).collect();
    let ci = bootstrap_ratio_ci(&a, &b_paired, Statistic::Median, true, settings).unwrap();
    close(ci.lower, 1.1, 1e-12);
    close(ci.upper, 1.1, 1e-12);
    assert!(bootstrap_ratio_ci(&a, &a[1..], Statistic::Median, true, settings).is_none());
    // Same seed, same interval.
    let again = bootstrap_ratio_ci(&a, &b_unpaired, Statistic::Median, false, settings).unwrap();
    let first = bootstrap_ratio_ci(&a, &b_unpaired, Statistic::Median, false, settings).unwrap();
    assert_eq!(again, first);
}
