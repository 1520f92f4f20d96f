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

pub mod finish;
pub mod guided;
pub mod knobs;

use std::path::Path;

use anyhow::{bail, Context, Result};
use reports::slo::SloSpec;
use reports::tune::results::{measure, measuring_options};
use reports::tune::{ConfigStatus, Configuration, Knobs, Separation, TuneFile, TUNE_FILE};

use crate::experiments::server;
use crate::experiments::sweep::run_sweep;
use crate::spec::search::DEFAULT_MAX_LEVELS;
use crate::spec::sweep::{SweepArgs, DEFAULT_PROBE_DURATION, DEFAULT_PROBE_MAX_CONCURRENCY};
use crate::spec::tune::Strategy;
use crate::spec::tune::TuneArgs;
use crate::spec::RunSpec;
use finish::finish;
use knobs::Knob;

/// Runs the tune into `--out` (`tune.json`, a folder per configuration, the report) and
/// returns `tune.json`'s contents; `stop` ends it early, keeping what finished.
pub async fn run_tune(
    args: &TuneArgs,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<TuneFile> {
    let out = args
        .run
        .out
        .clone()
        .context("loadgen tune: --out FOLDER is required")?;
    if args.run.shard.is_some() || args.run.start_at.is_some() {
        bail!("loadgen tune: --shard / --start-at are for run and sweep");
    }
    if let Some(flag) = args.run.sessions_flag() {
        bail!("loadgen tune with {flag}: a knee search's probe is a closed loop of single requests, which sessions are not");
    }
    let spec = RunSpec::from_args(&args.run)?;
    if spec.links_sessions() {
        bail!("loadgen tune with a trace that links turns into sessions: a knee search's probe is a closed loop of single requests, which sessions are not");
    }
    let (Some(slo), Some(slo_text)) = (spec.slo.clone(), spec.slo_text.clone()) else {
        bail!("loadgen tune: give --slo (e.g. ttft:p90:2s,tpot:p90:100ms): a configuration's capacity is the most it serves under it");
    };
    let knobs: Vec<Knob> = args
        .knobs
        .iter()
        .map(|k| knobs::parse_knob(k))
        .collect::<Result<_>>()?;
    knobs::check_template(&args.server_cmd, &knobs)?;
    if args.strategy != Strategy::Guided && !args.knob_roles.is_empty() {
        bail!("--knob-role: only --strategy guided moves knobs by their role");
    }
    let guide = guided::Guide {
        roles: match args.strategy {
            Strategy::Guided => guided::knob_roles(&args.server_cmd, &knobs, &args.knob_roles)?,
            _ => Vec::new(),
        },
        repeats: args.repeats,
        alpha: args.alpha,
        min_effect: args.min_effect,
    };
    let plan_options = args.sizing.options(args.run.seed);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    print_budget(args, &knobs);

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
        steps: Vec::new(),
        plan: None,
        stop_reason: None,
    };
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
            Strategy::Guided => {
                let next = guided::next(&out, &knobs, &mut file, &guide);
                file.write(&out.join(TUNE_FILE))?;
                next
            }
        };
        let Some(next) = next else { break };
        if *stop.borrow() {
            file.stop_reason = Some("interrupted (Ctrl-C or SIGTERM)".into());
            break;
        }
        let result = run_configuration(args, &out, &file, next, &stop, &slo).await;
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
                finish(args, &spec, &out, &mut file, &slo, &plan_options, false).await?;
                return Err(e);
            }
        }
    }
    let interrupted = file.stop_reason.is_some();
    finish(
        args,
        &spec,
        &out,
        &mut file,
        &slo,
        &plan_options,
        !interrupted,
    )
    .await?;
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
    Ok(file)
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
    let mut server = match server::start(&command, &log, args.server_timeout).await {
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
            config.log_tail = Some(server::log_tail(&log));
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
        config.log_tail = Some(server::log_tail(&log));
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
            server::log_tail(&log)
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
