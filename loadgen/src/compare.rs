//! `loadgen compare`: the A/B verdict per latency metric (ratio of medians and of p99s with
//! bootstrap CIs, Wilcoxon signed-rank on paired per-request differences, Welch on per-round
//! p99s, Holm across metrics). Writes `compare.json` and the report into `--out`.
//!
//! Online (`--a URL_A --b URL_B`, or `--a-cmd "…" --b-cmd "…"`): the plan (request list and
//! schedule) is built once from the seed and run unchanged on both sides, `--rounds` rounds per
//! side in the alternating order A B, B A, A B, B A, … (round k runs A first when k is even),
//! each round with the plan's warm-up, into `OUT/round-KK-a/` and `OUT/round-KK-b/`.
//! With `--a-cmd` / `--b-cmd` only one server is up at a time: every round starts its side's
//! server afresh on a free port (`{port}` in the command is replaced, else `--port N` is
//! appended), waits for `GET /health` = 200, runs, and stops it (SIGTERM). Restarting for every
//! round, rather than keeping a server up across its two consecutive rounds (B B, A A), keeps
//! the strict alternation and gives every round the same start: no side gains from caches
//! (prefix cache, allocator, JIT) filled by its previous round. Start-up time is not measured;
//! the warm-up absorbs start-up effects. Each round's `meta.json` records the side, the round,
//! the server's command line, its `/v1/models` and its `/version` when it has one.
//!
//! Offline (`loadgen compare A_DIR B_DIR`, or `loadgen compare DIR` on an online comparison's
//! folder): each side is a run folder or a folder of `round-*` run folders; requests are paired
//! by id when both sides ran the identical schedule, unpaired tests otherwise (and said so).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use reports::ab::{compare, AbInput, AbReport, DEFAULT_ALPHA};
use reports::render::{write_report, CompareView, Conditions, Report, ReportBody};
use reports::samples::LatencySamples;
use reports::stats::Bootstrap;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cli::{execute_prepared, prepare_run, Execution, RunArgs};
use crate::report_cmd::load_run;
use crate::run::stop_on_signals;
use crate::server_proc::{self, ServerProcess};
use crate::units::duration_arg;

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
    /// Offline side A: a run folder, a folder of round-* run folders, or the folder of an
    /// online comparison (round-KK-a / round-KK-b; then give no B_DIR).
    #[arg(value_name = "A_DIR")]
    pub a_dir: Option<PathBuf>,
    /// Offline side B, likewise.
    #[arg(value_name = "B_DIR")]
    pub b_dir: Option<PathBuf>,
    /// Online: base URL of server A (without /v1).
    #[arg(long = "a", value_name = "URL_A", conflicts_with_all = ["a_dir", "a_cmd"])]
    pub a_url: Option<String>,
    /// Online: base URL of server B.
    #[arg(long = "b", value_name = "URL_B", conflicts_with_all = ["a_dir", "b_cmd"])]
    pub b_url: Option<String>,
    /// Online: command that starts server A (`{port}` is replaced by a free port, else
    /// `--port N` is appended); started afresh for each of its rounds.
    #[arg(long, conflicts_with = "a_dir")]
    pub a_cmd: Option<String>,
    /// Online: command that starts server B.
    #[arg(long, conflicts_with = "a_dir")]
    pub b_cmd: Option<String>,
    /// Online: rounds per side, run in the order A B, B A, A B, …
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Online: how long a started server may take to answer GET /health with 200.
    #[arg(long, value_parser = duration_arg, default_value = "300s")]
    pub server_timeout: Duration,
    #[arg(long, value_enum, default_value = "auto")]
    pub pair: PairMode,
    #[arg(long, default_value_t = DEFAULT_ALPHA)]
    pub alpha: f64,
    /// Seed of the bootstrap CIs.
    #[arg(long, default_value_t = 0x5eed)]
    pub bootstrap_seed: u64,
    /// Every `loadgen run` option applies to each online round (`--url` is not used;
    /// `--out` is the comparison's output folder, required).
    #[command(flatten)]
    pub run: RunArgs,
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

