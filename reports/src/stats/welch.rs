//! Welch's unequal-variance t-test, two-sided.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WelchTest {
    /// t = (mean(a) − mean(b)) / standard error (scipy's sign convention).
    pub t: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: f64,
    pub p_value: f64,
}

/// Welch's t-test of `a` against `b` (scipy `ttest_ind(a, b, equal_var=False)`).
/// `None` when a sample has fewer than two values or both variances are zero.
pub fn welch_t_test(a: &[f64], b: &[f64]) -> Option<WelchTest> {
    let (mean_a, var_a) = mean_variance(a)?;
    let (mean_b, var_b) = mean_variance(b)?;
    let (sa, sb) = (var_a / a.len() as f64, var_b / b.len() as f64);
    let se2 = sa + sb;
    if se2 <= 0.0 || !se2.is_finite() {
        return None;
    }
    let t = (mean_a - mean_b) / se2.sqrt();
    let df = se2 * se2 / (sa * sa / (a.len() - 1) as f64 + sb * sb / (b.len() - 1) as f64);
    let distribution = StudentsT::new(0.0, 1.0, df).ok()?;
    let p_value = (2.0 * distribution.sf(t.abs())).min(1.0);
    Some(WelchTest { t, df, p_value })
}

/// Mean and unbiased variance; `None` below two values.
fn mean_variance(values: &[f64]) -> Option<(f64, f64)> {
    if values.len() < 2 {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, variance))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degenerate_inputs_are_untestable() {
        assert!(welch_t_test(&[1.0], &[1.0, 2.0]).is_none());
        assert!(welch_t_test(&[1.0, 1.0], &[2.0, 2.0]).is_none());
    }
}
