//! `tune.json`: the configurations `loadgen tune` ran (their knob values, the server command,
//! how the server fared, the capacity its knee search found with the crossing's interval, and
//! the numbers at that capacity), the winner and the runner-up, and whether a paired
//! comparison at the runner-up's capacity could tell them apart.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub mod results;

use crate::capacity::CapacityPlan;
use crate::search::SearchPath;

/// Knob name → value, as substituted into the server command.
pub type Knobs = BTreeMap<String, String>;

/// `tune.json`'s file name.
pub const TUNE_FILE: &str = "tune.json";

/// How a configuration's server fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigStatus {
    /// The server started and its knee search ran.
    #[serde(rename = "ok")]
    Ok,
    /// The server exited, or never answered `/health`, before its search began.
    #[serde(rename = "failed to start")]
    FailedToStart,
    /// The server exited during its search.
    #[serde(rename = "died")]
    Died,
    /// The server stayed up but its search failed (for example every request answered
    /// with an error); `log_tail` holds the error and the end of the server's log.
    #[serde(rename = "search failed")]
    SearchFailed,
    /// Ctrl-C or SIGTERM stopped the tune during this configuration.
    #[serde(rename = "interrupted")]
    Interrupted,
}

/// One level of a configuration's search, for the throughput-vs-interactivity chart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelPoint {
    pub offered_rate: f64,
    pub sustained_rate: f64,
    /// Output tokens/s over the level's window, all requests together.
    pub output_tok_per_s: f64,
    /// Output tokens/s one request sees: 1000 / its median TPOT (ms).
    pub per_user_tok_per_s: Option<f64>,
    /// Met the SLO and did not saturate.
    pub passed: bool,
}

/// One configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Configuration {
    pub knobs: Knobs,
    /// The server command with the knobs filled in (`{port}` left as is).
    pub command: String,
    /// Its folder, relative to the tune's: `server.log` and the search's `sweep/`.
    pub dir: String,
    pub status: ConfigStatus,
    /// The last lines of the server's log, when it failed to start or died.
    pub log_tail: Option<String>,
    /// Requests/s: the sustained rate of the highest level that met the SLO (the knee
    /// search's lower bracket end); `None` when the search found none.
    pub capacity: Option<f64>,
    /// Where the SLO crossing lies: the search's final bracket, from the highest level that
    /// met the SLO (its sustained rate, `capacity`) to the lowest that did not above it.
    pub capacity_low: Option<f64>,
    pub capacity_high: Option<f64>,
    /// The crossing interpolated inside the bracket, with its bootstrap interval (which
    /// resamples the two boundary levels' requests, not their seeded schedules, and so is
    /// narrower than the bracket's own uncertainty).
    pub crossing: Option<crate::stats::ConfidenceInterval>,
    /// With `--repeats`: the crossing's Student t-interval over the runs' own crossings, run
    /// to run included (`None` with fewer than two runs that bracketed one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crossing_between_runs: Option<crate::stats::ConfidenceInterval>,
    /// With `--repeats`: each run's own crossing, the search's first (`None`: that run
    /// bracketed none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_crossings: Vec<Option<f64>>,
    /// The offered rate of the level that sustained `capacity`.
    pub capacity_offered_rate: Option<f64>,
    /// The SLO's highest percentile, at which `ttft_ms` and `tpot_ms` are given.
    pub latency_percentile: f64,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub output_tok_per_s: Option<f64>,
    /// The server's mean running requests and max KV-cache use at capacity, when scraped.
    pub server_running_mean: Option<f64>,
    pub server_kv_usage_max: Option<f64>,
    /// Why its search ended.
    pub search_end: Option<String>,
    /// The search's levels.
    pub search: Option<SearchPath>,
    pub levels: Vec<LevelPoint>,
}

