//! `loadgen matrix`: a benchmark run as an experiment. Each `[[row]]` of the matrix file (see
//! `file`) is a workload with its question, hypothesis and expectations; the rows run
//! one after another against one server (`--url`, or `--server-cmd` started once), each into
//! its own run folder (a knee-search row: its sweep folder), and each expectation is decided
//! by the row's intervals (`reports::matrix`).
//!
//! Layout of `--out`: `matrix.json` (rewritten after every row, so a cut-short matrix keeps
//! what ran), `row-NN-NAME/` per row (with `prefix-warmup/` for a warm row), `server.log`
//! with `--server-cmd`, and the report: one line per row, then each row's own report.

pub mod file;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use reports::matrix::{
    row_verdict, usd_per_million_output_tokens, CapacityBracket, Evidence, MatrixFile, MatrixRow,
    Verdict, MATRIX_FILE,
};
use reports::render::write_report;
use reports::summary::Summary;

use crate::commands::sweep::{run_sweep, DEFAULT_PROBE_DURATION};
use crate::execute::{execute_prepared, prepare_and_execute, Execution};
use crate::options::RunArgs;
use crate::plan::Plan;
use crate::prepare::prepare_run;
use crate::server_proc;
use crate::stop::stop_on_signals;
use crate::units::duration_arg;
use crate::views::matrix_report;
use crate::workload::{mix, PromptSource, RequestSpec};

use file::{parse_matrix, read_matrix, Prefix, RowArgs, RowSpec, METHODOLOGY_PRESET};

/// A matrix loadgen carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Six rows: A 256 in / 128 out at 1 stream; B 2,048 / 128, 1 stream; C 256 / 1,024,
    /// 1 stream; D 2,048 / 1,024 at 8 concurrent; E 4,096 / 256 at 16 concurrent over a
    /// warm shared prefix; F ShareGPT-like chat at 2 req/s.
    Methodology,
}

/// The chat template's tokens around a prompt, kept free under the server's context when
/// requests are clipped to it (`--backend chat`).
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
    /// Every `loadgen run` option given here is each row's default (--model, --backend,
    /// --header, --api-key, TLS, --tokenizer, --seed, --slo, …); a row's own keys win.
    /// `--out` (required) is the matrix's folder.
    #[command(flatten)]
    pub run: RunArgs,
    /// The run options given on the command line, as words (filled by `cli::parse`).
    #[arg(skip)]
    pub defaults: Vec<String>,
}

/// One row ready to run.
struct PreparedRow {
    spec: RowSpec,
    args: RowArgs,
    folder: String,
}

