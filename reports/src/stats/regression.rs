//! Least-squares slopes and Student t-intervals: the tests behind a level's fallback saturation
//! rules and the between-run interval of a capacity.

use statrs::distribution::{ContinuousCDF, StudentsT};

use super::ConfidenceInterval;

/// The least-squares slope of `y` on `x` and its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slope {
    pub slope: f64,
    /// The slope's standard error under independent errors of equal variance.
    pub standard_error: f64,
    pub n: usize,
}

impl Slope {
    /// slope / standard error: infinite for a perfect fit with a slope.
    pub fn t(&self) -> f64 {
        self.slope / self.standard_error
    }
}

/// The slope of `y` on `x` (pairs of finite values); `None` with fewer than three pairs or
/// no spread in `x`.
pub fn ols_slope(x: &[f64], y: &[f64]) -> Option<Slope> {
    let pairs: Vec<(f64, f64)> = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| (a, b))
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect();
    let n = pairs.len();
    if n < 3 {
        return None;
    }
    let mean = |f: fn(&(f64, f64)) -> f64| pairs.iter().map(f).sum::<f64>() / n as f64;
    let (mx, my) = (mean(|p| p.0), mean(|p| p.1));
    let sxx: f64 = pairs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = pairs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let residuals: f64 = pairs
        .iter()
        .map(|p| (p.1 - my - slope * (p.0 - mx)).powi(2))
        .sum();
    Some(Slope {
        slope,
        standard_error: (residuals / (n - 2) as f64 / sxx).sqrt(),
        n,
    })
}

/// The two-sided Student t-interval of the mean of `values` at `confidence` (n − 1 degrees
/// of freedom); `None` with fewer than two values.
pub fn t_interval(values: &[f64], confidence: f64) -> Option<ConfidenceInterval> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
        .ok()?
        .inverse_cdf(0.5 + confidence / 2.0);
    let half = t * (variance / n as f64).sqrt();
    Some(ConfidenceInterval {
        estimate: mean,
        lower: mean - half,
        upper: mean + half,
        confidence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_and_its_error_match_the_textbook_values() {
        // y = 2x + 1 with residuals +1, −1, −1, +1 on x = 0..3: slope 2, se = √(4/2/5).
        let s = ols_slope(&[0.0, 1.0, 2.0, 3.0], &[2.0, 2.0, 4.0, 8.0]).unwrap();
        assert!((s.slope - 2.0).abs() < 1e-12, "{s:?}");
        assert!((s.standard_error - 0.4f64.sqrt()).abs() < 1e-12, "{s:?}");
        let exact = ols_slope(&[0.0, 1.0, 2.0], &[1.0, 3.0, 5.0]).unwrap();
        assert_eq!((exact.slope, exact.standard_error), (2.0, 0.0));
        assert!(exact.t().is_infinite());
        assert_eq!(ols_slope(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
        assert_eq!(ols_slope(&[1.0, 2.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn t_interval_of_three_values_uses_two_degrees_of_freedom() {
        // Mean 2, sd 1, t(0.975; 2) = 4.3027: 2 ± 4.3027 / √3.
        let ci = t_interval(&[1.0, 2.0, 3.0], 0.95).unwrap();
        assert!(
            (ci.upper - 2.0 - 4.302_652_7 / 3f64.sqrt()).abs() < 1e-6,
            "{ci:?}"
        );
        assert!((ci.lower + ci.upper - 4.0).abs() < 1e-12);
        assert_eq!(t_interval(&[1.0], 0.95), None);
    }
}
