//! `loadgen matrix`: a benchmark run as an experiment. Each `[[row]]` of the matrix file (see
//! `file`) is a workload with its question, hypothesis and expectations; the rows run
//! one after another against one server (`--url`, or `--server-cmd` started once), each into
//! its own run folder (a knee-search row: its sweep folder), and each expectation is decided
//! by the row's intervals (`reports::matrix`).
//!
//! Layout of `--out`: `matrix.json` (rewritten after every row, so a cut-short matrix keeps
//! what ran), `row-NN-NAME/` per row (with `prefix-warmup/` for a warm row; with `--repeats`,
//! the later runs in `row-NN-NAME/repeat-K/`), `server.log` with `--server-cmd`, and the
//! report: one line per row, then each row's own report.

pub mod file;
mod warm;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use reports::diagnosis::Regime;
use reports::matrix::{
    repeated_row, row_verdict, usd_per_million_output_tokens, CapacityBracket, Evidence,
    MatrixFile, MatrixRow, Verdict, MATRIX_FILE,
};
use reports::render::write_report;
use reports::summary::Summary;

use crate::commands::sweep::{repeat_seed, run_sweep, DEFAULT_PROBE_DURATION};
use crate::launch::prepare_and_execute;
use crate::options::RunArgs;
use crate::prepare::prepare_run;
use crate::server_proc;
use crate::stop::stop_on_signals;
use crate::units::duration_arg;
use crate::workload::prompt::{salt_for, SaltFor};
use crate::workload::PromptSource;
use reports::render::views::matrix_report;

use file::{parse_matrix, read_matrix, row_command, Prefix, RowArgs, RowSpec, METHODOLOGY_PRESET};

/// A matrix loadgen carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Six rows: A 256 in / 128 out at 1 stream; B 2,048 / 128, 1 stream; C 256 / 1,024,
    /// 1 stream; D 2,048 / 1,024 at 8 concurrent; E 4,096 / 256 at 16 concurrent over a
    /// warm shared prefix; F ShareGPT-like chat at 2 req/s.
    Methodology,
}

/// The chat template's tokens around a prompt (a system prompt, role markers), kept free
/// under the server's context when requests are clipped to it (`--backend chat`).
const CHAT_TEMPLATE_ROOM: u32 = 64;

#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("url", |a| a.conflicts_with("server_cmd")),
    mut_arg("out", |a| a.help("The matrix's folder: matrix.json, one folder per row, the report")),
)]
pub struct MatrixArgs {
    /// The matrix file: `[[row]]` tables with `name`, `question`, `hypothesis`, the workload
    /// and load as `loadgen run` options by their long names (`random-input-len = 256`,
    /// `concurrency = 8`, `rate = 2`, or `rates = "search"` with the row's `slo`),
    /// `duration` or `num-prompts`, `prefix = "cold" | "warm"`, and `expect`, statements the
    /// run can refute: "ttft:p95 < 1s", "tpot:p50 < 1.5 * bound", "itl:p99 < 3 * bound",
    /// "regime = decode-memory-bound", "regime != queueing", "capacity > 2 req/s".
    #[arg(required_unless_present = "preset", conflicts_with = "preset")]
    pub file: Option<PathBuf>,
    /// Run a matrix loadgen carries instead of a file (with --write: write it out).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// With --preset: write its rows to this TOML file and exit, running nothing.
    #[arg(long, requires = "preset", value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Multiply every row's lengths (prompt, prefix, output) and durations (warm-up, measured
    /// span, cool-down, ramp, probe steps) by this: 0.1 runs a GPU matrix on a CPU. Lengths are
    /// also clipped to the server's context when its /v1/models (or /props) gives it.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The server command, with `{port}`: started once for the whole matrix, stopped after.
    #[arg(long)]
    pub server_cmd: Option<String>,
    /// How long the started server may take to answer GET /health with 200.
    #[arg(long, value_parser = duration_arg, default_value = "300s")]
    pub server_timeout: Duration,
    /// Price of one GPU-hour in USD: each row's cost per million output tokens at the
    /// output rate it sustained.
    #[arg(long)]
    pub gpu_hour_usd: Option<f64>,
    /// GPUs the server runs on, for the cost.
    #[arg(long, default_value_t = 1)]
    pub gpus_per_instance: u32,
    /// Exit 3 when a row's hypothesis is refuted (after every row ran and the report is
    /// written).
    #[arg(long)]
    pub fail_on_refuted: bool,
    /// Run every row R times, interleaved across rows (every row once, then every row again),
    /// each run with a fresh seed and prompt words, into `row-NN-NAME/repeat-K/` after the
    /// first. Each statement is then decided across the runs (a Student t-interval over their
    /// values, R − 1 degrees of freedom) as well as within each: confirmed or refuted only
    /// where both agree, so that a verdict is one the next run would repeat.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
    /// Every `loadgen run` option given here is each row's default (--model, --backend,
    /// --header, --api-key, TLS, --tokenizer, --seed, --slo, …); a row's own keys win.
    /// `--out` (required) is the matrix's folder.
    #[command(flatten)]
    pub run: RunArgs,
    /// The run options given on the command line, as words (filled by [`MatrixCommand`]).
    #[arg(skip)]
    pub defaults: Vec<String>,
}

