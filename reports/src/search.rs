//! The record of a knee search (`sweep --rates search`), as `sweep.json` keeps it and the
//! sweep report shows it: each level in the order run, why its rate was chosen, its verdict
//! and the bracket after it, then why the search ended.
//!
//! Each level's coordinate is the load its schedule held ([`crate::rates`]): a passing level
//! bounds the crossing from below at its sustained rate (what it carried), a failing level
//! from above at its scheduled rate (the load it did not carry). The bracket's lower end is
//! the passing level with the highest sustained rate; its upper end the failing level with
//! the lowest scheduled rate above that. A saturated level's completed rate is the server's
//! throughput, reported beside the bracket as its ceiling ([`SearchPath::throughput_ceiling`]),
//! never as an end: every saturated level completes about the same, so it could never narrow.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a level's rate was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepReason {
    /// The probe's saturation estimate, the first level.
    Start,
    /// Half the lowest failing rate: no level has passed yet.
    Halving,
    /// Twice the highest passing rate: no level has failed yet.
    Doubling,
    /// The geometric mid-point of the bracket.
    Bisecting,
    /// The previous level's verdict was unknown: the same rate with twice the requests.
    Rerun,
}

impl fmt::Display for StepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepReason::Start => "start (probe estimate)",
            StepReason::Halving => "bracketing: halving",
            StepReason::Doubling => "bracketing: doubling",
            StepReason::Bisecting => "bisecting",
            StepReason::Rerun => "re-run (unknown, twice the requests)",
        })
    }
}

/// A level's verdict for the search: it passes only when the SLO is met and it did not
/// saturate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchVerdict {
    Met,
    NotMet,
    /// Saturated: counts as not meeting the SLO, whatever its percentiles.
    Saturated,
    /// Too few requests to bound a percentile, and not saturated: neither end of a bracket.
    Unknown,
}

impl SearchVerdict {
    pub fn passes(self) -> bool {
        self == SearchVerdict::Met
    }

    pub fn fails(self) -> bool {
        matches!(self, SearchVerdict::NotMet | SearchVerdict::Saturated)
    }
}

impl fmt::Display for SearchVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SearchVerdict::Met => "met",
            SearchVerdict::NotMet => "not met",
            SearchVerdict::Saturated => "saturated",
            SearchVerdict::Unknown => "unknown (too few)",
        })
    }
}

/// One end of a bracket: a level and the rate it stands for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BracketEnd {
    /// The level's run folder.
    pub dir: String,
    /// Requests/s (see the module doc).
    pub rate: f64,
}

/// The SLO crossing's bracket; an end is `None` until a level on that side has run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bracket {
    pub lower: Option<BracketEnd>,
    pub upper: Option<BracketEnd>,
}

impl Bracket {
    /// upper / lower − 1, when both ends exist.
    pub fn relative_width(&self) -> Option<f64> {
        Some(self.upper.as_ref()?.rate / self.lower.as_ref()?.rate - 1.0)
    }
}

impl fmt::Display for Bracket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = |e: &Option<BracketEnd>| e.as_ref().map_or("–".to_string(), |e| rate(e.rate));
        write!(f, "[{}, {}]", end(&self.lower), end(&self.upper))?;
        if let Some(w) = self.relative_width() {
            write!(f, " (width {:.1}%)", w * 100.0)?;
        }
        Ok(())
    }
}

fn rate(r: f64) -> String {
    let s = format!("{r:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One level of the search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchStep {
    /// The level's run folder.
    pub dir: String,
    pub offered_rate: f64,
    /// The scheduled rate of its measured requests (absent in files written before it was
    /// recorded, and with fewer than two).
    #[serde(default)]
    pub scheduled_rate: Option<f64>,
    /// Its completed rate.
    #[serde(default)]
    pub completed_rate: Option<f64>,
    pub sustained_rate: f64,
    pub reason: StepReason,
    pub verdict: SearchVerdict,
    /// The bracket after this level.
    pub bracket: Bracket,
}

impl SearchStep {
    /// The load the level's schedule held: its scheduled rate, else its offered rate.
    pub fn load_rate(&self) -> f64 {
        self.scheduled_rate.unwrap_or(self.offered_rate)
    }
}

/// Why the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchEnd {
    /// The bracket's upper end is within the precision of its lower end.
    Converged,
    /// `--max-levels` levels ran first.
    MaxLevels,
    /// The probe's concurrency-1 step already missed the SLO.
    NotMetUnloaded,
    /// Halving reached `--min-rate` and the level there failed.
    NotMetAtMinRate,
    /// Doubling reached `--max-rate` and the level there passed.
    MetAtMaxRate,
    /// A re-run with twice the requests was still unknown.
    StillUnknown,
    /// The bracket's mid-point rounds to one of its ends or to a rate already run.
    Unresolved,
    /// Interrupted (Ctrl-C or SIGTERM).
    Interrupted,
}

/// The search as run: its settings, every level in order and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPath {
    /// The bracket is narrow enough when upper ≤ lower × (1 + precision).
    pub precision: f64,
    pub max_levels: usize,
    pub min_rate: f64,
    pub max_rate: f64,
    /// The first level's offered rate.
    pub start_rate: f64,
    pub steps: Vec<SearchStep>,
    pub end: Option<SearchEnd>,
    /// The end in words, with the rates that decided it.
    pub end_reason: Option<String>,
}

impl SearchPath {
    /// The server's throughput ceiling: the highest completed rate of a saturated level.
    pub fn throughput_ceiling(&self) -> Option<f64> {
        self.steps
            .iter()
            .filter(|s| s.verdict == SearchVerdict::Saturated)
            .filter_map(|s| s.completed_rate)
            .reduce(f64::max)
    }

    /// The bracket after the last level (empty before the first).
    pub fn bracket(&self) -> Bracket {
        self.steps
            .last()
            .map(|s| s.bracket.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracket_width_and_display() {
        let end = |rate: f64| {
            Some(BracketEnd {
                dir: "level-00".into(),
                rate,
            })
        };
        let b = Bracket {
            lower: end(5.0),
            upper: end(5.5),
        };
        assert!((b.relative_width().unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(b.to_string(), "[5, 5.5] (width 10.0%)");
        let open = Bracket {
            lower: None,
            upper: end(2.25),
        };
        assert_eq!(open.relative_width(), None);
        assert_eq!(open.to_string(), "[–, 2.25]");
        assert!(SearchVerdict::Saturated.fails() && !SearchVerdict::Unknown.fails());
        assert!(!SearchVerdict::Unknown.passes() && SearchVerdict::Met.passes());
    }
}
