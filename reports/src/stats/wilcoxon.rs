//! Wilcoxon signed-rank test on paired differences, two-sided.
//!
//! Zero differences are dropped (scipy's `zero_method="wilcox"`). With at most 50 non-zero
//! differences and no ties among their magnitudes the exact null distribution is used;
//! otherwise the normal approximation with tie correction and continuity correction
//! (scipy's `method="approx", correction=True`).

use super::rank::{average_ranks, tie_term};
use super::{PMethod, RankTest};
use statrs::distribution::{ContinuousCDF, Normal};

/// Largest number of non-zero differences for which the exact distribution is used.
const EXACT_MAX_N: usize = 50;

/// Two-sided Wilcoxon signed-rank test of `differences` (e.g. b − a per request).
/// `None` when no non-zero finite difference remains.
pub fn wilcoxon_signed_rank(differences: &[f64]) -> Option<RankTest> {
    let d: Vec<f64> = differences
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x != 0.0)
        .collect();
    let n = d.len();
    if n == 0 {
        return None;
    }
    let magnitudes: Vec<f64> = d.iter().map(|x| x.abs()).collect();
    let (ranks, groups) = average_ranks(&magnitudes);
    let r_plus: f64 = d
        .iter()
        .zip(&ranks)
        .filter(|(x, _)| **x > 0.0)
        .map(|(_, r)| r)
        .sum();
    let total = (n * (n + 1)) as f64 / 2.0;
    let r_minus = total - r_plus;
    let mean = total / 2.0;
    let direction = sign(r_plus - mean);
    let has_ties = groups.iter().any(|&t| t > 1);
    let (p_value, method) = if n <= EXACT_MAX_N && !has_ties {
        (exact_p(n, r_plus), PMethod::Exact)
    } else {
        let nf = n as f64;
        let variance = nf * (nf + 1.0) * (2.0 * nf + 1.0) / 24.0 - tie_term(&groups) / 48.0;
        let p = if variance <= 0.0 {
            1.0
        } else {
            let correction = 0.5 * (r_plus - mean).signum() * f64::from(r_plus != mean);
            let z = (r_plus - mean - correction) / variance.sqrt();
            (2.0 * Normal::standard().sf(z.abs())).min(1.0)
        };
        (p, PMethod::Normal)
    };
    Some(RankTest {
        statistic: r_plus.min(r_minus),
        p_value,
        n,
        method,
        direction,
    })
}

/// Exact two-sided p-value: 2 · min(P(R+ ≤ r), P(R+ ≥ r)) under the null, capped at 1.
fn exact_p(n: usize, r_plus: f64) -> f64 {
    let max_sum = n * (n + 1) / 2;
    // counts[s] = number of subsets of {1..n} with rank sum s (as f64: up to 2^50, exact).
    let mut counts = vec![0.0f64; max_sum + 1];
    counts[0] = 1.0;
    for rank in 1..=n {
        for s in (rank..=max_sum).rev() {
            counts[s] += counts[s - rank];
        }
    }
    let total = 2f64.powi(n as i32);
    let r = r_plus.round() as usize;
    let lower: f64 = counts[..=r].iter().sum::<f64>() / total;
    let upper: f64 = counts[r..].iter().sum::<f64>() / total;
    (2.0 * lower.min(upper)).min(1.0)
}

fn sign(x: f64) -> i8 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_all_zero_is_untestable() {
        assert!(wilcoxon_signed_rank(&[]).is_none());
        assert!(wilcoxon_signed_rank(&[0.0, 0.0]).is_none());
    }
}