/// `loadgen matrix`.
pub async fn matrix_command(args: MatrixArgs) -> Result<()> {
    if let (Some(Preset::Methodology), Some(path)) = (args.preset, &args.write) {
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
        return Ok(());
    }
    let (rows, source) = match (&args.file, args.preset) {
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
            bail!("loadgen matrix: {flag} is for run and sweep; a matrix's rows are judged by their `expect`");
        }
    }
    if !(args.scale.is_finite() && args.scale > 0.0) {
        bail!("--scale must be a positive number, not {}", args.scale);
    }
    let out = args
        .run
        .out
        .clone()
        .context("loadgen matrix: --out FOLDER is required")?;
    let rows = check_rows(&args, rows)?;
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
    let max_model_len = server_context(&args.run, &url).await;
    if let Some(len) = max_model_len {
        eprintln!("loadgen matrix: the server's context is {len} tokens; longer requests are clipped to it");
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
    // Fresh words for every invocation: a cold row shares nothing with what the server saw.
    let nonce = chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default() as u64;
    let total = rows.len();
    for (i, mut row) in rows.into_iter().enumerate() {
        if *stop.borrow() {
            file.stop_reason = Some(format!("interrupted before {}", row.spec.label()));
            break;
        }
        if server.as_mut().is_some_and(|s| s.exited()) {
            file.stop_reason = Some(format!(
                "the server exited before {}: see {}",
                row.spec.label(),
                out.join("server.log").display()
            ));
            break;
        }
        let run = row.args.run_mut();
        run.url = url.clone();
        if run.prompt_salt == 0 {
            run.prompt_salt = mix(nonce, i as u64 + 1);
        }
        if run.turns.is_none() {
            if let Some(len) = max_model_len {
                let room = if run.backend == crate::backend::Backend::Chat {
                    CHAT_TEMPLATE_ROOM
                } else {
                    0
                };
                let limit = len.saturating_sub(room);
                run.max_model_len = Some(run.max_model_len.map_or(limit, |own| own.min(limit)));
            }
        }
        eprintln!(
            "loadgen matrix: {} ({}/{}) → {}",
            row.spec.label(),
            i + 1,
            total,
            out.join(&row.folder).display()
        );
        let result = run_row(&args, &out, &row, &stop).await;
        let entry = match result {
            Ok(entry) => entry,
            Err(e) => {
                eprintln!("loadgen matrix: {}: {e:#}", row.spec.label());
                failed_row(&row, format!("{e:#}"))
            }
        };
        print_row(&entry);
        file.rows.push(entry);
        file.write(&path)?;
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
    let failed = file.rows.iter().filter(|r| r.error.is_some()).count();
    if let Some(reason) = &file.stop_reason {
        bail!(
            "loadgen matrix: stopped after {} row(s): {reason}",
            file.rows.len()
        );
    }
    if failed > 0 {
        bail!(
            "loadgen matrix: {failed} row(s) failed to run: see {}",
            path.display()
        );
    }
    Ok(())
}

/// Each row parsed with the matrix's defaults, scaled, and its plan built once (no
/// network), so that a bad row is refused before anything runs.
fn check_rows(args: &MatrixArgs, rows: Vec<RowSpec>) -> Result<Vec<PreparedRow>> {
    rows.into_iter()
        .map(|spec| {
            let mut row_args = spec.args(&args.defaults)?;
            scale_row(&mut row_args, args.scale)
                .with_context(|| format!("{} with --scale {}", spec.label(), args.scale))?;
            let run = row_args.run();
            let prepared =
                prepare_run(run).with_context(|| format!("{}: its workload", spec.label()))?;
            crate::bound_inputs::resolve(&run.bound, None)
                .with_context(|| format!("{}: the bound's inputs", spec.label()))?;
            if spec.prefix == Prefix::Warm && prefixes(&prepared.plan).is_empty() {
                bail!("{}, key `prefix`: `warm` sends the row's shared prefixes before its window, but its requests share none (give `prefix-len` and `prefix-groups`)", spec.label());
            }
            let folder = folder_name(&spec);
            Ok(PreparedRow {
                spec,
                args: row_args,
                folder,
            })
        })
        .collect()
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

/// `--scale`: lengths through `--length-scale`, durations multiplied here.
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

/// The server's context in tokens: `max_model_len` of the model in /v1/models (vLLM,
/// SGLang, `engine`), else llama.cpp's `n_ctx` in /props.
async fn server_context(run: &RunArgs, url: &str) -> Option<u32> {
    let headers = crate::options::parse_headers(&run.headers).ok()?;
    let tls = crate::tls::TlsSettings::new(&run.tls).ok();
    let identity = server_proc::identify(url, &headers, run.api_key.as_deref(), tls.as_ref()).await;
    let models = identity
        .models
        .as_ref()
        .and_then(|m| m["data"].as_array().cloned());
    let listed = models.and_then(|models| {
        let model = match &run.model {
            Some(name) => models
                .iter()
                .find(|m| m["id"].as_str() == Some(name.as_str())),
            None => models.first(),
        }?;
        model["max_model_len"].as_u64()
    });
    let props = identity
        .info
        .as_ref()
        .and_then(|i| i["default_generation_settings"]["n_ctx"].as_u64());
    listed.or(props).and_then(|n| u32::try_from(n).ok())
}

/// The distinct shared prefixes of a plan's requests, each as a request of its own.
fn prefixes(plan: &Plan) -> Vec<RequestSpec> {
    let mut seen = std::collections::HashSet::new();
    plan.requests
        .iter()
        .filter(|r| r.spec.prefix_group.is_some())
        .filter_map(|r| match &r.spec.prompt {
            PromptSource::Blocks(blocks) => blocks.first().copied(),
            PromptSource::Text(_) => None,
        })
        .filter(|block| seen.insert(block.key))
        .map(|block| RequestSpec {
            input_len: block.len,
            output_len: 1,
            prefix_group: None,
            prompt: PromptSource::Blocks(vec![block]),
        })
        .collect()
}

/// A warm row's prefixes, sent once each, one at a time, into `dir` (a run folder of its
/// own, so that what warmed the cache is on record).
async fn warm_prefixes(
    run: &RunArgs,
    dir: PathBuf,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<usize> {
    let mut prepared = prepare_run(run)?;
    let specs = prefixes(&prepared.plan);
    let n = specs.len();
    let mut specs = specs.into_iter();
    prepared.plan = Arc::new(Plan::closed(1, n, |_| {
        specs.next().expect("one prefix per request")
    }));
    let mut args = run.clone();
    args.slo = None;
    args.out = Some(dir.clone());
    eprintln!(
        "loadgen matrix: warming {n} shared prefix(es) → {}",
        dir.display()
    );
    let outcome = execute_prepared(
        &args,
        &prepared,
        Execution {
            url: run.url.clone(),
            out: Some(dir),
            server_version: None,
            extra: Default::default(),
            progress: false,
            stop: stop.clone(),
        },
    )
    .await?;
    if outcome.summary.failed > 0 {
        bail!(
            "{} of the {n} prefix warm-up requests failed: {:?}",
            outcome.summary.failed,
            outcome.summary.errors
        );
    }
    Ok(n)
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
    let mut row_args = match &row.args {
        RowArgs::Run(run) => RowArgs::Run(run.clone()),
        RowArgs::Search(sweep) => RowArgs::Search(sweep.clone()),
    };
    if row.spec.prefix == Prefix::Warm {
        warm_prefixes(row_args.run(), dir.join("prefix-warmup"), stop).await?;
    }
    let (summary, capacity, load) = match &mut row_args {
        RowArgs::Run(run) => {
            run.out = Some(dir.join("run"));
            let outcome = prepare_and_execute(run, stop.clone()).await?;
            print!("{}", reports::table::render(&outcome.summary));
            (Some(outcome.summary), None, load_text(run))
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
            let slo = sweep.run.slo.clone().unwrap_or_default();
            (knee, Some(capacity), format!("knee search under {slo}"))
        }
    };
    let folder = match &row.args {
        RowArgs::Run(_) => format!("{}/run", row.folder),
        RowArgs::Search(_) => format!("{}/sweep", row.folder),
    };
    Ok(measured_row(
        args,
        row,
        folder,
        load,
        summary.as_ref(),
        capacity,
    ))
}

/// The load of a one-run row in words.
fn load_text(run: &RunArgs) -> String {
    match (run.concurrency, run.arrival) {
        (Some(c), _) => format!("concurrency {c}"),
        (None, Some(crate::options::ArrivalKind::Trace)) => "the trace's timestamps".into(),
        (None, _) => format!("rate {} req/s", run.rate),
    }
}

/// The row's entry from its summary (a knee search: its knee level's) and bracket.
fn measured_row(
    args: &MatrixArgs,
    row: &PreparedRow,
    folder: String,
    load: String,
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
        name: row.spec.name.clone(),
        question: row.spec.question.clone(),
        hypothesis: row.spec.hypothesis.clone(),
        folder,
        load,
        prefix: row.spec.prefix.name().into(),
        verdict: row_verdict(&expectations),
        expectations,
        regime: diagnosis.map_or(reports::diagnosis::Regime::Undetermined, |d| d.regime),
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
        error: None,
    }
}

/// The entry of a row that did not run to its end.
fn failed_row(row: &PreparedRow, error: String) -> MatrixRow {
    MatrixRow {
        name: row.spec.name.clone(),
        question: row.spec.question.clone(),
        hypothesis: row.spec.hypothesis.clone(),
        folder: row.folder.clone(),
        load: String::new(),
        prefix: row.spec.prefix.name().into(),
        verdict: Verdict::Inconclusive,
        expectations: Vec::new(),
        regime: reports::diagnosis::Regime::Undetermined,
        regime_evidence: "the row failed before a measurement".into(),
        tpot_p50_ms: None,
        bound_tpot_ms: None,
        tpot_over_bound: None,
        output_tok_per_s: None,
        usd_per_million_output_tokens: None,
        capacity: None,
        error: Some(error),
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
