//! `loadgen sweep`: the same seeded workload at a series of offered rates, one level after
//! another. A list of rates (or `--rates auto`: fractions of the saturation rate that a
//! closed-loop probe finds, see `probe`) runs in ascending order and stops after the first
//! level that saturates (see `reports::saturation`) or breaks the SLO; `--rates search` starts at the
//! probe's estimate and chooses each next rate from the levels so far (see `knee_search`).
//!
//! Every probe step and level sends the seeded workload with words of its own (the
//! `--prompt-salt` mixed with its index), so that none finds an earlier one's prompts in
//! the server's prefix cache: the seed alone would send request i the same prompt at every
//! level.
//!
//! Layout of the output folder: `sweep.json` (levels, the search path and why the sweep
//! stopped, rewritten after every level so a cut-short sweep stays readable) and one run
//! folder per level (`level-00/`, …) as `loadgen run --out` writes it. A level cut short by
//! a stop keeps its folder but is not in `sweep.json` (the stop reason names it).
pub mod knee_search;
mod levels;
pub mod probe;
mod search;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use reports::folders::{Probe, SweepFile, SWEEP_FILE};
use reports::render::views::sweep_report;
use reports::render::write_report;
use reports::search::SearchPath;
use reports::slo::SloVerdict;

use crate::experiments::sweep::probe::auto_levels;
use crate::spec::sweep::{
    min_requests, parse_rates, refuse_unused, sharded_timetable, Rates, SweepArgs,
    DEFAULT_AUTO_FRACTIONS,
};
use crate::spec::RunSpec;
use levels::{cut_level, probe, LevelRun, Levels};
pub use levels::{level_warmup, repeat_seed};
use search::{run_search, run_search_repeats};

/// When a level is saturated, printed under the sweep beside the rates' definitions.
pub const SATURATION_RULE: &str = "A level is saturated when, each beyond noise (one-sided p < \
0.01), its schedule asked more than the server's capacity (its ends per second while requests \
waited for it) or it carried fewer than 95% of its requests; never when the server's waiting \
gauge read 0 throughout the window, every request succeeded and none waited for --max-concurrency; \
unclear with fewer than 10 successful requests.";

