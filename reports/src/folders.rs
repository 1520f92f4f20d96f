//! The folder formats every command reads and writes: a run folder (`records.jsonl`,
//! `meta.json`, `schedule.jsonl`), a sweep folder (`sweep.json`, `plan.json` and one run folder
//! per level) and a comparison folder (`compare.json` and `round-KK-a` / `round-KK-b` runs).

use std::path::{Path, PathBuf};

use crate::ab::AbReport;
use crate::bound::BoundInputs;
use crate::capacity::{CapacityPlan, SweepLevel};
use crate::conditions::Conditions;
use crate::diagnosis::{diagnose, Observation};
use crate::metrics::{compute, Metrics, MetricsOptions, Slo};
use crate::records::{read_meta, read_records, Phase, RequestRecord, RunMeta};
use crate::samples::LatencySamples;
use crate::server_metrics::{read_scrapes, window_hit_rate, Scrape, ServerView};
use crate::slo::{SloCheck, SloSpec};
use crate::stats::Bootstrap;
use crate::summary::Summary;
use crate::timeline::PhaseBounds;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::saturation::{judge, Backlog, JudgeContext, LevelRates, Saturation, SaturationState};

pub const SWEEP_FILE: &str = "sweep.json";
/// The capacity plan of a sweep, beside `sweep.json`.
pub const PLAN_FILE: &str = "plan.json";
pub const COMPARE_FILE: &str = "compare.json";

/// One run folder, loaded.
pub struct LoadedRun {
    pub meta: RunMeta,
    /// The server's own view, from `server_metrics.jsonl` when the run scraped one.
    pub server: Option<ServerView>,
    pub metrics: Metrics,
    pub samples: LatencySamples,
    /// Results by class, when its requests have classes.
    pub classes: Vec<crate::classes::ClassStats>,
}

/// Loads `records.jsonl` and `meta.json` from `dir` and computes its metrics.
pub fn load_run(dir: &Path, slos: &[Slo]) -> Result<LoadedRun> {
    let meta = read_meta(&dir.join("meta.json"))?;
    let records = read_records(&dir.join("records.jsonl"))?;
    // The client's CPU share is measured during the run only; a run cut short has no summary.
    let summary_path = dir.join("summary.json");
    let client_cpu = if summary_path.is_file() {
        Summary::read(&summary_path)?.client_cpu
    } else {
        None
    };
    let opts = MetricsOptions {
        slos: slos.to_vec(),
        open_loop: meta.schedule["mode"] != "closed",
        client_cpu,
    };
    let metrics = compute(&records, &opts);
    let classes = crate::classes::of(&records, &opts, metrics.duration_s);
    let scrapes = read_scrapes(dir)?;
    let server = ServerView::from_scrapes(&scrapes).map(|mut view| {
        view.window_prefix_cache = measured_window_unix_ms(&meta, &records)
            .and_then(|(start, end)| window_hit_rate(&scrapes, start, end));
        view
    });
    Ok(LoadedRun {
        server,
        meta,
        classes,
        metrics,
        samples: LatencySamples::from_records(&records),
    })
}

/// The run's origin, the instant its records' milliseconds count from (Unix ms).
pub fn run_origin_unix_ms(meta: &RunMeta) -> Option<f64> {
    Some(
        chrono::DateTime::parse_from_rfc3339(&meta.start_time)
            .ok()?
            .timestamp_micros() as f64
            / 1000.0,
    )
}

/// The measurement window in Unix ms: the first measured send to the last measured end.
pub fn measured_window_unix_ms(meta: &RunMeta, records: &[RequestRecord]) -> Option<(f64, f64)> {
    let origin = run_origin_unix_ms(meta)?;
    let measured = records.iter().filter(|r| r.phase == Phase::Measured);
    let start = measured.clone().map(|r| r.sent_ms).reduce(f64::min)?;
    let end = measured.map(|r| r.end_ms).reduce(f64::max)?;
    Some((origin + start, origin + end))
}

/// The scrapes in `dir` taken inside the run's measured window (a warm-up's or the idle
/// tail's scrapes would dilute the server's view of it).
pub fn window_scrapes(
    dir: &Path,
    meta: &RunMeta,
    records: &[RequestRecord],
) -> Result<Vec<Scrape>> {
    let scrapes = read_scrapes(dir)?;
    Ok(match measured_window_unix_ms(meta, records) {
        Some((start, end)) => scrapes
            .into_iter()
            .filter(|s| (start..=end).contains(&s.unix_ms))
            .collect(),
        None => scrapes,
    })
}

