//! `loadgen compare A_DIR B_DIR`: the A/B verdict per latency metric from two saved runs
//! (each a run folder, or a folder of `round-*` run folders), paired by request id when both
//! sides ran the identical request list and schedule, unpaired otherwise (and said so).
//! Writes `compare.json` and the report into `--out`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use reports::ab::{compare, AbInput, AbReport, DEFAULT_ALPHA};
use reports::render::{write_report, CompareView, Conditions, Report, ReportBody};
use reports::samples::LatencySamples;
use reports::stats::Bootstrap;
use serde::{Deserialize, Serialize};

use crate::report_cmd::load_run;

pub const COMPARE_FILE: &str = "compare.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairMode {
    /// Paired when both sides' schedule.jsonl are identical.
    Auto,
    Yes,
    No,
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Side A: a run folder, or a folder of round-* run folders.
    pub a: PathBuf,
    /// Side B, likewise.
    pub b: PathBuf,
    /// Output folder for compare.json, report.md and report.html.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    pub pair: PairMode,
    #[arg(long, default_value_t = DEFAULT_ALPHA)]
    pub alpha: f64,
    /// Seed of the bootstrap CIs.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
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
    pub bootstrap: Bootstrap,
    pub analysis: AbReport,
}

impl CompareFile {
    pub fn read(path: &Path) -> Result<CompareFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid comparison file", path.display()))
    }
}

/// The run folders of one side: `dir` itself, or its `round-*` subfolders in name order.
fn rounds(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("records.jsonl").is_file() {
        return Ok(vec![dir.canonicalize()?]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("round-"))
                && p.join("records.jsonl").is_file()
        })
        .collect();
    if found.is_empty() {
        bail!(
            "{}: neither a run folder (records.jsonl) nor a folder of round-* runs",
            dir.display()
        );
    }
    found.sort();
    found.iter().map(|p| Ok(p.canonicalize()?)).collect()
}

fn same_schedule(a: &Path, b: &Path) -> bool {
    match (
        std::fs::read(a.join("schedule.jsonl")),
        std::fs::read(b.join("schedule.jsonl")),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

struct Sides {
    a: Vec<LatencySamples>,
    b: Vec<LatencySamples>,
    conditions: Conditions,
    a_label: String,
    b_label: String,
}

fn load_sides(a_rounds: &[PathBuf], b_rounds: &[PathBuf]) -> Result<Sides> {
    let load = |dirs: &[PathBuf]| -> Result<(Vec<LatencySamples>, Conditions)> {
        let mut samples = Vec::new();
        let mut conditions = Conditions::default();
        for (i, dir) in dirs.iter().enumerate() {
            let run = load_run(dir, &[])?;
            if i == 0 {
                conditions = Conditions::from_meta(&run.meta);
            }
            samples.push(run.samples);
        }
        Ok((samples, conditions))
    };
    let (a, ca) = load(a_rounds)?;
    let (b, cb) = load(b_rounds)?;
    let conditions = Conditions {
        workload: both(&ca.workload, &cb.workload),
        schedule: both(&ca.schedule, &cb.schedule),
        server: format!("A: {}; B: {}", ca.server, cb.server),
        hardware: both(&ca.hardware, &cb.hardware),
        extra: vec![
            ("rounds".into(), format!("A: {}, B: {}", a.len(), b.len())),
            ("A command".into(), extra(&ca, "command")),
            ("B command".into(), extra(&cb, "command")),
        ],
    };
    Ok(Sides {
        a,
        b,
        a_label: ca.server,
        b_label: cb.server,
        conditions,
    })
}

fn both(a: &str, b: &str) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("A: {a}; B: {b}")
    }
}

fn extra(c: &Conditions, key: &str) -> String {
    c.extra
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn pooled(rounds: &[LatencySamples]) -> LatencySamples {
    LatencySamples {
        requests: rounds.iter().flat_map(|r| r.requests.clone()).collect(),
        schedule_lag_ms: rounds
            .iter()
            .flat_map(|r| r.schedule_lag_ms.clone())
            .collect(),
    }
}

/// The report of a comparison (re-running the seeded analysis on the saved runs).
pub fn compare_view(file: &CompareFile) -> Result<Report> {
    let sides = load_sides(&file.a_rounds, &file.b_rounds)?;
    let input = AbInput::from_rounds(&sides.a, &sides.b, file.pair_by_id);
    let analysis = compare(&input, file.alpha, file.bootstrap);
    Ok(Report {
        title: "A/B comparison".into(),
        conditions: sides.conditions,
        body: ReportBody::Compare(CompareView {
            a_label: sides.a_label,
            b_label: sides.b_label,
            a: pooled(&sides.a),
            b: pooled(&sides.b),
            analysis,
        }),
    })
}

/// `loadgen compare` on saved runs.
pub fn compare_command(args: CompareArgs) -> Result<()> {
    let a_rounds = rounds(&args.a)?;
    let b_rounds = rounds(&args.b)?;
    let identical = a_rounds.len() == b_rounds.len()
        && a_rounds
            .iter()
            .zip(&b_rounds)
            .all(|(a, b)| same_schedule(a, b));
    let pair_by_id = match args.pair {
        PairMode::Auto => identical,
        PairMode::Yes => true,
        PairMode::No => false,
    };
    if args.pair == PairMode::Auto && !identical {
        eprintln!("loadgen compare: the sides' schedule.jsonl differ: unpaired tests");
    }
    let bootstrap = Bootstrap {
        seed: args.seed,
        ..Bootstrap::default()
    };
    let sides = load_sides(&a_rounds, &b_rounds)?;
    let analysis = compare(
        &AbInput::from_rounds(&sides.a, &sides.b, pair_by_id),
        args.alpha,
        bootstrap,
    );
    for v in &analysis.metrics {
        let ratio = v
            .median_ratio
            .map(|c| format!("{:.3} [{:.3}, {:.3}]", c.estimate, c.lower, c.upper))
            .unwrap_or_else(|| "–".into());
        println!(
            "{:<5} median B/A {ratio}  p (Holm) {}  → {}",
            reports::samples::metric_label(v.metric),
            v.p_adjusted.map_or("–".into(), |p| format!("{p:.4}")),
            v.verdict
        );
    }
    for note in &analysis.notes {
        println!("{note}");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let file = CompareFile {
        schema_version: 1,
        a_rounds,
        b_rounds,
        pair_by_id,
        alpha: args.alpha,
        bootstrap,
        analysis,
    };
    let path = args.out.join(COMPARE_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&file)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let (_, html) = write_report(&args.out, &compare_view(&file)?)?;
    println!("comparison: {}  report: {}", path.display(), html.display());
    Ok(())
}