/// [`MatrixArgs`] as parsed from a command line: the run options given there kept as words,
/// every row's defaults. Every way of parsing the command line fills them.
#[derive(Debug, Clone)]
pub struct MatrixCommand(pub MatrixArgs);

impl FromArgMatches for MatrixCommand {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = MatrixArgs::from_arg_matches(matches)?;
        args.defaults = given_run_options(matches);
        Ok(MatrixCommand(args))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)?;
        self.0.defaults = given_run_options(matches);
        Ok(())
    }
}

impl Args for MatrixCommand {
    fn augment_args(command: clap::Command) -> clap::Command {
        MatrixArgs::augment_args(command)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        MatrixArgs::augment_args_for_update(command)
    }
}

/// The words of the run options given on the matrix's own command line (`matches`), which
/// every row starts from; `--url` and `--out` are the matrix's and are left out.
fn given_run_options(matches: &ArgMatches) -> Vec<String> {
    let command = row_command::<RunArgs>();
    let mut words = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "url" | "out")
            || matches.value_source(id) != Some(clap::parser::ValueSource::CommandLine)
        {
            continue;
        }
        if !arg.get_action().takes_values() {
            words.push(format!("--{long}"));
            continue;
        }
        let Ok(Some(occurrences)) = matches.try_get_raw_occurrences(id) else {
            continue;
        };
        for values in occurrences {
            for value in values {
                words.push(format!("--{long}={}", value.to_string_lossy()));
            }
        }
    }
    words
}