/// One level in `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelEntry {
    /// Run folder, relative to the sweep folder.
    pub dir: String,
    /// The offered rate (see `crate::rates`).
    pub offered_rate: f64,
    /// The completed rate of the level's measured requests.
    #[serde(alias = "achieved_rate")]
    pub completed_rate: f64,
    pub output_tokens_per_s: f64,
    /// Saturated by `crate::saturation::judge`.
    pub saturated: bool,
    /// Scheduled and completed rates over the same requests (see [`level_rates`]).
    #[serde(default)]
    pub rates: Option<LevelRates>,
    /// Requests in flight over the level (see [`backlog_trend`]).
    #[serde(default)]
    pub backlog: Option<Backlog>,
    /// Met by the level's bounded percentiles; `None` without an SLO.
    pub slo_met: Option<bool>,
    /// Met, not met, or unknown (too few requests to bound a percentile); `None` without
    /// an SLO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_verdict: Option<crate::slo::SloVerdict>,
    /// The saturation verdict and the rule that decided it.
    #[serde(default)]
    pub saturation: Option<Saturation>,
    /// The level's warm-up and the rule that set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<LevelWarmup>,
    /// With `--repeats`: which repeat of its rate this level is (1 to R − 1); absent for
    /// the search's own levels and a list's first pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<usize>,
}

/// A level's warm-up: how long, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelWarmup {
    pub secs: f64,
    pub rule: String,
}

impl LevelEntry {
    /// The entry of the level at `rate` whose run folder is `sweep_dir/dir`: its rates,
    /// saturation verdict and (with `slo`) SLO check, also returned.
    pub fn measure(
        sweep_dir: &Path,
        dir: String,
        rate: f64,
        slo: Option<&SloSpec>,
    ) -> Result<(LevelEntry, Option<SloCheck>)> {
        let per_request = slo.map(SloSpec::per_request).unwrap_or_default();
        let loaded = load_run(&sweep_dir.join(&dir), &per_request)?;
        let run_dir = sweep_dir.join(&dir);
        let records = read_records(&run_dir.join("records.jsonl"))?;
        let scrapes = window_scrapes(&run_dir, &loaded.meta, &records)?;
        let context = JudgeContext::new(&scrapes, run_origin_unix_ms(&loaded.meta));
        let saturation = judge(&records, &context);
        let check = slo.map(|s| s.check(&loaded.samples));
        let entry = LevelEntry {
            dir,
            offered_rate: rate,
            completed_rate: crate::rates::completed(
                &records
                    .iter()
                    .filter(|r| r.phase == Phase::Measured)
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(0.0),
            output_tokens_per_s: loaded.metrics.output_throughput,
            saturated: saturation.state == SaturationState::Saturated,
            rates: saturation.rates,
            backlog: saturation.backlog,
            slo_met: check.as_ref().map(|c| c.met),
            slo_verdict: check.as_ref().map(|c| c.verdict),
            saturation: Some(saturation),
            warmup: None,
            repeat: None,
        };
        Ok((entry, check))
    }
}

/// One closed-loop probe step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeStep {
    pub concurrency: usize,
    pub completed: u64,
    pub failed: u64,
    /// Completed requests/s over the measurement window.
    pub throughput: f64,
    pub mean_e2el_ms: f64,
    /// Little's law: concurrency / mean E2E latency, requests/s.
    pub little_rate: f64,
    /// The SLO's verdict on the step's requests, when the sweep has an SLO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_verdict: Option<crate::slo::SloVerdict>,
    /// A target's percentile lies above its limit beyond doubt (its 95% interval's lower
    /// end), which a step too short to bound it from above can still show.
    #[serde(default)]
    pub slo_missed: bool,
}

/// The saturation probe of `--rates auto` and `search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub steps: Vec<ProbeStep>,
    /// The highest Little's-law rate of the steps (at the knee).
    pub saturation_rate: f64,
    pub knee_concurrency: usize,
    /// `--auto-fractions`, with `--rates auto`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fractions: Vec<f64>,
    /// Why the probe stopped.
    pub stop_reason: String,
}

/// `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepFile {
    pub schema_version: u32,
    /// The SLO as given (`--slo`).
    pub slo: Option<String>,
    pub rates: Vec<f64>,
    /// The saturation probe, with `--rates auto` or `search`.
    #[serde(default)]
    pub probe: Option<Probe>,
    /// The knee search's path, with `--rates search`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<crate::search::SearchPath>,
    /// `--repeats`: how many runs each repeated level has, its first included.
    #[serde(default = "one")]
    pub repeats: usize,
    pub levels: Vec<LevelEntry>,
    /// Why the sweep stopped before the last rate, or why the search ended.
    pub stop_reason: Option<String>,
}

fn one() -> usize {
    1
}