/// Which side of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    fn suffix(self) -> &'static str {
        match self {
            Side::A => "a",
            Side::B => "b",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// The online run order: `rounds` rounds per side, A first in even rounds and B first in odd
/// ones (A B, B A, A B, B A, …).
pub fn round_order(rounds: usize) -> Vec<(usize, Side)> {
    (0..rounds)
        .flat_map(|k| {
            if k % 2 == 0 {
                [(k, Side::A), (k, Side::B)]
            } else {
                [(k, Side::B), (k, Side::A)]
            }
        })
        .collect()
}

/// The folder of one online round.
pub fn round_dir(out: &Path, round: usize, side: Side) -> PathBuf {
    out.join(format!("round-{round:02}-{}", side.suffix()))
}

fn round_folders(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("round-"))
                && p.join("records.jsonl").is_file()
        })
        .collect();
    found.sort();
    Ok(found)
}

fn is_side_round(path: &Path, side: Side) -> bool {
    path.file_name().is_some_and(|n| {
        n.to_string_lossy()
            .ends_with(&format!("-{}", side.suffix()))
    })
}

/// The run folders of one side: `dir` itself, or its `round-*` subfolders in name order.
fn rounds(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("records.jsonl").is_file() {
        return Ok(vec![dir.canonicalize()?]);
    }
    let found = round_folders(dir)?;
    if found.is_empty() {
        bail!(
            "{}: neither a run folder (records.jsonl) nor a folder of round-* runs",
            dir.display()
        );
    }
    if found.iter().any(|p| is_side_round(p, Side::A))
        && found.iter().any(|p| is_side_round(p, Side::B))
    {
        bail!(
            "{}: an online comparison's folder (round-KK-a and round-KK-b): give it alone, \
             `loadgen compare {}`",
            dir.display(),
            dir.display()
        );
    }
    found.iter().map(|p| Ok(p.canonicalize()?)).collect()
}