impl Configuration {
    /// A configuration about to run: status ok, nothing measured yet.
    pub fn new(knobs: Knobs, command: String, dir: String, latency_percentile: f64) -> Self {
        Configuration {
            knobs,
            command,
            dir,
            status: ConfigStatus::Ok,
            log_tail: None,
            capacity: None,
            capacity_low: None,
            capacity_high: None,
            crossing: None,
            crossing_between_runs: None,
            run_crossings: Vec::new(),
            capacity_offered_rate: None,
            latency_percentile,
            ttft_ms: None,
            tpot_ms: None,
            output_tok_per_s: None,
            server_running_mean: None,
            server_kv_usage_max: None,
            search_end: None,
            search: None,
            levels: Vec::new(),
        }
    }
}

/// A configuration named by its knobs and command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pick {
    pub knobs: Knobs,
    pub command: String,
}

/// The winner against the runner-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Separation {
    /// An SLO metric is significantly better for the winner beyond `--min-effect`, none worse;
    /// with `--repeats`, its runs' crossings also exceed the runner-up's beyond their spread.
    #[serde(rename = "better")]
    Better,
    /// No such difference at this precision (or, with `--repeats`, one the runs' crossings do
    /// not bear out): the configuration whose values come first in the knob lists is the
    /// winner.
    #[serde(rename = "indistinguishable")]
    Indistinguishable,
    /// Fewer than two configurations met the SLO, or the comparison could not run.
    #[serde(rename = "not compared")]
    NotCompared,
}

/// The paired comparison of the two best configurations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Duel {
    /// The offered rate both ran at: the runner-up's at its capacity.
    pub offered_rate: f64,
    /// Its folder (`compare.json`, the rounds), relative to the tune's; A is the
    /// higher-capacity configuration, B the other.
    pub dir: String,
    /// Per SLO metric: the verdict of B against A ("B slower", "equivalent", …).
    pub verdicts: Vec<(String, String)>,
    /// Why the comparison did not run, when it did not.
    pub error: Option<String>,
}

/// One step of a guided tune: the regime read at the failing end of a configuration's knee
/// search, the knob it moved (from one value to the next in the regime's direction), and
/// whether the move was kept; a step without a knob is where the walk stopped, `why` says
/// why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneStep {
    /// The configuration the step starts from.
    pub knobs: Knobs,
    /// Its folder, relative to the tune's.
    pub base: String,
    /// The regime of its search's failing bracket end (the lowest rate that broke the SLO).
    pub regime: Option<crate::diagnosis::Regime>,
    pub evidence: String,
    pub knob: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    /// Whether the move improved the capacity beyond its interval; `None` while its
    /// configuration runs, and for a step that moved nothing.
    pub kept: Option<bool>,
    pub why: String,
}

/// `tune.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneFile {
    pub schema_version: u32,
    pub slo: String,
    /// `one-at-a-time` or `grid`.
    pub strategy: String,
    pub template: String,
    /// The knobs in the order given, each with its values in the order given.
    pub knobs: Vec<(String, Vec<String>)>,
    pub winner: Option<Pick>,
    pub runner_up: Option<Pick>,
    pub winner_vs_runner_up: Separation,
    /// With `--repeats`: whether the winner's capacity exceeds the runner-up's beyond the
    /// between-run spread of their crossings (Welch's t-test), in words; "better" needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between_runs: Option<String>,
    pub duel: Option<Duel>,
    pub configurations: Vec<Configuration>,
    /// `--strategy guided`: each step of the walk, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<TuneStep>,
    /// The capacity plan from the winner's search.
    pub plan: Option<CapacityPlan>,
    /// Why the tune ended early, when it did.
    pub stop_reason: Option<String>,
}

impl TuneFile {
    pub fn read(path: &Path) -> Result<TuneFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid tune file", path.display()))
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The index of each knob value of `knobs` in the lists given: configurations are
    /// ordered by these (the user orders values by cost).
    pub fn value_order(&self, knobs: &Knobs) -> Vec<usize> {
        self.knobs
            .iter()
            .map(|(name, values)| {
                knobs
                    .get(name)
                    .and_then(|v| values.iter().position(|x| x == v))
                    .unwrap_or(usize::MAX)
            })
            .collect()
    }
}