impl SweepFile {
    pub fn read(path: &Path) -> Result<SweepFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid sweep file", path.display()))
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// A sweep folder, loaded.
pub struct LoadedSweep {
    pub file: SweepFile,
    pub slo: Option<SloSpec>,
    pub levels: Vec<SweepLevel>,
    pub conditions: Conditions,
}

/// Reads `sweep.json` and every level's records.
pub fn load_sweep(dir: &Path) -> Result<LoadedSweep> {
    let file = SweepFile::read(&dir.join(SWEEP_FILE))?;
    let slo = file.slo.as_deref().map(SloSpec::parse).transpose()?;
    let per_request = slo.as_ref().map(SloSpec::per_request).unwrap_or_default();
    let mut levels = Vec::new();
    let mut conditions = None;
    for entry in &file.levels {
        let run = load_run(&dir.join(&entry.dir), &per_request)
            .with_context(|| format!("sweep level {}", entry.dir))?;
        if conditions.is_none() {
            let mut c = Conditions::from_meta(&run.meta);
            c.schedule = format!(
                "sweep over offered rates {:?} req/s; each level: {}",
                file.rates, c.schedule
            );
            conditions = Some(c);
        }
        levels.push(SweepLevel {
            offered_rate: entry.offered_rate,
            completed_rate: entry.completed_rate,
            output_tokens_per_s: entry.output_tokens_per_s,
            saturated: entry.saturated,
            samples: run.samples,
            server: run.server,
            timeline: crate::timeline::Timeline::read(&dir.join(&entry.dir))?,
            scheduled_rate: entry.rates.map(|r| r.scheduled),
            saturation_rule: entry.saturation.as_ref().map(|s| s.rule.clone()),
            diagnosis: run_diagnosis(&dir.join(&entry.dir))?,
            repeat: entry.repeat,
        });
    }
    let conditions = conditions.with_context(|| {
        let why = file
            .stop_reason
            .as_deref()
            .map_or(String::new(), |r| format!(" ({r})"));
        format!("{}: the sweep has no completed level{why}", dir.display())
    })?;
    Ok(LoadedSweep {
        file,
        slo,
        levels,
        conditions,
    })
}

/// The diagnosis of a finished run (`diagnosis`): its records and metrics, the server's
/// gauges scraped into its folder during the measurement window (a warm-up's or the idle
/// tail's scrapes would dilute the running batch), its SLO and the bound's inputs resolved
/// at its start, written into `summary.json` as `regime`, `regime_evidence` and `diagnosis`.
fn diagnose_run(
    dir: &Path,
    records: &[RequestRecord],
    metrics: &Metrics,
    slo: Option<&SloSpec>,
    inputs: &BoundInputs,
    summary: &mut Summary,
) -> Result<()> {
    let meta = read_meta(&dir.join("meta.json"))?;
    let scrapes = window_scrapes(dir, &meta, records)?;
    let server = ServerView::from_scrapes(&scrapes);
    // A closed loop cannot outrun its server: only an open-loop run saturates.
    let saturation = judge(
        records,
        &JudgeContext::new(&scrapes, run_origin_unix_ms(&meta)),
    );
    let open_loop = meta.schedule["mode"] != "closed";
    let saturated = (open_loop && saturation.state == SaturationState::Saturated)
        .then_some(saturation.rule.as_str());
    let mut diagnosis = diagnose(&Observation {
        records,
        server: server.as_ref(),
        slo,
        bound_inputs: inputs,
        completed_rate: Some(metrics.request_throughput),
        output_tok_per_s: metrics.output_throughput,
        client_bound_reasons: &metrics.client_bound_reasons,
        saturated,
    });
    diagnosis.knob_flags = meta
        .server_version
        .as_deref()
        .and_then(crate::knob_roles::server_kind)
        .and_then(|kind| crate::knob_roles::knob_flags(diagnosis.regime, kind));
    summary.regime = Some(diagnosis.regime);
    summary.regime_evidence = Some(diagnosis.evidence.clone());
    summary.diagnosis = Some(diagnosis);
    Ok(())
}

/// A run's end as loadgen measured it, for [`finish_run`].
pub struct RunEnd<'a> {
    pub records: &'a [RequestRecord],
    pub metrics: &'a Metrics,
    /// The run's phases, seconds from its start.
    pub phases: PhaseBounds,
    /// The run's start (t = 0), Unix milliseconds.
    pub origin_unix_ms: f64,
    /// `--slice`, seconds; `None`: the timeline's default.
    pub slice_s: Option<f64>,
    pub slo: Option<&'a SloSpec>,
    pub bound_inputs: &'a BoundInputs,
}

/// Writes the rest of a run folder once its requests have ended and its scrapes are on
/// disk: `timeline.json` (the records in slices beside the scrapes), the diagnosis into
/// `summary`, and `summary.json`.
pub fn finish_run(dir: &Path, end: &RunEnd, summary: &mut Summary) -> Result<()> {
    let scrapes = read_scrapes(dir)?;
    crate::timeline::build(
        end.records,
        end.phases,
        end.slice_s,
        &scrapes,
        end.origin_unix_ms,
    )
    .write(dir)?;
    diagnose_run(
        dir,
        end.records,
        end.metrics,
        end.slo,
        end.bound_inputs,
        summary,
    )?;
    summary.write(&dir.join("summary.json"))
}