/// Both sides' run folders of an online comparison's folder.
fn online_rounds(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let found = round_folders(dir)?;
    let side = |s: Side| -> Result<Vec<PathBuf>> {
        found
            .iter()
            .filter(|p| is_side_round(p, s))
            .map(|p| Ok(p.canonicalize()?))
            .collect()
    };
    let (a, b) = (side(Side::A)?, side(Side::B)?);
    if a.is_empty() || b.is_empty() {
        bail!(
            "{}: expected round-KK-a and round-KK-b run folders (an online comparison), or give \
             two folders A_DIR B_DIR",
            dir.display()
        );
    }
    Ok((a, b))
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

/// Per-round samples of one side, the first round's conditions and the server's command line
/// when this tool started it.
fn load_side(dirs: &[PathBuf]) -> Result<(Vec<LatencySamples>, Conditions, Option<String>)> {
    let mut samples = Vec::new();
    let mut conditions = Conditions::default();
    let mut server_command = None;
    for (i, dir) in dirs.iter().enumerate() {
        let run = load_run(dir, &[])?;
        if i == 0 {
            conditions = Conditions::from_meta(&run.meta);
            server_command = run
                .meta
                .extra
                .get("server_command")
                .and_then(|v| v.as_str())
                .map(str::to_string);
        }
        samples.push(run.samples);
    }
    Ok((samples, conditions, server_command))
}

fn load_sides(a_rounds: &[PathBuf], b_rounds: &[PathBuf]) -> Result<Sides> {
    let (a, ca, a_cmd) = load_side(a_rounds)?;
    let (b, cb, b_cmd) = load_side(b_rounds)?;
    let mut extra = vec![("rounds".into(), format!("A: {}, B: {}", a.len(), b.len()))];
    match (a_cmd, b_cmd) {
        (None, None) => extra.push((
            "command".into(),
            both(&extra_of(&ca, "command"), &extra_of(&cb, "command")),
        )),
        (a_cmd, b_cmd) => {
            extra.push(("loadgen command".into(), extra_of(&ca, "command")));
            extra.push((
                "A server command".into(),
                a_cmd.unwrap_or_else(|| "not started by loadgen".into()),
            ));
            extra.push((
                "B server command".into(),
                b_cmd.unwrap_or_else(|| "not started by loadgen".into()),
            ));
        }
    }
    let conditions = Conditions {
        workload: both(&ca.workload, &cb.workload),
        schedule: both(&ca.schedule, &cb.schedule),
        server: format!("A: {}; B: {}", ca.server, cb.server),
        hardware: both(&ca.hardware, &cb.hardware),
        extra,
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

fn extra_of(c: &Conditions, key: &str) -> String {
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

/// How the analysis is run.
#[derive(Debug, Clone, Copy)]
pub struct AnalysisOptions {
    pub pair: PairMode,
    pub alpha: f64,
    pub bootstrap_seed: u64,
    /// Print the verdicts and the file / report paths.
    pub print: bool,
}

/// Analyses the rounds of both sides, writes `compare.json` and the report into `out`.
pub fn analyse_rounds(
    a_rounds: Vec<PathBuf>,
    b_rounds: Vec<PathBuf>,
    options: AnalysisOptions,
    out: &Path,
) -> Result<CompareFile> {
    let identical = a_rounds.len() == b_rounds.len()
        && a_rounds
            .iter()
            .zip(&b_rounds)
            .all(|(a, b)| same_schedule(a, b));
    let pair_by_id = match options.pair {
        PairMode::Auto => identical,
        PairMode::Yes => true,
        PairMode::No => false,
    };
    if options.pair == PairMode::Auto && !identical {
        eprintln!("loadgen compare: the sides' schedule.jsonl differ: unpaired tests");
    }
    let bootstrap = Bootstrap {
        seed: options.bootstrap_seed,
        ..Bootstrap::default()
    };
    let sides = load_sides(&a_rounds, &b_rounds)?;
    let analysis = compare(
        &AbInput::from_rounds(&sides.a, &sides.b, pair_by_id),
        options.alpha,
        bootstrap,
    );
    if options.print {
        print!("{}", verdict_text(&analysis));
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let file = CompareFile {
        schema_version: 1,
        a_rounds,
        b_rounds,
        pair_by_id,
        alpha: options.alpha,
        bootstrap,
        analysis,
    };
    let path = out.join(COMPARE_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&file)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let (_, html) = write_report(out, &compare_view(&file)?)?;
    if options.print {
        println!("comparison: {}  report: {}", path.display(), html.display());
    }
    Ok(file)
}

/// The verdicts as terminal text, one line per metric, then the notes.
pub fn verdict_text(analysis: &AbReport) -> String {
    let mut out = String::new();
    for v in &analysis.metrics {
        let ratio = v
            .median_ratio
            .map(|c| format!("{:.3} [{:.3}, {:.3}]", c.estimate, c.lower, c.upper))
            .unwrap_or_else(|| "–".into());
        out.push_str(&format!(
            "{:<5} median B/A {ratio}  p (Holm) {}  → {}\n",
            reports::samples::metric_label(v.metric),
            v.p_adjusted.map_or("–".into(), |p| format!("{p:.4}")),
            v.verdict
        ));
    }
    for note in &analysis.notes {
        out.push_str(note);
        out.push('\n');
    }
    out
}

/// One side of an online comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSpec {
    /// A running server's base URL.
    Url(String),
    /// A command that starts the server, run afresh for each round.
    Command(String),
}

fn server_spec(url: &Option<String>, cmd: &Option<String>, side: Side) -> Result<ServerSpec> {
    match (url, cmd) {
        (Some(u), None) => Ok(ServerSpec::Url(u.trim_end_matches('/').to_string())),
        (None, Some(c)) => Ok(ServerSpec::Command(c.clone())),
        _ => bail!(
            "loadgen compare: give side {} as --{s} URL or --{s}-cmd COMMAND",
            side.label(),
            s = side.suffix()
        ),
    }
}

/// `loadgen compare`: online when `--a`/`--a-cmd` are given, else on saved runs.
pub async fn compare_command(args: CompareArgs) -> Result<()> {
    let options = AnalysisOptions {
        pair: args.pair,
        alpha: args.alpha,
        bootstrap_seed: args.bootstrap_seed,
        print: true,
    };
    let out = args
        .run
        .out
        .clone()
        .context("loadgen compare: --out FOLDER is required")?;
    let online = args.a_url.is_some()
        || args.a_cmd.is_some()
        || args.b_url.is_some()
        || args.b_cmd.is_some();
    if online {
        let a = server_spec(&args.a_url, &args.a_cmd, Side::A)?;
        let b = server_spec(&args.b_url, &args.b_cmd, Side::B)?;
        let (a_rounds, b_rounds) = run_rounds(&args, &a, &b, &out).await?;
        analyse_rounds(a_rounds, b_rounds, options, &out)?;
        return Ok(());
    }
    let (a_rounds, b_rounds) = match (&args.a_dir, &args.b_dir) {
        (Some(a), Some(b)) => (rounds(a)?, rounds(b)?),
        (Some(dir), None) => online_rounds(dir)?,
        _ => bail!("loadgen compare: give A_DIR B_DIR (saved runs), or --a/--a-cmd and --b/--b-cmd (online)"),
    };
    analyse_rounds(a_rounds, b_rounds, options, &out)?;
    Ok(())
}

/// Runs the online rounds (see the module doc); returns each side's round folders in order.
pub async fn run_rounds(
    args: &CompareArgs,
    a: &ServerSpec,
    b: &ServerSpec,
    out: &Path,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    if args.rounds == 0 {
        bail!("loadgen compare: --rounds must be at least 1");
    }
    let stop = stop_on_signals()?;
    // Built once: both sides and every round get the identical requests and schedule.
    let prepared = prepare_run(&args.run)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let order = round_order(args.rounds);
    let order_text: Vec<&str> = order.iter().map(|(_, s)| s.label()).collect();
    let order_text = order_text.join(" ");
    let (mut a_rounds, mut b_rounds) = (Vec::new(), Vec::new());
    for (step, &(round, side)) in order.iter().enumerate() {
        if *stop.borrow() {
            bail!(
                "loadgen compare: stopped after {step} of {} runs",
                order.len()
            );
        }
        let dir = round_dir(out, round, side);
        let spec = match side {
            Side::A => a,
            Side::B => b,
        };
        let (url, server): (String, Option<ServerProcess>) = match spec {
            ServerSpec::Url(u) => (u.clone(), None),
            ServerSpec::Command(cmd) => {
                let s = server_proc::start(cmd, &dir.join("server.log"), args.server_timeout)
                    .await
                    .with_context(|| {
                        format!("starting server {} for round {round}", side.label())
                    })?;
                (s.url.clone(), Some(s))
            }
        };
        let identity =
            server_proc::identify(&url, &prepared.headers, args.run.api_key.as_deref()).await;
        let mut extra = std::collections::BTreeMap::new();
        extra.insert("ab_side".to_string(), json!(side.label()));
        extra.insert("ab_round".to_string(), json!(round));
        extra.insert("ab_order".to_string(), json!(order_text));
        if let Some(s) = &server {
            extra.insert("server_command".to_string(), json!(s.command));
        }
        if let Some(models) = identity.models {
            extra.insert("server_models".to_string(), models);
        }
        eprintln!(
            "loadgen compare: run {}/{}: round {round} side {} ({url}) → {}",
            step + 1,
            order.len(),
            side.label(),
            dir.display()
        );
        let result = execute_prepared(
            &args.run,
            &prepared,
            Execution {
                url,
                out: Some(dir.clone()),
                server_version: identity.version,
                extra,
                progress: !args.run.no_progress,
                stop: stop.clone(),
            },
        )
        .await;
        if let Some(s) = server {
            s.stop().await?;
        }
        result.with_context(|| format!("round {round}, side {}", side.label()))?;
        let dir = dir.canonicalize()?;
        match side {
            Side::A => a_rounds.push(dir),
            Side::B => b_rounds.push(dir),
        }
    }
    Ok((a_rounds, b_rounds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_a_b_b_a() {
        let order: Vec<String> = round_order(4)
            .iter()
            .map(|(k, s)| format!("{k}{}", s.suffix()))
            .collect();
        assert_eq!(order, ["0a", "0b", "1b", "1a", "2a", "2b", "3b", "3a"]);
        assert_eq!(
            round_dir(Path::new("out"), 3, Side::B),
            Path::new("out/round-03-b")
        );
    }

    #[test]
    fn each_side_is_a_url_or_a_command() {
        let url = Some("http://h:1/".to_string());
        let cmd = Some("engine serve".to_string());
        assert_eq!(
            server_spec(&url, &None, Side::A).unwrap(),
            ServerSpec::Url("http://h:1".into())
        );
        assert_eq!(
            server_spec(&None, &cmd, Side::B).unwrap(),
            ServerSpec::Command("engine serve".into())
        );
        assert!(server_spec(&None, &None, Side::A).is_err());
        assert!(server_spec(&url, &cmd, Side::A).is_err());
    }
}
