//! `loadgen report DIR`: renders a run, sweep or comparison folder to `report.md` and a
//! self-contained `report.html`. Also the loaders the sweep, plan and compare commands share.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::metrics::{compute, Metrics, MetricsOptions, Slo};
use reports::plan::CapacityPlan;
use reports::records::{read_meta, read_records, RunMeta};
use reports::render::{write_report, Conditions, Report, ReportBody, RunView, SweepView};
use reports::samples::LatencySamples;

use crate::compare::{compare_view, CompareFile, COMPARE_FILE};
use crate::sweep::{load_sweep, SWEEP_FILE};

/// File the capacity plan is written to, beside `sweep.json`.
pub const PLAN_FILE: &str = "plan.json";

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A run folder (records.jsonl + meta.json), a sweep folder (sweep.json) or a comparison
    /// folder (compare.json).
    pub dir: PathBuf,
    /// Where to write report.md / report.html (default: DIR).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One run folder, loaded.
pub struct LoadedRun {
    pub meta: RunMeta,
    pub metrics: Metrics,
    pub samples: LatencySamples,
}

/// Loads `records.jsonl` and `meta.json` from `dir` and computes its metrics.
pub fn load_run(dir: &Path, slos: &[Slo]) -> Result<LoadedRun> {
    let meta = read_meta(&dir.join("meta.json"))?;
    let records = read_records(&dir.join("records.jsonl"))?;
    let metrics = compute(
        &records,
        &MetricsOptions {
            slos: slos.to_vec(),
            open_loop: true,
        },
    );
    Ok(LoadedRun {
        meta,
        metrics,
        samples: LatencySamples::from_records(&records),
    })
}

/// `loadgen report`.
pub fn report_command(args: ReportArgs) -> Result<()> {
    let dir = &args.dir;
    let report = if dir.join(COMPARE_FILE).is_file() {
        let file = CompareFile::read(&dir.join(COMPARE_FILE))?;
        compare_view(&file)?
    } else if dir.join(SWEEP_FILE).is_file() {
        sweep_report(dir)?
    } else if dir.join("records.jsonl").is_file() {
        let run = load_run(dir, &[])?;
        Report {
            title: format!("Run {}", dir.display()),
            conditions: Conditions::from_meta(&run.meta),
            body: ReportBody::Run(Box::new(RunView {
                metrics: run.metrics,
                samples: run.samples,
            })),
        }
    } else {
        bail!(
            "{}: no {COMPARE_FILE}, {SWEEP_FILE} or records.jsonl: not a comparison, sweep or run folder",
            dir.display()
        );
    };
    let out = args.out.as_deref().unwrap_or(dir);
    let (md, html) = write_report(out, &report)?;
    println!("report: {}", html.display());
    println!("        {}", md.display());
    Ok(())
}

/// The report of a sweep folder, with its capacity plan when `plan.json` exists.
pub fn sweep_report(dir: &Path) -> Result<Report> {
    let sweep = load_sweep(dir)?;
    let plan_path = dir.join(PLAN_FILE);
    let plan: Option<CapacityPlan> = if plan_path.is_file() {
        let text = std::fs::read_to_string(&plan_path)
            .with_context(|| format!("reading {}", plan_path.display()))?;
        Some(
            serde_json::from_str(&text)
                .with_context(|| format!("{}: invalid capacity plan", plan_path.display()))?,
        )
    } else {
        None
    };
    Ok(Report {
        title: format!("Sweep {}", dir.display()),
        conditions: sweep.conditions,
        body: ReportBody::Sweep(SweepView {
            levels: sweep.levels,
            slo: sweep.slo,
            plan,
        }),
    })
}
