//! Distribution-free confidence intervals for percentiles, from order statistics.
//!
//! With n values, the number B of them below the true q-quantile is Binomial(n, q), so the
//! interval [x(l), x(u)] between the l-th and u-th smallest values covers the quantile with
//! probability P(l ≤ B ≤ u − 1). We take the largest l with P(B ≤ l − 1) ≤ α/2 and the
//! smallest u with P(B ≥ u) ≤ α/2. When no such l ≥ 1 exists the lower bound is below the
//! smallest value; when no u ≤ n exists the upper bound is above the largest: a sample of n
//! values bounds the q-quantile from above only when qⁿ ≤ α/2 (p99 at 95%: n ≥ 368; p99.9:
//! n ≥ 3,688).

use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, DiscreteCDF};

/// A percentile's confidence interval; `None` bounds lie beyond the sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantileCi {
    /// `None`: below the smallest value.
    pub lower: Option<f64>,
    /// `None`: above the largest value.
    pub upper: Option<f64>,
}

impl QuantileCi {
    /// "12.3–15.0", "12.3–above max", "below min–3.1".
    pub fn text(&self, digits: usize) -> String {
        let lower = self
            .lower
            .map_or("below min".to_string(), |v| format!("{v:.digits$}"));
        let upper = self
            .upper
            .map_or("above max".to_string(), |v| format!("{v:.digits$}"));
        format!("{lower}–{upper}")
    }
}

/// The smallest sample whose two-sided `confidence` interval for the `q`-quantile has an
/// upper bound inside the sample (qⁿ ≤ (1 − confidence) / 2).
pub fn min_sample_for_quantile(q: f64, confidence: f64) -> u64 {
    let tail = (1.0 - confidence) / 2.0;
    if q <= 0.0 {
        return 1;
    }
    (tail.ln() / q.ln()).ceil().max(1.0) as u64
}

/// The two-sided `confidence` interval of the `q`-quantile of `sorted` (ascending).
pub fn quantile_ci(sorted: &[f64], q: f64, confidence: f64) -> QuantileCi {
    let n = sorted.len() as u64;
    if n == 0 || !(0.0..=1.0).contains(&q) {
        return QuantileCi::default();
    }
    let Ok(binomial) = Binomial::new(q, n) else {
        return QuantileCi::default();
    };
    let tail = (1.0 - confidence) / 2.0;
    // F(k) = P(B ≤ k) is non-decreasing: binary-search the bounds.
    let cdf = |k: u64| binomial.cdf(k);
    // Largest l in 1..=n with F(l − 1) ≤ tail.
    let lower_rank = {
        let (mut lo, mut hi) = (0u64, n); // answer in [0, n]; 0 = none
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if cdf(mid - 1) <= tail {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    };
    // Smallest u in 1..=n with P(B ≥ u) = 1 − F(u − 1) ≤ tail.
    let upper_rank = {
        let (mut lo, mut hi) = (1u64, n + 1); // n + 1 = none
        while lo < hi {
            let mid = (lo + hi) / 2;
            if 1.0 - cdf(mid - 1) <= tail {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    QuantileCi {
        lower: (lower_rank >= 1).then(|| sorted[lower_rank as usize - 1]),
        upper: (upper_rank <= n).then(|| sorted[upper_rank as usize - 1]),
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn sample_sizes_needed_for_an_upper_bound() {
        assert_eq!(min_sample_for_quantile(0.99, 0.95), 368);
        assert_eq!(min_sample_for_quantile(0.999, 0.95), 3688);
        assert_eq!(min_sample_for_quantile(0.9, 0.95), 36);
        let values: Vec<f64> = (1..=367).map(f64::from).collect();
        assert_eq!(quantile_ci(&values, 0.99, 0.95).upper, None);
        let values: Vec<f64> = (1..=368).map(f64::from).collect();
        assert_eq!(quantile_ci(&values, 0.99, 0.95).upper, Some(368.0));
    }

    #[test]
    fn eleven_values_bound_the_median_but_not_p99() {
        let values: Vec<f64> = (1..=11).map(f64::from).collect();
        let median = quantile_ci(&values, 0.5, 0.95);
        // Binomial(11, 0.5): P(B ≤ 1) = 0.0059, P(B ≤ 2) = 0.0327 → l = 2, u = 10.
        assert_eq!(
            median,
            QuantileCi {
                lower: Some(2.0),
                upper: Some(10.0)
            }
        );
        // Binomial(11, 0.99): P(B ≤ 9) = 0.0052, P(B ≤ 10) = 0.105 → l = 10; no u ≤ 11.
        let p99 = quantile_ci(&values, 0.99, 0.95);
        assert_eq!(
            p99,
            QuantileCi {
                lower: Some(10.0),
                upper: None
            }
        );
        assert_eq!(p99.text(1), "10.0–above max");
    }

    #[test]
    fn coverage_is_at_least_the_confidence_level() {
        // Uniform(0, 1): the true q-quantile is q. 400 seeded samples of 500 values.
        let mut rng = StdRng::seed_from_u64(9);
        for q in [0.5, 0.9, 0.99] {
            let mut covered = 0;
            for _ in 0..400 {
                let mut values: Vec<f64> = (0..500).map(|_| rng.random::<f64>()).collect();
                values.sort_by(f64::total_cmp);
                let ci = quantile_ci(&values, q, 0.95);
                let lower = ci.lower.unwrap_or(f64::NEG_INFINITY);
                let upper = ci.upper.unwrap_or(f64::INFINITY);
                covered += usize::from(lower <= q && q <= upper);
            }
            // Exact coverage ≥ 95%; 400 draws put the observed share above 92% with
            // overwhelming probability.
            assert!(covered >= 368, "q = {q}: covered {covered} of 400");
        }
    }
}
