//! `loadgen tune`: the server configuration that serves the most under the SLO. For each
//! configuration of the knobs (see `knobs`): a fresh server from the command template, a
//! knee search for its capacity (`sweep --rates search`), the server stopped. Then the two
//! best run again in alternating rounds at the runner-up's capacity (`compare`'s paired
//! analysis, each round as long as a search level): the best wins outright only when an SLO
//! metric is significantly better for it beyond `--min-effect`, in the median or the tail
//! (`reports::tune::results::separation`), and with `--repeats` only when its runs' crossings
//! also exceed the runner-up's beyond their spread (`beyond_between_runs`); otherwise the one
//! listed first in the knob lists is kept.
//!
//! Layout of `--out`: `tune.json` (rewritten after every configuration), `config-NN/`
//! (`server.log` and the search's `sweep/`), `duel/` (the comparison's rounds), and the
//! report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::ab::DEFAULT_ALPHA;
use reports::plan::{capacity_plan, PlanOptions};
use reports::render::write_report;
use reports::slo::SloSpec;
use reports::tune::{
    ConfigStatus, Configuration, Duel, Knobs, Pick, Separation, TuneFile, TUNE_FILE,
};

use crate::commands::compare::{run_rounds, CompareArgs, ServerSpec};
use crate::commands::plan::SizingArgs;
use crate::commands::sweep::{
    min_requests, run_sweep, sized_level, SweepArgs, DEFAULT_PROBE_DURATION,
    DEFAULT_PROBE_MAX_CONCURRENCY,
};
use crate::knee_search::{SearchArgs, DEFAULT_MAX_LEVELS};
use crate::knobs::{self, Knob, Strategy};
use crate::options::{ArrivalKind, RunArgs};
use crate::server_proc;
use crate::stop::stop_on_signals;
use crate::units::{duration_arg, parse_fraction};
use reports::comparison::{analyse_rounds, AnalysisOptions, PairMode};
use reports::folders::load_sweep;
use reports::render::views::tune_report;
use reports::tune::results::{
    beyond_between_runs, measure, measuring_options, ranking, separation,
};

