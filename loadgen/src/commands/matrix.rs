//! `loadgen matrix`: `--write` the preset, or run the matrix (`experiments::matrix`), then
//! the `--fail-on-refuted` gate.

use std::path::Path;

use anyhow::{bail, Context, Result};
use reports::matrix::Verdict;

use crate::experiments::matrix::run_matrix;
use crate::run::stop::stop_on_signals;
use crate::spec::matrix::MatrixArgs;
use crate::spec::matrix_toml::METHODOLOGY_PRESET;

/// `loadgen matrix`.
pub async fn matrix_command(args: MatrixArgs) -> Result<()> {
    if let Some(path) = &args.write {
        return write_preset(&args, path);
    }
    let file = run_matrix(&args, stop_on_signals()?).await?;
    let refuted: Vec<&str> = file
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Refuted)
        .map(|r| r.name.as_str())
        .collect();
    if args.fail_on_refuted && !refuted.is_empty() {
        return Err(crate::gate::Gate {
            code: crate::gate::SLO_NOT_MET,
            message: format!("loadgen matrix: refuted: {}", refuted.join(", ")),
        }
        .into());
    }
    Ok(())
}

/// `--write`: the preset to a file, nothing run.
fn write_preset(args: &MatrixArgs, path: &Path) -> Result<()> {
    let mut ignored: Vec<String> = args.defaults.clone();
    if args.run.out.is_some() {
        ignored.push("--out".into());
    }
    if args.scale != 1.0 {
        ignored.push("--scale".into());
    }
    if args.server_cmd.is_some() {
        ignored.push("--server-cmd".into());
    }
    if args.gpu_hour_usd.is_some() {
        ignored.push("--gpu-hour-usd".into());
    }
    if args.repeats != 1 {
        ignored.push("--repeats".into());
    }
    if !ignored.is_empty() {
        bail!(
            "--write writes the preset's rows and runs nothing: {} would be ignored; give them when running the file",
            ignored.join(", ")
        );
    }
    if path.exists() {
        bail!(
            "--write {}: the file exists; remove it or name another",
            path.display()
        );
    }
    std::fs::write(path, METHODOLOGY_PRESET)
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wrote the methodology matrix (6 rows) to {}",
        path.display()
    );
    Ok(())
}
