//! The reports of a run folder and a sweep folder (a comparison's is in `comparison`).

use std::path::Path;

use anyhow::Result;
use reports::render::{Conditions, Report, ReportBody, RunView, SweepView};

use crate::folders::{load_run, load_sweep, read_plan};

/// The report of a run folder.
pub fn run_report(dir: &Path) -> Result<Report> {
    let run = load_run(dir, &[])?;
    Ok(Report {
        title: format!("Run {}", dir.display()),
        conditions: Conditions::from_meta(&run.meta),
        body: ReportBody::Run(Box::new(RunView {
            metrics: run.metrics,
            samples: run.samples,
            server: run.server,
            timeline: reports::timeline::Timeline::read(dir)?,
        })),
    })
}

/// The report of a sweep folder, with its capacity plan when `plan.json` exists.
pub fn sweep_report(dir: &Path) -> Result<Report> {
    let sweep = load_sweep(dir)?;
    Ok(Report {
        title: format!("Sweep {}", dir.display()),
        conditions: sweep.conditions,
        body: ReportBody::Sweep(SweepView {
            levels: sweep.levels,
            slo: sweep.slo,
            plan: read_plan(dir)?,
            search: sweep.file.search.clone(),
        }),
    })
}
