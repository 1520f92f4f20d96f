//! `loadgen report DIR`: renders a run, sweep, comparison, tune or matrix folder to
//! `report.md` and a self-contained `report.html`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
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
    /// Also write CSV: a run folder's `records.csv` (one row per request, its record's
    /// fields flattened), a sweep folder's `levels.csv` (one row per level: rates,
    /// percentiles, regime) and each level's `records.csv`.
    #[arg(long)]
    pub csv: bool,
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
    if args.csv {
        write_csv(dir, out)?;
    }
    let (md, html) = write_report(out, &report)?;
    println!("report: {}", html.display());
    println!("        {}", md.display());
    Ok(())
}

/// `--csv`: a run folder's records, or a sweep folder's levels and each level's records.
fn write_csv(dir: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    if dir.join(SWEEP_FILE).is_file() {
        let sweep = reports::folders::load_sweep(dir)?;
        let levels = out.join("levels.csv");
        let dirs: Vec<String> = sweep.file.levels.iter().map(|l| l.dir.clone()).collect();
        reports::csv_export::write_levels(&sweep.levels, &dirs, &levels)?;
        println!("csv:    {}", levels.display());
        for entry in &sweep.file.levels {
            let level = dir.join(&entry.dir);
            let records = reports::records::read_records(&level.join("records.jsonl"))?;
            let target = out.join(&entry.dir);
            std::fs::create_dir_all(&target)
                .with_context(|| format!("creating {}", target.display()))?;
            reports::csv_export::write_records(&records, &target.join("records.csv"))?;
        }
        return Ok(());
    }
    if dir.join("records.jsonl").is_file() && !dir.join(COMPARE_FILE).is_file() {
        let records = reports::records::read_records(&dir.join("records.jsonl"))?;
        let path = out.join("records.csv");
        reports::csv_export::write_records(&records, &path)?;
        println!("csv:    {}", path.display());
        return Ok(());
    }
    bail!(
        "--csv exports a run folder (records.jsonl) or a sweep folder (sweep.json); {} is neither",
        dir.display()
    )
}
