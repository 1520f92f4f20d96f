//! Statistics for comparing latency samples: percentiles, rank tests, Welch's t-test,
//! seeded bootstrap confidence intervals and Holm–Bonferroni correction.
//!
//! Everything works on plain `f64` slices so that callers can feed any metric.

mod bootstrap;
mod holm;
mod mann_whitney;
mod percentile;
mod quantile_ci;
mod rank;
mod regression;
mod welch;
mod wilcoxon;

pub use bootstrap::{bootstrap_ci, bootstrap_ratio_ci, Bootstrap, ConfidenceInterval, Statistic};
pub use holm::holm_adjust;
pub use mann_whitney::mann_whitney_u;
pub use percentile::{median, percentile_linear, percentile_nearest_rank};
pub use quantile_ci::{min_sample_for_quantile, quantile_ci, QuantileCi};
pub use regression::{ols_slope, t_interval, Slope};
pub use welch::{welch_t_test, WelchTest};
pub use wilcoxon::wilcoxon_signed_rank;

use serde::{Deserialize, Serialize};

/// How a rank test's p-value was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PMethod {
    /// Exact null distribution (small samples without ties).
    Exact,
    /// Normal approximation with tie and continuity correction.
    Normal,
}

/// Result of a two-sided rank test (Wilcoxon signed-rank or Mann–Whitney U).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankTest {
    /// The test statistic as scipy reports it: min(R+, R−) for Wilcoxon, U of the first sample
    /// for Mann–Whitney.
    pub statistic: f64,
    /// Two-sided p-value.
    pub p_value: f64,
    /// Observations used (Wilcoxon: non-zero differences; Mann–Whitney: n1 + n2).
    pub n: usize,
    pub method: PMethod,
    /// Direction of the effect: +1 when the second sample (or the differences) tend to be larger,
    /// −1 when smaller, 0 when perfectly balanced.
    pub direction: i8,
}
