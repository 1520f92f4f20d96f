//! The reports of a run folder, a sweep folder, a tune folder and a matrix folder (a
//! comparison's is in `crate::comparison`).

use std::path::Path;

use super::{Conditions, Report, ReportBody, RunView, SweepView};
use crate::folders::{load_run, load_sweep, read_plan};
use anyhow::Result;

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
            timeline: crate::timeline::Timeline::read(dir)?,
            diagnosis: crate::folders::run_diagnosis(dir)?,
            classes: run.classes,
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

/// The report of a tune folder: its configurations (`tune.json`), under the conditions of
/// its first configuration that ran a search.
pub fn tune_report(dir: &Path) -> Result<Report> {
    let file = crate::tune::TuneFile::read(&dir.join(crate::tune::TUNE_FILE))?;
    let mut conditions = file
        .configurations
        .iter()
        .map(|c| dir.join(&c.dir).join("sweep"))
        .find_map(|sweep| load_sweep(&sweep).ok())
        .map(|s| s.conditions)
        .unwrap_or_default();
    conditions.schedule = format!(
        "tune ({}): a fresh server and a knee search (sweep --rates search) per \
         configuration, each level open-loop at the rate the search chose",
        file.strategy
    );
    conditions.server = format!("started per configuration from `{}`", file.template);
    Ok(Report {
        title: format!("Tune {}", dir.display()),
        conditions,
        body: ReportBody::Tune(Box::new(file)),
    })
}

/// The report of a matrix folder: `matrix.json`, then each row's run or sweep report, under
/// the conditions of its first row that ran.
pub fn matrix_report(dir: &Path) -> Result<Report> {
    let file = crate::matrix::MatrixFile::read(&dir.join(crate::matrix::MATRIX_FILE))?;
    let reports: Vec<Result<Report, String>> = file
        .rows
        .iter()
        .map(|row| {
            if let Some(error) = &row.error {
                return Err(error.clone());
            }
            let folder = dir.join(&row.folder);
            let report = if row.capacity.is_some() {
                sweep_report(&folder)
            } else {
                run_report(&folder)
            };
            report.map_err(|e| format!("{e:#}"))
        })
        .collect();
    let mut conditions = reports
        .iter()
        .flatten()
        .next()
        .map(|r| r.conditions.clone())
        .unwrap_or_default();
    conditions.workload = format!("{} rows, each its own (see each row)", file.rows.len());
    conditions.schedule = "each row its own load, one row after another".into();
    conditions.server = file.server.clone();
    Ok(Report {
        title: format!("Matrix {}", dir.display()),
        conditions,
        body: ReportBody::Matrix(Box::new(super::MatrixView { file, reports })),
    })
}
