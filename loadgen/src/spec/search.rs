//! The options of a knee search (`sweep --rates search`, each of `tune`'s configurations):
//! the clap type, and the search's settings around the probe's estimate.

use anyhow::{bail, Result};
use clap::Args;
use reports::search::SearchPath;

/// The options of a knee search (shared by `sweep --rates search` and `tune`).
#[derive(Args, Debug, Clone, Default)]
pub struct SearchArgs {
    /// Knee search: stop when the bracket's upper end is within this fraction of its lower
    /// end [default: 0.10].
    #[arg(long)]
    pub precision: Option<f64>,
    /// Knee search: run at most this many levels, re-runs included [default: 8].
    #[arg(long)]
    pub max_levels: Option<usize>,
    /// Knee search: halve no lower than this rate (req/s) [default: the probe's saturation
    /// estimate / 8].
    #[arg(long)]
    pub min_rate: Option<f64>,
    /// Knee search: offer no more than this rate (req/s) [default: 4 × the probe's
    /// saturation estimate].
    #[arg(long)]
    pub max_rate: Option<f64>,
}

pub const DEFAULT_PRECISION: f64 = 0.10;
pub const DEFAULT_MAX_LEVELS: usize = 8;

impl SearchArgs {
    /// The flags given, by name: refused where no search runs.
    pub fn given(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        if self.precision.is_some() {
            given.push("--precision");
        }
        if self.max_levels.is_some() {
            given.push("--max-levels");
        }
        if self.min_rate.is_some() {
            given.push("--min-rate");
        }
        if self.max_rate.is_some() {
            given.push("--max-rate");
        }
        given
    }

    /// The search's settings around the probe's saturation `estimate` (req/s).
    pub fn settings(&self, estimate: f64) -> Result<SearchPath> {
        let precision = self.precision.unwrap_or(DEFAULT_PRECISION);
        if !(precision.is_finite() && precision >= 0.001) {
            bail!("--precision {precision}: expected a fraction of at least 0.001 (0.10 = 10%)");
        }
        let max_levels = self.max_levels.unwrap_or(DEFAULT_MAX_LEVELS);
        if max_levels < 2 {
            bail!("--max-levels {max_levels}: a bracket needs at least 2 levels");
        }
        let min_rate = self.min_rate.unwrap_or(round_rate(estimate / 8.0));
        let max_rate = self.max_rate.unwrap_or(round_rate(estimate * 4.0));
        for (flag, r) in [("--min-rate", min_rate), ("--max-rate", max_rate)] {
            if !(r.is_finite() && r > 0.0) {
                bail!("{flag} {r}: expected a positive rate in requests/s");
            }
        }
        if min_rate >= max_rate {
            let named = |flag: &str, given: bool, what: &str| {
                if given {
                    flag.to_string()
                } else {
                    format!("{flag} (by default {what} of the probe's {estimate:.3} req/s)")
                }
            };
            bail!(
                "{} {min_rate} must be below {} {max_rate} req/s",
                named("--min-rate", self.min_rate.is_some(), "1/8"),
                named("--max-rate", self.max_rate.is_some(), "4×")
            );
        }
        Ok(SearchPath {
            precision,
            max_levels,
            min_rate,
            max_rate,
            start_rate: round_rate(estimate.clamp(min_rate, max_rate)),
            steps: Vec::new(),
            end: None,
            end_reason: None,
        })
    }
}

/// A rate rounded to 4 significant digits (rates in files and folder names stay readable).
pub fn round_rate(rate: f64) -> f64 {
    if rate <= 0.0 || !rate.is_finite() {
        return rate;
    }
    let scale = 10f64.powi(3 - rate.log10().floor() as i32);
    (rate * scale).round() / scale
}
