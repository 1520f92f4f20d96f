//! Mann–Whitney U test for two independent samples, two-sided.
//!
//! Exact null distribution when n1 + n2 ≤ 40 and there are no ties; otherwise the normal
//! approximation with tie correction and continuity correction (scipy's
//! `mannwhitneyu(x, y, method="asymptotic", use_continuity=True)`).

use super::rank::{average_ranks, tie_term};
use super::{PMethod, RankTest};
use statrs::distribution::{ContinuousCDF, Normal};

/// Largest n1 + n2 for which the exact distribution is computed.
const EXACT_MAX_TOTAL: usize = 40;

/// Two-sided Mann–Whitney U test of `x` against `y`. The statistic is U of `x`
/// (scipy's convention); `direction` is +1 when `y` tends to be larger than `x`.
/// `None` when either sample has no finite value.
pub fn mann_whitney_u(x: &[f64], y: &[f64]) -> Option<RankTest> {
    let x: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let y: Vec<f64> = y.iter().copied().filter(|v| v.is_finite()).collect();
    let (n1, n2) = (x.len(), y.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let pooled: Vec<f64> = x.iter().chain(&y).copied().collect();
    let (ranks, groups) = average_ranks(&pooled);
    let r1: f64 = ranks[..n1].iter().sum();
    let u1 = r1 - (n1 * (n1 + 1)) as f64 / 2.0;
    let product = (n1 * n2) as f64;
    let u2 = product - u1;
    let mean = product / 2.0;
    let u_max = u1.max(u2);
    let direction = if u1 < u2 {
        1
    } else if u1 > u2 {
        -1
    } else {
        0
    };
    let has_ties = groups.iter().any(|&t| t > 1);
    let n = n1 + n2;
    let (p_value, method) = if n <= EXACT_MAX_TOTAL && !has_ties {
        (exact_p(n1, n2, u_max), PMethod::Exact)
    } else {
        let nf = n as f64;
        let variance = product / 12.0 * ((nf + 1.0) - tie_term(&groups) / (nf * (nf - 1.0)));
        let p = if variance <= 0.0 {
            1.0
        } else {
            let z = (u_max - mean - 0.5) / variance.sqrt();
            (2.0 * Normal::standard().sf(z)).min(1.0)
        };
        (p, PMethod::Normal)
    };
    Some(RankTest {
        statistic: u1,
        p_value,
        n,
        method,
        direction,
    })
}

/// Exact two-sided p-value 2 · P(U ≥ u_max), capped at 1.
fn exact_p(n1: usize, n2: usize, u_max: f64) -> f64 {
    let distribution = u_distribution(n1, n2);
    let total: f64 = distribution.iter().sum();
    let u = u_max.round() as usize;
    let upper: f64 = distribution[u.min(distribution.len())..].iter().sum();
    (2.0 * upper / total).min(1.0)
}

/// Number of arrangements giving each U in 0..=n1·n2, by the recurrence
/// c(m, n; u) = c(m − 1, n; u − n) + c(m, n − 1; u).
fn u_distribution(n1: usize, n2: usize) -> Vec<f64> {
    // table[m][n] is the distribution for sizes (m, n); built row by row over m.
    let mut previous: Vec<Vec<f64>> = (0..=n2).map(|_| vec![1.0]).collect();
    for m in 1..=n1 {
        let mut current: Vec<Vec<f64>> = Vec::with_capacity(n2 + 1);
        current.push(vec![1.0]);
        for n in 1..=n2 {
            let mut counts = vec![0.0; m * n + 1];
            for (u, c) in previous[n].iter().enumerate() {
                counts[u + n] += c;
            }
            for (u, c) in current[n - 1].iter().enumerate() {
                counts[u] += c;
            }
            current.push(counts);
        }
        previous = current;
    }
    previous.swap_remove(n2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u_distribution_is_symmetric_and_complete() {
        let d = u_distribution(3, 4);
        assert_eq!(d.len(), 13);
        assert_eq!(d.iter().sum::<f64>(), 35.0); // C(7, 3)
        for u in 0..d.len() {
            assert_eq!(d[u], d[d.len() - 1 - u]);
        }
    }

    #[test]
    fn empty_sample_is_untestable() {
        assert!(mann_whitney_u(&[], &[1.0]).is_none());
    }
}