/// Runs the sweep into `--out` (`sweep.json`, the level folders, the report) and returns
/// `sweep.json`'s contents; `stop` ends it early, keeping what finished.
pub async fn run_sweep(
    args: &SweepArgs,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<SweepFile> {
    let out: PathBuf = args
        .run
        .out
        .clone()
        .context("loadgen sweep: --out FOLDER is required")?;
    if args.run.concurrency.is_some() {
        bail!("loadgen sweep: --concurrency (closed loop) cannot be combined with --rates");
    }
    let rates = parse_rates(&args.rates)?;
    refuse_unused(args, &rates)?;
    if let (true, Some(flag)) = (args.run.exact_rate, args.run.sessions_flag()) {
        bail!("loadgen sweep --exact-rate with {flag}: a session's later turns follow its answers, so no factor fixes their rate; session levels run their raw draw");
    }
    // The sweep's own refusals come before the run options' (which would ask a sharded
    // sweep without --start-at for it, or sessions for --backend chat, before saying why).
    let timetable = sharded_timetable(args)?;
    if let (false, Some(flag)) = (matches!(rates, Rates::List(_)), args.run.sessions_flag()) {
        bail!(
            "loadgen sweep --rates {} with {flag}: the saturation probe is a closed loop of \
             single requests, which sessions are not; give the session rates (--rates 0.5,1,2)",
            args.rates
        );
    }
    let spec = RunSpec::from_args(&args.run)?;
    if !matches!(rates, Rates::List(_)) && spec.links_sessions() {
        bail!(
            "loadgen sweep --rates {} with a trace that links turns into sessions: the saturation \
             probe is a closed loop of single requests, which sessions are not; give the rates \
             (--rates 0.5,1,2: the trace rescaled to each, in turns/s)",
            args.rates
        );
    }
    let slo = spec.slo.clone();
    if rates == Rates::Search && slo.is_none() {
        bail!("loadgen sweep --rates search looks for where the SLO breaks: give --slo (e.g. ttft:p90:2s,tpot:p90:100ms)");
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let min_requests = min_requests(args.min_requests.as_deref(), slo.as_ref())?;
    let repeats = args.repeats as usize;
    if repeats > 1 && timetable.is_some() {
        bail!("loadgen sweep --repeats {repeats} with --shard: repeats run after the levels they repeat, which a timetable fixed in advance cannot hold; run each shard's sweep again instead");
    }
    let mut file = SweepFile {
        schema_version: 1,
        slo: args.run.slo.clone(),
        rates: Vec::new(),
        probe: None,
        search: None,
        repeats,
        levels: Vec::new(),
        stop_reason: None,
    };
    let mut levels = Levels {
        spec: &spec,
        out: &out,
        slo: slo.as_ref(),
        min_requests,
        timetable,
        probe: None,
        stop: stop.clone(),
    };
    match rates {
        Rates::List(rates) => {
            file.rates = rates;
            run_fixed_levels(&levels, &mut file).await?;
        }
        Rates::Auto => {
            let probe = probe(args, &spec, slo.as_ref(), false, stop.clone()).await?;
            let fractions = args
                .auto_fractions
                .clone()
                .unwrap_or(DEFAULT_AUTO_FRACTIONS.to_vec());
            file.rates = auto_levels(probe.saturation_rate, &fractions)?;
            eprintln!("loadgen sweep: levels {:?} req/s", file.rates);
            levels.probe = Some(probe.clone());
            file.probe = Some(Probe { fractions, ..probe });
            run_fixed_levels(&levels, &mut file).await?;
        }
        Rates::Search => {
            let probe = probe(args, &spec, slo.as_ref(), true, stop.clone()).await?;
            let path = args.search.settings(probe.saturation_rate)?;
            let unloaded_missed = probe.steps.first().is_some_and(|s| {
                s.concurrency == 1 && (s.slo_verdict == Some(SloVerdict::NotMet) || s.slo_missed)
            });
            levels.probe = Some(probe.clone());
            file.probe = Some(probe);
            run_search(&levels, &mut file, path, unloaded_missed).await?;
            run_search_repeats(&levels, &mut file).await?;
        }
    }
    println!("{} {SATURATION_RULE}", reports::rates::DEFINITIONS);
    for level in &file.levels {
        let (scheduled, completed) = level.rates.map_or(("–".into(), "–".into()), |r| {
            (format!("{:.3}", r.scheduled), format!("{:.3}", r.completed))
        });
        let saturation = level.saturation.as_ref().map_or(
            if level.saturated { "yes" } else { "no" }.to_string(),
            |s| format!("{} ({})", format!("{:?}", s.state).to_lowercase(), s.rule),
        );
        let repeat = level
            .repeat
            .map_or(String::new(), |r| format!("  (repeat {r})"));
        println!(
            "{:>8.3} offered  {scheduled:>8} scheduled  {completed:>8} completed/s  {:>8.1} tok/s  SLO: {:<17}  saturation: {saturation}{repeat}",
            level.offered_rate,
            level.output_tokens_per_s,
            level.slo_verdict.map_or("–".to_string(), |v| v.to_string()),
        );
    }
    if let Some(search) = &file.search {
        print_search(search);
    }
    if file.levels.is_empty() {
        println!(
            "sweep: {}  no level ran: {}",
            out.join(SWEEP_FILE).display(),
            file.stop_reason.as_deref().unwrap_or("interrupted")
        );
    } else {
        let (_, html) = write_report(&out, &sweep_report(&out)?)?;
        println!(
            "sweep: {}  report: {}",
            out.join(SWEEP_FILE).display(),
            html.display()
        );
    }
    Ok(file)
}

/// The levels of `file.rates` in order, stopping after the first that saturates or breaks
/// the SLO (a sharded sweep runs them all: no worker can stop alone); with `--repeats R`,
/// the levels that ran then run R − 1 more times, in the same order.
async fn run_fixed_levels(levels: &Levels<'_>, file: &mut SweepFile) -> Result<()> {
    let path = levels.out.join(SWEEP_FILE);
    file.write(&path)?;
    let rates = file.rates.clone();
    for (i, &rate) in rates.iter().enumerate() {
        if levels.interrupted() {
            file.stop_reason = Some(format!("interrupted before the level at {rate} req/s"));
            file.write(&path)?;
            break;
        }
        let first = LevelRun {
            doubled: false,
            repeat: 0,
        };
        let (entry, check) = levels.run(i, rate, first).await?;
        if levels.interrupted() {
            file.stop_reason = Some(cut_level(rate, &entry.dir));
            file.write(&path)?;
            return Ok(());
        }
        let saturated = entry.saturated;
        let rule = entry
            .saturation
            .as_ref()
            .map(|s| s.rule.clone())
            .unwrap_or_default();
        file.levels.push(entry);
        let last = i + 1 == rates.len() || levels.timetable.is_some();
        if saturated && !last {
            file.stop_reason = Some(format!("saturated at {rate} req/s: {rule}"));
        } else if let Some(c) = check.as_ref().filter(|c| c.verdict == SloVerdict::NotMet) {
            // Higher rates only break it further: the knee lies below this level.
            if !last {
                file.stop_reason = Some(format!(
                    "SLO broken at {rate} req/s (a percentile at {:.2}× its limit)",
                    c.worst_ratio()
                ));
            }
        }
        file.write(&path)?;
        if let Some(reason) = &file.stop_reason {
            eprintln!("loadgen sweep: stopping: {reason}");
            break;
        }
    }
    if levels.interrupted() {
        return Ok(());
    }
    let ran: Vec<f64> = file.levels.iter().map(|l| l.offered_rate).collect();
    for repeat in 1..file.repeats {
        for &rate in &ran {
            if levels.interrupted() {
                file.stop_reason = Some(format!(
                    "interrupted before repeat {repeat} at {rate} req/s"
                ));
                file.write(&path)?;
                return Ok(());
            }
            let how = LevelRun {
                doubled: false,
                repeat,
            };
            let (entry, _) = levels.run(file.levels.len(), rate, how).await?;
            if levels.interrupted() {
                file.stop_reason = Some(cut_level(rate, &entry.dir));
                file.write(&path)?;
                return Ok(());
            }
            file.levels.push(entry);
            file.write(&path)?;
        }
    }
    Ok(())
}

/// The search path under the levels' table.
fn print_search(search: &SearchPath) {
    println!(
        "knee search (--precision {}, --max-levels {}, rates {:.3}–{:.3} req/s):",
        search.precision, search.max_levels, search.min_rate, search.max_rate
    );
    for (i, step) in search.steps.iter().enumerate() {
        println!(
            "  {:>2}. {:>8.3} offered  {:<38} {:<17} bracket {}",
            i + 1,
            step.offered_rate,
            step.reason.to_string(),
            step.verdict.to_string(),
            step.bracket
        );
    }
    if let Some(reason) = &search.end_reason {
        println!("  end: {reason}");
    }
    if let Some(ceiling) = search.throughput_ceiling() {
        println!(
            "  throughput ceiling: {ceiling:.3} req/s completed by a saturated level (beside \
             the bracket, never an end of it)"
        );
    }
}
