//! `loadgen sweep`: the same seeded workload at a list of offered rates, one level after
//! another, stopping after the first level that saturates or breaks the SLO badly.
//!
//! Layout of the output folder: `sweep.json` (levels and why the sweep stopped, rewritten after
//! every level so a cut-short sweep stays readable) and one run folder per level
//! (`level-00/`, …) as `loadgen run --out` writes it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::metrics::SloMetric;
use reports::plan::SweepLevel;
use reports::render::{write_report, Conditions};
use reports::slo::SloSpec;
use serde::{Deserialize, Serialize};

use crate::cli::{run_command, RunArgs};
use crate::report_cmd::{load_run, sweep_report};

pub const SWEEP_FILE: &str = "sweep.json";
/// A level saturates when it completes fewer than this fraction of the offered requests/s.
pub const SATURATION_FRACTION: f64 = 0.95;
/// A level breaks the SLO badly when an observed percentile exceeds its limit by this factor.
pub const BAD_SLO_FACTOR: f64 = 2.0;

#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Offered rates in requests/s, comma-separated (e.g. 1,2,4,8,16); run in ascending order.
    #[arg(long, value_delimiter = ',', required = true)]
    pub rates: Vec<f64>,
    /// Every `loadgen run` option applies to each level (`--rate` is replaced by each rate;
    /// `--slo` takes percentiles: ttft:p99:500ms,tpot:p99:50ms; `--out` is required).
    #[command(flatten)]
    pub run: RunArgs,
}

/// One level in `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelEntry {
    /// Run folder, relative to the sweep folder.
    pub dir: String,
    pub offered_rate: f64,
    /// Completed requests/s over the measurement window.
    pub achieved_rate: f64,
    pub output_tokens_per_s: f64,
    pub saturated: bool,
    /// `None` without an SLO.
    pub slo_met: Option<bool>,
}

/// `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepFile {
    pub schema_version: u32,
    /// The SLO as given (`--slo`).
    pub slo: Option<String>,
    pub rates: Vec<f64>,
    pub levels: Vec<LevelEntry>,
    /// Why the sweep stopped before the last rate, if it did.
    pub stop_reason: Option<String>,
}

impl SweepFile {
    pub fn read(path: &Path) -> Result<SweepFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid sweep file", path.display()))
    }

    fn write(&self, path: &Path) -> Result<()> {
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
            achieved_rate: entry.achieved_rate,
            output_tokens_per_s: entry.output_tokens_per_s,
            saturated: entry.saturated,
            samples: run.samples,
        });
    }
    let conditions = conditions
        .with_context(|| format!("{}: the sweep has no completed level", dir.display()))?;
    Ok(LoadedSweep {
        file,
        slo,
        levels,
        conditions,
    })
}

/// `ttft:500ms,…`: the SLO limits in the per-request form `loadgen run --slo` takes (goodput).
fn per_request_text(slo: &SloSpec) -> String {
    let parts: Vec<String> = slo
        .targets
        .iter()
        .map(|t| {
            let name = match t.metric {
                SloMetric::Ttft => "ttft",
                SloMetric::Tpot => "tpot",
                SloMetric::E2el => "e2el",
            };
            format!("{name}:{}ms", t.limit_ms)
        })
        .collect();
    parts.join(",")
}

/// `loadgen sweep`.
pub async fn sweep_command(args: SweepArgs) -> Result<()> {
    let out: PathBuf = args
        .run
        .out
        .clone()
        .context("loadgen sweep: --out FOLDER is required")?;
    if args.run.concurrency.is_some() {
        bail!("loadgen sweep: --concurrency (closed loop) cannot be combined with --rates");
    }
    let mut rates = args.rates.clone();
    if let Some(bad) = rates.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        bail!("loadgen sweep: rate {bad} is not a positive number");
    }
    rates.sort_by(f64::total_cmp);
    let slo = args.run.slo.as_deref().map(SloSpec::parse).transpose()?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut file = SweepFile {
        schema_version: 1,
        slo: args.run.slo.clone(),
        rates: rates.clone(),
        levels: Vec::new(),
        stop_reason: None,
    };
    let per_request = slo.as_ref().map(SloSpec::per_request).unwrap_or_default();
    for (i, &rate) in rates.iter().enumerate() {
        let dir = format!("level-{i:02}");
        eprintln!(
            "loadgen sweep: level {}/{} at {rate} req/s → {}",
            i + 1,
            rates.len(),
            out.join(&dir).display()
        );
        let mut run = args.run.clone();
        run.rate = rate;
        run.out = Some(out.join(&dir));
        run.slo = slo.as_ref().map(per_request_text);
        run_command(run).await?;
        let loaded = load_run(&out.join(&dir), &per_request)?;
        let achieved = loaded.metrics.request_throughput;
        let saturated = achieved < SATURATION_FRACTION * rate;
        let check = slo.as_ref().map(|s| s.check(&loaded.samples));
        file.levels.push(LevelEntry {
            dir,
            offered_rate: rate,
            achieved_rate: achieved,
            output_tokens_per_s: loaded.metrics.output_throughput,
            saturated,
            slo_met: check.as_ref().map(|c| c.met),
        });
        let last = i + 1 == rates.len();
        if saturated && !last {
            file.stop_reason = Some(format!(
                "saturated at {rate} req/s: achieved {achieved:.3} req/s < {:.0}% of offered",
                SATURATION_FRACTION * 100.0
            ));
        } else if let Some(c) = check.as_ref().filter(|c| c.worst_ratio() > BAD_SLO_FACTOR) {
            if !last {
                file.stop_reason = Some(format!(
                    "SLO broken badly at {rate} req/s (a percentile at {:.1}× its limit)",
                    c.worst_ratio()
                ));
            }
        }
        file.write(&out.join(SWEEP_FILE))?;
        if let Some(reason) = &file.stop_reason {
            eprintln!("loadgen sweep: stopping: {reason}");
            break;
        }
    }
    for level in &file.levels {
        println!(
            "{:>10.3} req/s offered  {:>10.3} achieved  {:>10.1} tok/s  saturated: {:<3}  SLO met: {}",
            level.offered_rate,
            level.achieved_rate,
            level.output_tokens_per_s,
            if level.saturated { "yes" } else { "no" },
            level.slo_met.map_or("–", |m| if m { "yes" } else { "no" })
        );
    }
    let (_, html) = write_report(&out, &sweep_report(&out)?)?;
    println!(
        "sweep: {}  report: {}",
        out.join(SWEEP_FILE).display(),
        html.display()
    );
    Ok(())
}
