//! `loadgen report DIR`: renders a run, sweep, comparison, tune or matrix folder to
//! `report.md` and a self-contained `report.html`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use reports::render::write_report;

use reports::comparison::compare_view;
use reports::folders::{CompareFile, COMPARE_FILE, SWEEP_FILE};
use reports::matrix::MATRIX_FILE;
use reports::render::views::{matrix_report, run_report, sweep_report, tune_report};
use reports::tune::TUNE_FILE;

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A run folder (records.jsonl + meta.json), a sweep folder (sweep.json), a comparison
    /// folder (compare.json), a tune folder (tune.json) or a matrix folder (matrix.json).
    pub dir: PathBuf,
    /// Where to write report.md / report.html (default: DIR).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `loadgen report`.
pub fn report_command(args: ReportArgs) -> Result<()> {
    let dir = &args.dir;
    let report = if dir.join(MATRIX_FILE).is_file() {
        matrix_report(dir)?
    } else if dir.join(TUNE_FILE).is_file() {
        tune_report(dir)?
    } else if dir.join(COMPARE_FILE).is_file() {
        compare_view(&CompareFile::read(&dir.join(COMPARE_FILE))?)?
    } else if dir.join(SWEEP_FILE).is_file() {
        sweep_report(dir)?
    } else if dir.join("records.jsonl").is_file() {
        run_report(dir)?
    } else {
        bail!(
            "{}: no {MATRIX_FILE}, {TUNE_FILE}, {COMPARE_FILE}, {SWEEP_FILE} or records.jsonl: not a matrix, tune, comparison, sweep or run folder",
            dir.display()
        );
    };
    let out = args.out.as_deref().unwrap_or(dir);
    let (md, html) = write_report(out, &report)?;
    println!("report: {}", html.display());
    println!("        {}", md.display());
    Ok(())
}
