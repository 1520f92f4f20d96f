//! `loadgen matrix`: a benchmark run as an experiment. Each `[[row]]` of the matrix file (see
//! `spec::matrix_toml`) is a workload with its question, hypothesis and expectations; the rows run
//! one after another against one server (`--url`, or `--server-cmd` started once), each into
//! its own run folder (a knee-search row: its sweep folder), and each expectation is decided
//! by the row's intervals (`reports::matrix`).
//!
//! Layout of `--out`: `matrix.json` (rewritten after every row, so a cut-short matrix keeps
//! what ran), `row-NN-NAME/` per row (with `prefix-warmup/` for a warm row; with `--repeats`,
//! the later runs in `row-NN-NAME/repeat-K/`), `server.log` with `--server-cmd`, and the
//! report: one line per row, then each row's own report.

mod row_run;
mod rows;
mod warm;

use anyhow::{bail, Context, Result};
use reports::matrix::{repeated_row, MatrixFile, MatrixRow, MATRIX_FILE};
use reports::render::views::matrix_report;
use reports::render::write_report;

use crate::experiments::server;
use crate::spec::matrix::{MatrixArgs, Preset};
use crate::spec::matrix_toml::{parse_matrix, read_matrix, METHODOLOGY_PRESET};
use row_run::{print_row, run_row, unmeasured};
use rows::{check_rows, fit_rows};

/// Runs the matrix's rows into `--out` (`matrix.json`, a folder per row, the report) and
/// returns `matrix.json`'s contents; `stop` ends it early, keeping what ran.
pub async fn run_matrix(
    args: &MatrixArgs,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<MatrixFile> {
    let (specs, source) = match (&args.file, args.preset) {
        (Some(path), _) => (read_matrix(path)?, path.display().to_string()),
        (None, Some(Preset::Methodology)) => (
            parse_matrix(METHODOLOGY_PRESET, "preset methodology")?,
            "preset methodology".to_string(),
        ),
        (None, None) => bail!("loadgen matrix: give a matrix file or --preset methodology"),
    };
    for (given, flag) in [
        (args.run.shard.is_some(), "--shard"),
        (args.run.start_at.is_some(), "--start-at"),
        (args.run.fail_on_slo, "--fail-on-slo"),
    ] {
        if given {
            bail!("loadgen matrix: {flag} is for run and sweep; a matrix's rows are judged by their `expect` (--fail-on-refuted gates on them)");
        }
    }
    if !(args.scale.is_finite() && args.scale > 0.0) {
        bail!("--scale must be a positive number, not {}", args.scale);
    }
    if let Some(price) = args.gpu_hour_usd {
        if !(price.is_finite() && price > 0.0) {
            bail!("--gpu-hour-usd must be a positive price, not {price}");
        }
    }
    if args.gpus_per_instance == 0 {
        bail!("--gpus-per-instance must be at least 1");
    }
    let out = args
        .run
        .out
        .clone()
        .context("loadgen matrix: --out FOLDER is required")?;
    let mut rows = check_rows(args, specs)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut server = match &args.server_cmd {
        Some(command) => {
            eprintln!("loadgen matrix: starting the server: {command}");
            Some(server::start(command, &out.join("server.log"), args.server_timeout).await?)
        }
        None => None,
    };
    let url = server
        .as_ref()
        .map_or(args.run.url.clone(), |s| s.url.clone());
    if let Err(e) = fit_rows(&mut rows, &url).await {
        if let Some(server) = server {
            server.stop().await?;
        }
        return Err(e);
    }
    let mut file = MatrixFile {
        schema_version: 1,
        source,
        scale: args.scale,
        server: args.server_cmd.clone().unwrap_or(url.clone()),
        gpu_hour_usd: args.gpu_hour_usd,
        gpus_per_instance: args.gpus_per_instance,
        rows: Vec::new(),
        stop_reason: None,
    };
    let path = out.join(MATRIX_FILE);
    file.write(&path)?;
    let total = rows.len();
    let mut runs: Vec<Vec<MatrixRow>> = vec![Vec::new(); total];
    'passes: for repeat in 0..args.repeats as usize {
        for (i, first) in rows.iter().enumerate() {
            let row = first.repeat(repeat);
            let label = match args.repeats {
                1 => row.spec.label(),
                r => format!("{} (run {} of {r})", row.spec.label(), repeat + 1),
            };
            if *stop.borrow() {
                file.stop_reason = Some(format!("interrupted before {label}"));
                break 'passes;
            }
            if server.as_mut().is_some_and(|s| s.exited()) {
                file.stop_reason = Some(format!(
                    "the server exited before {label}: see {}",
                    out.join("server.log").display()
                ));
                break 'passes;
            }
            eprintln!(
                "loadgen matrix: {label} ({}/{total}) → {}",
                i + 1,
                out.join(&row.folder).display()
            );
            let entry = match run_row(args, &out, &row, &stop).await {
                // A row cut short by Ctrl-C measured part of its window: no verdict on it.
                Ok(_) if *stop.borrow() => {
                    unmeasured(&row, "interrupted (Ctrl-C or SIGTERM)".into())
                }
                Ok(entry) => entry,
                Err(e) => {
                    eprintln!("loadgen matrix: {label}: {e:#}");
                    unmeasured(&row, format!("{e:#}"))
                }
            };
            print_row(&entry);
            runs[i].push(entry);
            let decided = match runs[i].as_slice() {
                [only] => only.clone(),
                all => repeated_row(&first.spec.expect, all.to_vec()),
            };
            if repeat == 0 {
                file.rows.push(decided);
            } else {
                print_row(&decided);
                file.rows[i] = decided;
            }
            file.write(&path)?;
        }
    }
    if let Some(server) = server {
        server.stop().await?;
    }
    if *stop.borrow() && file.stop_reason.is_none() {
        file.stop_reason = Some("interrupted (Ctrl-C or SIGTERM)".into());
    }
    file.write(&path)?;
    let (_, html) = write_report(&out, &matrix_report(&out)?)?;
    println!("matrix: {}  report: {}", path.display(), html.display());
    if let Some(reason) = &file.stop_reason {
        bail!(
            "loadgen matrix: stopped after {} row run(s): {reason}",
            runs.iter().map(Vec::len).sum::<usize>()
        );
    }
    // A row failed when it, or one of its runs (--repeats), did.
    let failed = file
        .rows
        .iter()
        .filter(|r| r.error.is_some() || r.runs.iter().any(|run| run.error.is_some()))
        .count();
    if failed > 0 {
        bail!(
            "loadgen matrix: {failed} row(s) failed to run, in whole or in one of their runs: \
             see {}",
            path.display()
        );
    }
    Ok(file)
}