/// One row ready to run.
#[derive(Clone)]
struct PreparedRow {
    spec: RowSpec,
    args: RowArgs,
    /// Its folder, relative to the matrix's.
    folder: String,
    /// The load in words.
    load: String,
    /// `cold`, `warm`, or why cold cannot be promised.
    prefix: String,
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

/// `loadgen matrix`.
pub async fn matrix_command(args: MatrixArgs) -> Result<()> {
    if let Some(path) = &args.write {
        return write_preset(&args, path);
    }
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
    let mut rows = check_rows(&args, specs)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let stop = stop_on_signals()?;
    let mut server = match &args.server_cmd {
        Some(command) => {
            eprintln!("loadgen matrix: starting the server: {command}");
            Some(server_proc::start(command, &out.join("server.log"), args.server_timeout).await?)
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
            let entry = match run_row(&args, &out, &row, &stop).await {
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

/// Each row parsed with the matrix's defaults, scaled, and its plan built once (no
/// network), so that a bad row is refused before anything runs.
fn check_rows(args: &MatrixArgs, specs: Vec<RowSpec>) -> Result<Vec<PreparedRow>> {
    specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            let parsed = spec.args(&args.defaults)?;
            let label = spec.label();
            let mut row_args = parsed.args.clone();
            scale_row(&mut row_args, args.scale)
                .with_context(|| format!("{label} with --scale {}", args.scale))?;
            let run = row_args.run_mut();
            // Words of this row's own: nothing an earlier row (or matrix) sent matches.
            let base = if run.prompt_salt == 0 {
                chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default() as u64
            } else {
                run.prompt_salt
            };
            run.prompt_salt = salt_for(base, SaltFor::MatrixRow, i);
            let prepared = prepare_run(run).with_context(|| format!("{label}: its workload"))?;
            crate::bound_inputs::resolve(&run.bound, None)
                .with_context(|| format!("{label}: the bound's inputs"))?;
            let replay = prepared.schedule_meta["arrival"] == "trace";
            if !spec.search && !parsed.gave("rate") && !parsed.gave("concurrency") && !replay {
                bail!("{label}: no load: give `rate` (requests/s), `concurrency` or `rates = \"search\"` (in the row, or as the matrix's --rate / --concurrency)");
            }
            if spec.search && !parsed.gave("slo") {
                bail!("{label}: a knee search needs an SLO: the row's `slo` (e.g. \"ttft:p90:2s,tpot:p90:100ms\") or the matrix's --slo");
            }
            if !parsed.gave("duration") && !parsed.gave("num-prompts") && !replay {
                bail!("{label}: give `duration` or `num-prompts` (in the row, or as the matrix's --duration / --num-prompts): how much of the load to measure");
            }
            if spec.prefix == Prefix::Warm && warm::prefixes(&prepared.plan).is_empty() {
                bail!("{label}, key `prefix`: `warm` sends the row's shared prefixes before its window, but its requests share none (give `prefix-len` and `prefix-groups`)");
            }
            let load = match (&row_args, prepared.schedule_meta["mode"].as_str()) {
                (RowArgs::Search(sweep), _) => {
                    format!("knee search under {}", sweep.run.slo.as_deref().unwrap_or(""))
                }
                (RowArgs::Run(run), Some("closed")) => {
                    format!("concurrency {}", run.concurrency.unwrap_or(1))
                }
                (_, _) if replay => "the trace's timestamps".into(),
                (RowArgs::Run(run), _) => format!("rate {} req/s", run.rate),
            };
            let text_prompts = prepared
                .plan
                .requests
                .iter()
                .any(|r| matches!(r.spec.prompt, PromptSource::Text(_)));
            let prefix = match spec.prefix {
                Prefix::Cold if text_prompts => {
                    "cold, except literal-text prompts (sent as they are)".into()
                }
                p => p.name().to_string(),
            };
            Ok(PreparedRow {
                folder: folder_name(&spec),
                spec,
                args: row_args,
                load,
                prefix,
            })
        })
        .collect()
}

/// The tokens kept free under the server's context when a request is clipped to it: a
/// chat template's tokens around the prompt, or a BOS.
fn context_room(run: &RunArgs) -> u32 {
    if run.backend == crate::backend::Backend::Chat {
        CHAT_TEMPLATE_ROOM
    } else {
        1
    }
}

/// Clips every row's requests to its model's context on the server at `url` (where the
/// server says it), and builds each plan again so that a row that cannot fit fails here,
/// before the first row runs.
async fn fit_rows(rows: &mut [PreparedRow], url: &str) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let run = first.args.run();
    let headers = crate::options::parse_headers(&run.headers)?;
    let tls = crate::tls::TlsSettings::new(&run.tls)?;
    let identity = server_proc::identify(url, &headers, run.api_key.as_deref(), Some(&tls)).await;
    for row in rows.iter_mut() {
        let label = row.spec.label();
        let run = row.args.run_mut();
        run.url = url.to_string();
        if run.turns.is_some() {
            continue;
        }
        let Some(context) = identity.context_len(run.model.as_deref()) else {
            continue;
        };
        let mut limit = context.saturating_sub(context_room(run));
        // Without the model's tokenizer a prompt's length is approximate: a margin of 10%.
        if run.tokenizer.is_none() {
            limit = limit / 10 * 9;
        }
        run.max_model_len = Some(run.max_model_len.map_or(limit, |own| own.min(limit)));
        let prepared = prepare_run(run).with_context(|| {
            format!("{label}: its workload clipped to the server's context of {context} tokens")
        })?;
        let clipped = prepared.workload_meta["max_model_len"]["clipped_requests"]
            .as_u64()
            .unwrap_or(0);
        if clipped > 0 {
            let applied = run.max_model_len.unwrap_or(limit);
            eprintln!("loadgen matrix: {label}: {clipped} request(s) shortened to {applied} tokens (the server's context: {context})");
        }
    }
    Ok(())
}

impl PreparedRow {
    /// The row's `repeat`-th repeat (`--repeats`; 0: the row itself): a fresh seed and
    /// prompt words, in `row-NN-NAME/repeat-K/`.
    fn repeat(&self, repeat: usize) -> PreparedRow {
        let mut row = self.clone();
        if repeat > 0 {
            row.folder = format!("{}/repeat-{repeat}", self.folder);
            let run = row.args.run_mut();
            run.seed = repeat_seed(run.seed, repeat);
            run.prompt_salt = salt_for(run.prompt_salt, SaltFor::MatrixRepeat, repeat);
        }
        row
    }
}

/// `row-03-NAME`: the position keeps folders apart and in order.
fn folder_name(spec: &RowSpec) -> String {
    let slug: String = spec
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if slug.is_empty() {
        format!("row-{:02}", spec.position)
    } else {
        format!("row-{:02}-{slug}", spec.position)
    }
}

/// `--scale`: lengths through `--length-scale`, request counts and durations multiplied
/// here. A trace's own timestamps are not: scaling them would change the rate.
fn scale_row(args: &mut RowArgs, scale: f64) -> Result<()> {
    if scale == 1.0 {
        return Ok(());
    }
    let run = args.run_mut();
    if run.turns.is_some() {
        bail!("a multi-turn session's prompts grow with its history and cannot be scaled; run this matrix at --scale 1 or shape the row with max-history-tokens");
    }
    run.length_scale *= scale;
    run.warmup = run.warmup.mul_f64(scale);
    run.cooldown = run.cooldown.mul_f64(scale);
    run.duration = run.duration.map(|d| d.mul_f64(scale));
    run.ramp_up = run.ramp_up.map(|d| d.mul_f64(scale));
    run.num_prompts = run
        .num_prompts
        .map(|n| ((n as f64 * scale).ceil() as usize).max(1));
    if let RowArgs::Search(sweep) = args {
        sweep.probe_duration = Some(
            sweep
                .probe_duration
                .unwrap_or(DEFAULT_PROBE_DURATION)
                .mul_f64(scale),
        );
    }
    Ok(())
}

/// Runs one row (its prefixes first when warm) and decides its expectations.
async fn run_row(
    args: &MatrixArgs,
    out: &Path,
    row: &PreparedRow,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<MatrixRow> {
    let dir = out.join(&row.folder);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut row_args = row.args.clone();
    if row.spec.prefix == Prefix::Warm {
        warm::warm_prefixes(row_args.run(), dir.join("prefix-warmup"), stop).await?;
    }
    let (summary, capacity, folder) = match &mut row_args {
        RowArgs::Run(run) => {
            run.out = Some(dir.join("run"));
            let outcome = prepare_and_execute(run, stop.clone()).await?;
            print!("{}", reports::table::render(&outcome.summary));
            (Some(outcome.summary), None, format!("{}/run", row.folder))
        }
        RowArgs::Search(sweep) => {
            let sweep_dir = dir.join("sweep");
            sweep.run.out = Some(sweep_dir.clone());
            let file = run_sweep(sweep, stop.clone()).await?;
            let bracket = file
                .search
                .as_ref()
                .map(|s| s.bracket())
                .unwrap_or_default();
            let knee = match &bracket.lower {
                Some(end) => Some(Summary::read(
                    &sweep_dir.join(&end.dir).join("summary.json"),
                )?),
                None => None,
            };
            let capacity = CapacityBracket {
                lower: bracket.lower.map(|e| e.rate),
                upper: bracket.upper.map(|e| e.rate),
            };
            (knee, Some(capacity), format!("{}/sweep", row.folder))
        }
    };
    Ok(measured_row(args, row, folder, summary.as_ref(), capacity))
}

/// The row's entry from its summary (a knee search: its knee level's) and bracket.
fn measured_row(
    args: &MatrixArgs,
    row: &PreparedRow,
    folder: String,
    summary: Option<&Summary>,
    capacity: Option<CapacityBracket>,
) -> MatrixRow {
    let empty = std::collections::BTreeMap::new();
    let diagnosis = summary.and_then(|s| s.diagnosis.as_ref());
    let evidence = Evidence {
        metrics: summary.map_or(&empty, |s| &s.metrics),
        diagnosis,
        capacity,
    };
    let expectations: Vec<_> = row
        .spec
        .expect
        .iter()
        .map(|e| e.decide(&evidence))
        .collect();
    let output = summary.map(|s| s.output_throughput);
    MatrixRow {
        folder,
        verdict: row_verdict(&expectations),
        expectations,
        regime: diagnosis.map_or(Regime::Undetermined, |d| d.regime),
        regime_evidence: diagnosis.map_or_else(
            || "no measured level to diagnose".to_string(),
            |d| d.evidence.clone(),
        ),
        tpot_p50_ms: summary
            .and_then(|s| s.metrics.get("tpot"))
            .filter(|t| t.count > 0)
            .map(|t| t.p50),
        bound_tpot_ms: diagnosis.and_then(|d| d.bound.as_ref()).map(|b| b.tpot_ms),
        tpot_over_bound: diagnosis.and_then(|d| d.tpot_over_bound),
        output_tok_per_s: output,
        usd_per_million_output_tokens: args.gpu_hour_usd.zip(output).and_then(|(price, tok)| {
            usd_per_million_output_tokens(price, args.gpus_per_instance, tok)
        }),
        capacity,
        ..unmeasured(row, String::new())
    }
}

/// The entry of a row without a measurement (`error` says why; empty when one follows).
fn unmeasured(row: &PreparedRow, error: String) -> MatrixRow {
    MatrixRow {
        name: row.spec.display_name(),
        question: row.spec.question.clone(),
        hypothesis: row.spec.hypothesis.clone(),
        folder: row.folder.clone(),
        load: row.load.clone(),
        prefix: row.prefix.clone(),
        verdict: Verdict::Inconclusive,
        expectations: Vec::new(),
        regime: Regime::Undetermined,
        regime_evidence: "the row has no measurement".into(),
        tpot_p50_ms: None,
        bound_tpot_ms: None,
        tpot_over_bound: None,
        output_tok_per_s: None,
        usd_per_million_output_tokens: None,
        capacity: None,
        error: (!error.is_empty()).then_some(error),
        runs: Vec::new(),
    }
}

fn print_row(row: &MatrixRow) {
    let ratio = row
        .tpot_over_bound
        .map_or("–".to_string(), |r| format!("{r:.2}× bound"));
    println!(
        "{:<24} {:<12} regime {:<22} TPOT/bound {ratio}",
        row.name,
        row.verdict.to_string(),
        row.regime.to_string(),
    );
    for e in &row.expectations {
        println!(
            "    {:<12} {}: {}",
            e.verdict.to_string(),
            e.expectation,
            e.reason
        );
    }
    if let Some(error) = &row.error {
        println!("    failed: {error}");
    }
}
