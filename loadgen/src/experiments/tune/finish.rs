//! The end of a tune: the two best configurations compared in alternating rounds, the
//! winner picked and its capacity plan written, the summary printed.

use std::path::{Path, PathBuf};

use anyhow::Result;
use reports::capacity::{capacity_plan, PlanOptions};
use reports::comparison::{analyse_rounds, AnalysisOptions, PairMode};
use reports::folders::load_sweep;
use reports::render::views::tune_report;
use reports::render::write_report;
use reports::slo::SloSpec;
use reports::tune::results::{beyond_between_runs, ranking, separation};
use reports::tune::{Duel, Pick, Separation, TuneFile, TUNE_FILE};

use crate::experiments::compare::run_rounds;
use crate::spec::compare::ServerSpec;
use crate::spec::sweep::min_requests;
use crate::spec::tune::{Strategy, TuneArgs};
use crate::spec::RunSpec;

/// Ranks the configurations, compares the two best (a guided walk: its end and its start)
/// when `compare` and both exist, plans from the winner, and writes `tune.json` and the
/// report.
pub(super) async fn finish(
    args: &TuneArgs,
    spec: &RunSpec,
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
    // A guided walk is judged where it ended against where it started; the others by rank.
    let (mut winner, mut runner_up) = match args.strategy {
        Strategy::Guided => super::guided::end_and_start(file),
        _ => (ranked.first().copied(), ranked.get(1).copied()),
    };
    if let (Some(best), Some(second), true) = (winner, runner_up, compare) {
        let (duel, mut verdict) = duel(args, spec, out, file, slo, best, second).await;
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
    spec: &RunSpec,
    out: &Path,
    file: &TuneFile,
    slo: &SloSpec,
    best: usize,
    second: usize,
) -> (Duel, Separation) {
    let (a, b) = (&file.configurations[best], &file.configurations[second]);
    let rate = b.capacity_offered_rate.unwrap_or_default();
    let dir: PathBuf = out.join("duel");
    // A replayed trace is rescaled to the rate, as a search level is; otherwise Poisson.
    let mut run = spec.at_rate(rate, dir.clone());
    run.slo = None;
    run.slo_text = None;
    // Each round holds as many requests as a level of the search: enough for the SLO's
    // percentile.
    if let Ok(min) = min_requests(args.min_requests.as_deref(), Some(slo)) {
        run = run.lengthened_to(rate, min);
    }
    eprintln!(
        "loadgen tune: comparing configuration {} (A) with {} (B) at {rate} req/s, {} rounds each → {}",
        best + 1,
        second + 1,
        args.rounds,
        dir.display()
    );
    let analysed = async {
        let (a_rounds, b_rounds) = run_rounds(
            &run,
            args.rounds,
            args.server_timeout,
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
    for (i, step) in file.steps.iter().enumerate() {
        let regime = step
            .regime
            .map_or("no regime".to_string(), |r| r.to_string());
        let moved = match (&step.knob, &step.from, &step.to) {
            (Some(knob), Some(from), Some(to)) => format!("{knob} {from} → {to}"),
            _ => "no move".to_string(),
        };
        let kept = match step.kept {
            Some(true) => "kept",
            Some(false) => "not kept",
            None => "",
        };
        println!(
            "step {}: {} read {regime} {}; {moved} {kept}{}{}",
            i + 1,
            step.base,
            step.evidence,
            if step.why.is_empty() { "" } else { ": " },
            step.why
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