/// The diagnosis a run folder's `summary.json` holds, if any.
pub fn run_diagnosis(dir: &Path) -> Result<Option<crate::diagnosis::Diagnosis>> {
    let path = dir.join("summary.json");
    if !path.is_file() {
        return Ok(None);
    }
    Ok(Summary::read(&path)?.diagnosis)
}

/// The capacity plan written by `loadgen plan` into a sweep folder, if there is one.
pub fn read_plan(dir: &Path) -> Result<Option<CapacityPlan>> {
    let path = dir.join(PLAN_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let plan = serde_json::from_str(&text)
        .with_context(|| format!("{}: invalid capacity plan", path.display()))?;
    Ok(Some(plan))
}

/// `compare.json`: the inputs (so the report can be rebuilt) and the verdicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareFile {
    pub schema_version: u32,
    /// Run folders of each side, one per round, in round order.
    pub a_rounds: Vec<PathBuf>,
    pub b_rounds: Vec<PathBuf>,
    pub pair_by_id: bool,
    pub alpha: f64,
    /// The smallest effect that matters, as a fraction of A's median.
    #[serde(default = "default_min_effect")]
    pub min_effect: f64,
    pub bootstrap: Bootstrap,
    pub analysis: AbReport,
}

fn default_min_effect() -> f64 {
    crate::ab::DEFAULT_MIN_EFFECT
}

impl CompareFile {
    pub fn read(path: &Path) -> Result<CompareFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid comparison file", path.display()))
    }
}

/// Which side of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn suffix(self) -> &'static str {
        match self {
            Side::A => "a",
            Side::B => "b",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// The folder of one online round.
pub fn round_dir(out: &Path, round: usize, side: Side) -> PathBuf {
    out.join(format!("round-{round:02}-{}", side.suffix()))
}

fn round_folders(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("round-"))
                && p.join("records.jsonl").is_file()
        })
        .collect();
    found.sort();
    Ok(found)
}

fn is_side_round(path: &Path, side: Side) -> bool {
    path.file_name().is_some_and(|n| {
        n.to_string_lossy()
            .ends_with(&format!("-{}", side.suffix()))
    })
}

/// The run folders of one side: `dir` itself, or its `round-*` subfolders in name order.
pub fn side_rounds(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("records.jsonl").is_file() {
        return Ok(vec![dir.canonicalize()?]);
    }
    let found = round_folders(dir)?;
    if found.is_empty() {
        bail!(
            "{}: neither a run folder (records.jsonl) nor a folder of round-* runs",
            dir.display()
        );
    }
    if found.iter().any(|p| is_side_round(p, Side::A))
        && found.iter().any(|p| is_side_round(p, Side::B))
    {
        bail!(
            "{}: an online comparison's folder (round-KK-a and round-KK-b): give it alone, \
             `loadgen compare {}`",
            dir.display(),
            dir.display()
        );
    }
    found.iter().map(|p| Ok(p.canonicalize()?)).collect()
}

/// Both sides' run folders of an online comparison's folder.
pub fn online_rounds(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let found = round_folders(dir)?;
    let side = |s: Side| -> Result<Vec<PathBuf>> {
        found
            .iter()
            .filter(|p| is_side_round(p, s))
            .map(|p| Ok(p.canonicalize()?))
            .collect()
    };
    let (a, b) = (side(Side::A)?, side(Side::B)?);
    if a.is_empty() || b.is_empty() {
        bail!(
            "{}: expected round-KK-a and round-KK-b run folders (an online comparison), or give \
             two folders A_DIR B_DIR",
            dir.display()
        );
    }
    Ok((a, b))
}

/// Whether two run folders sent the same requests: byte-identical `schedule.jsonl` files,
/// the same `--extra-body` in their `meta.json`, and no sessions (whose later turns carry
/// each server's own answers).
pub fn same_requests(a: &Path, b: &Path) -> bool {
    let shape = |dir: &Path| {
        read_meta(&dir.join("meta.json"))
            .map(|m| (m.extra_body, m.schedule["unit"] == "sessions"))
            .ok()
    };
    match (
        std::fs::read(a.join("schedule.jsonl")),
        std::fs::read(b.join("schedule.jsonl")),
    ) {
        (Ok(x), Ok(y)) => {
            let (sa, sb) = (shape(a), shape(b));
            x == y && sa == sb && sa.is_some_and(|(_, sessions)| !sessions)
        }
        _ => false,
    }
}
