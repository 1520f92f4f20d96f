//! `loadgen merge`: the folders of the K shards of one schedule (`run` or `sweep` with
//! `--shard I/K --start-at T`) joined into one folder, checked first (see `crate::run::merge`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use reports::render::write_report;

use crate::run::merge::{merge_runs, merge_sweeps};
use reports::folders::SWEEP_FILE;
use reports::render::views::{run_report, sweep_report};

#[derive(Args, Debug, Clone)]
pub struct MergeArgs {
    /// The shards' run folders (or sweep folders), one per shard, in any order.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The merged folder (new or empty).
    #[arg(long)]
    pub out: PathBuf,
}

/// `loadgen merge`.
pub fn merge_command(args: MergeArgs) -> Result<()> {
    let sweeps = args
        .dirs
        .iter()
        .filter(|d| d.join(SWEEP_FILE).is_file())
        .count();
    let report = if sweeps == args.dirs.len() {
        let runs = merge_sweeps(&args.dirs, &args.out)?;
        let requests: u64 = runs.iter().map(|r| r.requests).sum();
        eprintln!(
            "loadgen merge: {} shards, {} levels, {requests} requests, each recorded once",
            args.dirs.len(),
            runs.len()
        );
        sweep_report(&args.out)?
    } else if sweeps == 0 {
        let run = merge_runs(&args.dirs, &args.out)?;
        eprintln!(
            "loadgen merge: {} shards, {} requests, each recorded once",
            run.shards, run.requests
        );
        let summary = reports::summary::Summary::read(&args.out.join("summary.json"))?;
        print!("{}", reports::table::render(&summary));
        run_report(&args.out)?
    } else {
        bail!("loadgen merge: give either run folders or sweep folders, not both");
    };
    let (_, html) = write_report(&args.out, &report)?;
    println!("merged: {}  report: {}", args.out.display(), html.display());
    Ok(())
}