/// `--url`, `--rate` and `--concurrency` are the tune's to set: given, they are refused.
#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("url", |a| a
        .conflicts_with("server_cmd")
        .help("Set by each configuration's server: refused here")
        .long_help(None::<&str>)),
    mut_arg("rate", |a| a
        .conflicts_with("server_cmd")
        .help("Set by each level of the knee search: refused here")
        .long_help(None::<&str>)),
    mut_arg("target_rate", |a| a
        .conflicts_with("server_cmd")
        .help("Set by each level of the knee search with --arrival trace: refused here")
        .long_help(None::<&str>)),
    mut_arg("fail_on_slo", |a| a
        .conflicts_with("server_cmd")
        .help("tune always exits 3 when no configuration meets the SLO: refused here")
        .long_help(None::<&str>)),
    mut_arg("concurrency", |a| a
        .conflicts_with("server_cmd")
        .help("The knee search runs open-loop levels: refused here")
        .long_help(None::<&str>)),
    mut_arg("out", |a| a.help("The tune's folder: tune.json, one folder per configuration, the report"))
)]
pub struct TuneArgs {
    /// The server command, with `{port}` and one `{NAME}` per --knob, each value put in
    /// verbatim (e.g. "./target/release/engine serve --port {port} --max-num-seqs {seqs}").
    #[arg(long)]
    pub server_cmd: String,
    /// A knob and its values in order of cost, cheapest first: NAME=V1,V2,… (repeatable; a
    /// value may hold a whole flag, `prefix=--enable-prefix-caching,--no-enable-prefix-caching`).
    #[arg(long = "knob", required = true)]
    pub knobs: Vec<String>,
    /// one-at-a-time: each knob in turn over its values, the others at the best found so
    /// far; grid: every combination.
    #[arg(long, value_enum, default_value = "one-at-a-time")]
    pub strategy: Strategy,
    /// How long a started server may take to answer GET /health with 200.
    #[arg(long, value_parser = duration_arg, default_value = "300s")]
    pub server_timeout: Duration,
    /// The measured length of each closed-loop probe step of a knee search [default: 10s].
    #[arg(long, value_parser = duration_arg)]
    pub probe_duration: Option<Duration>,
    /// The largest probe concurrency of a knee search [default: 256].
    #[arg(long)]
    pub probe_max_concurrency: Option<usize>,
    /// As for `sweep`: each level holds at least this many measured requests (`auto`, the
    /// default: as many as the SLO's highest percentile needs).
    #[arg(long)]
    pub min_requests: Option<String>,
    #[command(flatten)]
    pub search: SearchArgs,
    /// Rounds per side of the comparison of the two best configurations.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// The smallest effect that matters in that comparison, as a share of the best
    /// configuration's median: `2%` or `0.02`.
    #[arg(long, value_parser = parse_fraction, default_value = "2%")]
    pub min_effect: f64,
    #[arg(long, default_value_t = DEFAULT_ALPHA)]
    pub alpha: f64,
    /// Run-to-run variation, measured: each configuration's search repeats the ends of its
    /// final bracket R − 1 more times (as `sweep --repeats`), so its capacity carries the
    /// between-run interval; the winner is "better" only when, beside the comparison of the
    /// two best, its runs' crossings exceed the runner-up's beyond their spread (Welch's
    /// t-test at --alpha).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
    /// The winner's capacity plan (none without --target-qps or --daily-requests).
    #[command(flatten)]
    pub sizing: SizingArgs,
    /// Every `loadgen run` option applies to each configuration's knee search (the workload,
    /// --model, --backend, --warmup, --duration, --seed, --slo, …) but --url, --rate and
    /// --concurrency; `--out` (required) is the tune's folder.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `loadgen tune`.
pub async fn tune_command(args: TuneArgs) -> Result<()> {
    let out = args
        .run
        .out
        .clone()
        .context("loadgen tune: --out FOLDER is required")?;
    let slo_text = args
        .run
        .slo
        .clone()
        .context("loadgen tune: give --slo (e.g. ttft:p90:2s,tpot:p90:100ms): a configuration's capacity is the most it serves under it")?;
    let slo = SloSpec::parse(&slo_text)?;
    if args.run.shard.is_some() || args.run.start_at.is_some() {
        bail!("loadgen tune: --shard / --start-at are for run and sweep");
    }
    if args.run.turns.is_some() {
        bail!("loadgen tune with --turns: a knee search's probe is a closed loop of single requests, which sessions are not");
    }
    let knobs: Vec<Knob> = args
        .knobs
        .iter()
        .map(|k| knobs::parse_knob(k))
        .collect::<Result<_>>()?;
    knobs::check_template(&args.server_cmd, &knobs)?;
    let plan_options = args.sizing.options(args.run.seed);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    print_budget(&args, &knobs);

    let mut file = TuneFile {
        schema_version: 1,
        slo: slo_text,
        strategy: args.strategy.name().into(),
        template: args.server_cmd.clone(),
        knobs: knobs
            .iter()
            .map(|k| (k.name.clone(), k.values.clone()))
            .collect(),
        winner: None,
        runner_up: None,
        winner_vs_runner_up: Separation::NotCompared,
        between_runs: None,
        duel: None,
        configurations: Vec::new(),
        plan: None,
        stop_reason: None,
    };
    let stop = stop_on_signals()?;
    let grid = knobs::grid(&knobs);
    loop {
        let next = match args.strategy {
            Strategy::Grid => grid.get(file.configurations.len()).cloned(),
            Strategy::OneAtATime => {
                let ran: Vec<(Knobs, Option<f64>)> = file
                    .configurations
                    .iter()
                    .map(|c| (c.knobs.clone(), c.capacity))
                    .collect();
                knobs::one_at_a_time_next(&knobs, &ran)
            }
        };
        let Some(next) = next else { break };
        if *stop.borrow() {
            file.stop_reason = Some("interrupted (Ctrl-C or SIGTERM)".into());
            break;
        }
        let result = run_configuration(&args, &out, &file, next, &stop, &slo).await;
        match result {
            Ok(config) => {
                let interrupted = config.status == ConfigStatus::Interrupted;
                file.configurations.push(config);
                file.write(&out.join(TUNE_FILE))?;
                if interrupted {
                    file.stop_reason = Some("interrupted (Ctrl-C or SIGTERM)".into());
                    break;
                }
            }
            Err(e) => {
                file.stop_reason = Some(format!("{e:#}"));
                finish(&args, &out, &mut file, &slo, &plan_options, false).await?;
                return Err(e);
            }
        }
    }
    let interrupted = file.stop_reason.is_some();
    finish(&args, &out, &mut file, &slo, &plan_options, !interrupted).await?;
    if *stop.borrow() && !interrupted {
        file.stop_reason = Some("interrupted during the comparison of the two best".into());
        file.write(&out.join(TUNE_FILE))?;
    }
    if file.stop_reason.is_some() {
        bail!(
            "loadgen tune: interrupted after {} configuration(s); results in {}",
            file.configurations.len(),
            out.join(TUNE_FILE).display()
        );
    }
    if file.winner.is_none() {
        return Err(crate::gate::Gate {
            code: crate::gate::SLO_NOT_MET,
            message: "loadgen tune: no configuration meets the SLO".into(),
        }
        .into());
    }
    Ok(())
}

/// Prints how many configurations will run and how long that may take at most.
fn print_budget(args: &TuneArgs, knobs: &[Knob]) {
    let n = knobs::count(args.strategy, knobs);
    let probe_step = args
        .probe_duration
        .unwrap_or(DEFAULT_PROBE_DURATION)
        .mul_f64(1.25);
    let probe_steps = (args
        .probe_max_concurrency
        .unwrap_or(DEFAULT_PROBE_MAX_CONCURRENCY)
        .max(1) as f64)
        .log2()
        .ceil() as u32
        + 1;
    let level = args.run.warmup + args.run.duration.unwrap_or_default() + args.run.cooldown;
    let levels = args.search.max_levels.unwrap_or(DEFAULT_MAX_LEVELS) as u32;
    let per_config = probe_step * probe_steps + level * levels;
    let duel = (args.run.warmup + args.run.duration.unwrap_or_default()) * (2 * args.rounds as u32);
    let total = per_config * n as u32 + duel;
    let per_level = if args.run.duration.is_some() {
        format!("{:.0} s", level.as_secs_f64())
    } else {
        "--num-prompts requests".into()
    };
    eprintln!(
        "loadgen tune: {n} configuration(s) ({}); each at most a probe of {probe_steps} steps of \
         {:.0} s and {levels} levels of {per_level} (a level lengthened to hold the SLO's \
         percentile at a low rate takes longer), plus a comparison of {} runs: about {:.0} min \
         with levels of that length, server start-ups aside",
        args.strategy.name(),
        probe_step.as_secs_f64(),
        2 * args.rounds,
        total.as_secs_f64() / 60.0
    );
}

/// One configuration: a fresh server, its knee search, the server stopped.
async fn run_configuration(
    args: &TuneArgs,
    out: &Path,
    file: &TuneFile,
    knobs: Knobs,
    stop: &tokio::sync::watch::Receiver<bool>,
    slo: &SloSpec,
) -> Result<Configuration> {
    let index = file.configurations.len();
    let dir = format!("config-{index:02}");
    let command = knobs::fill(&args.server_cmd, &knobs);
    let percentile = slo.targets.iter().map(|t| t.percentile).fold(0.0, f64::max);
    let mut config = Configuration::new(knobs, command.clone(), dir.clone(), percentile);
    let log = out.join(&dir).join("server.log");
    eprintln!(
        "loadgen tune: configuration {} → {}: {command}",
        index + 1,
        out.join(&dir).display()
    );
    let mut server = match server_proc::start(&command, &log, args.server_timeout).await {
        Ok(server) => server,
        Err(e) => {
            // Ctrl-C reaches a starting server too: then it did not fail, the tune stopped.
            if *stop.borrow() {
                config.status = ConfigStatus::Interrupted;
                return Ok(config);
            }
            eprintln!(
                "loadgen tune: configuration {} failed to start: {e:#}",
                index + 1
            );
            config.status = ConfigStatus::FailedToStart;
            config.log_tail = Some(server_proc::log_tail(&log));
            return Ok(config);
        }
    };
    let sweep_dir = out.join(&dir).join("sweep");
    let sweep = search_args(args, &server.url, &sweep_dir);
    let result = run_sweep(&sweep, stop.clone()).await;
    let died = server.exited();
    server.stop().await?;
    if *stop.borrow() {
        config.status = ConfigStatus::Interrupted;
    } else if died {
        config.status = ConfigStatus::Died;
        config.log_tail = Some(server_proc::log_tail(&log));
    }
    let measured = match result {
        Ok(_) if config.status == ConfigStatus::Ok => measure(
            &mut config,
            &sweep_dir,
            slo,
            &measuring_options(args.run.seed),
        )
        .map(|_| ()),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = measured {
        eprintln!("loadgen tune: configuration {}: {e:#}", index + 1);
        if config.status == ConfigStatus::Ok {
            config.status = ConfigStatus::SearchFailed;
        }
        config.log_tail = Some(format!(
            "{e:#}\n--- the end of {} ---\n{}",
            log.display(),
            server_proc::log_tail(&log)
        ));
    }
    Ok(config)
}

/// The knee search of one configuration, against `url`, into `sweep_dir`.
fn search_args(args: &TuneArgs, url: &str, sweep_dir: &Path) -> SweepArgs {
    let mut run = args.run.clone();
    run.url = url.to_string();
    run.out = Some(sweep_dir.to_path_buf());
    SweepArgs {
        rates: "search".into(),
        require_rate: None,
        auto_fractions: None,
        probe_duration: args.probe_duration,
        probe_max_concurrency: args.probe_max_concurrency,
        search: args.search.clone(),
        repeats: args.repeats,
        min_requests: args.min_requests.clone(),
        level_period: None,
        run,
    }
}

/// Ranks the configurations, compares the two best (when `compare` and both exist), plans
/// from the winner, and writes `tune.json` and the report.
async fn finish(
    args: &TuneArgs,
    out: &Path,
    file: &mut TuneFile,
    slo: &SloSpec,
    plan_options: &Option<PlanOptions>,
    compare: bool,
) -> Result<()> {
    let ranked = ranking(file);
    let pick = |i: usize| Pick {
        knobs: file.configurations[i].knobs.clone(),
        command: file.configurations[i].command.clone(),
    };
    let (mut winner, mut runner_up) = (ranked.first().copied(), ranked.get(1).copied());
    if let (Some(best), Some(second), true) = (winner, runner_up, compare) {
        let (duel, mut verdict) = duel(args, out, file, slo, best, second).await;
        file.duel = Some(duel);
        if args.repeats > 1 {
            let (beyond, why) = beyond_between_runs(
                &file.configurations[best],
                &file.configurations[second],
                args.alpha,
            );
            if !beyond && verdict == Separation::Better {
                verdict = Separation::Indistinguishable;
            }
            eprintln!("loadgen tune: between runs: {why}");
            file.between_runs = Some(why);
        }
        file.winner_vs_runner_up = verdict;
        let order = |i: usize| file.value_order(&file.configurations[i].knobs);
        if verdict == Separation::Indistinguishable && order(second) < order(best) {
            (winner, runner_up) = (Some(second), Some(best));
        }
    }
    file.winner = winner.map(pick);
    file.runner_up = runner_up.map(pick);
    if let (Some(w), Some(options)) = (winner, plan_options) {
        let dir = out.join(&file.configurations[w].dir).join("sweep");
        file.plan = Some(capacity_plan(&load_sweep(&dir)?.levels, slo, options)?);
    }
    file.write(&out.join(TUNE_FILE))?;
    print_summary(file);
    let (_, html) = write_report(out, &tune_report(out)?)?;
    println!(
        "tune: {}  report: {}",
        out.join(TUNE_FILE).display(),
        html.display()
    );
    Ok(())
}

/// The paired comparison of the best (A) and the runner-up (B), at the offered rate at which
/// the runner-up sustained its capacity.
async fn duel(
    args: &TuneArgs,
    out: &Path,
    file: &TuneFile,
    slo: &SloSpec,
    best: usize,
    second: usize,
) -> (Duel, Separation) {
    let (a, b) = (&file.configurations[best], &file.configurations[second]);
    let rate = b.capacity_offered_rate.unwrap_or_default();
    let dir: PathBuf = out.join("duel");
    let mut run = args.run.clone();
    run.rate = rate;
    // A replayed trace is rescaled to the rate, as a search level is; otherwise Poisson.
    match run.arrival {
        Some(ArrivalKind::Trace) => run.target_rate = Some(rate),
        None => run.arrival = Some(ArrivalKind::Poisson),
        Some(_) => {}
    }
    run.out = Some(dir.clone());
    run.slo = None;
    // Each round holds as many requests as a level of the search: enough for the SLO's
    // percentile.
    if let Ok(min) = min_requests(args.min_requests.as_deref(), Some(slo)) {
        sized_level(&mut run, rate, min);
    }
    let compare = CompareArgs {
        a_dir: None,
        b_dir: None,
        a_url: None,
        b_url: None,
        a_cmd: Some(a.command.clone()),
        b_cmd: Some(b.command.clone()),
        rounds: args.rounds,
        server_timeout: args.server_timeout,
        pair: PairMode::Auto,
        alpha: args.alpha,
        min_effect: args.min_effect,
        bootstrap_seed: args.run.seed,
        fail_on_regression: false,
        metrics: Vec::new(),
        fail_on_inconclusive: false,
        run,
    };
    eprintln!(
        "loadgen tune: comparing configuration {} (A) with {} (B) at {rate} req/s, {} rounds each → {}",
        best + 1,
        second + 1,
        args.rounds,
        dir.display()
    );
    let analysed = async {
        let (a_rounds, b_rounds) = run_rounds(
            &compare,
            &ServerSpec::Command(a.command.clone()),
            &ServerSpec::Command(b.command.clone()),
            &dir,
        )
        .await?;
        analyse_rounds(
            a_rounds,
            b_rounds,
            AnalysisOptions {
                pair: PairMode::Auto,
                alpha: args.alpha,
                min_effect: args.min_effect,
                bootstrap_seed: args.run.seed,
                print: true,
            },
            &dir,
        )
    }
    .await;
    let mut duel = Duel {
        offered_rate: rate,
        dir: "duel".into(),
        verdicts: Vec::new(),
        error: None,
    };
    match analysed {
        Ok(compared) => {
            let (verdict, verdicts) = separation(&compared.analysis, slo);
            duel.verdicts = verdicts;
            (duel, verdict)
        }
        Err(e) => {
            duel.error = Some(format!("{e:#}"));
            (duel, Separation::NotCompared)
        }
    }
}

fn print_summary(file: &TuneFile) {
    for (i, c) in file.configurations.iter().enumerate() {
        let knobs: Vec<String> = file
            .knobs
            .iter()
            .filter_map(|(name, _)| c.knobs.get(name).map(|v| format!("{name}={v}")))
            .collect();
        let mut interval = match (c.capacity_low, c.capacity_high) {
            (Some(low), Some(high)) => format!(" (bracket {low:.3}–{high:.3})"),
            _ => String::new(),
        };
        if let Some(ci) = c.crossing_between_runs {
            interval.push_str(&format!(
                " (crossing between runs {:.3} [{:.3}, {:.3}])",
                ci.estimate, ci.lower, ci.upper
            ));
        }
        println!(
            "{:>3}. {:<40} {:<16} capacity {}{interval}",
            i + 1,
            knobs.join(" "),
            serde_json::to_value(c.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            c.capacity
                .map_or("none (SLO not met)".into(), |r| format!("{r:.3} req/s")),
        );
    }
    match &file.winner {
        Some(w) => println!(
            "winner ({}): {}",
            serde_json::to_value(file.winner_vs_runner_up)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            w.command
        ),
        None => println!("no configuration meets the SLO"),
    }
}
