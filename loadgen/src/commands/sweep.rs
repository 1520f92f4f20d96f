//! `loadgen sweep`: the same seeded workload at a list of offered rates, one level after
//! another, stopping after the first level that saturates (see `saturation`) or breaks the
//! SLO. `--rates auto` first finds the saturation rate (see `probe`).
//!
//! Layout of the output folder: `sweep.json` (levels and why the sweep stopped, rewritten after
//! every level so a cut-short sweep stays readable) and one run folder per level
//! (`level-00/`, …) as `loadgen run --out` writes it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::metrics::PERCENTILE_CI_LEVEL;
use reports::render::write_report;
use reports::slo::SloSpec;
use reports::stats::min_sample_for_quantile;

use crate::execute::prepare_and_execute;
use crate::folders::{LevelEntry, SweepFile, SWEEP_FILE};
use crate::options::{ArrivalKind, RunArgs, DEFAULT_NUM_PROMPTS};
use crate::probe::{auto_levels, probe_saturation};
use crate::stop::stop_on_signals;
use crate::units::duration_arg;
use crate::views::sweep_report;

/// `--rate` and `--target-rate` are each level's to set: given here they are refused as a
/// usage error (exit 2), never silently replaced.
#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("rate", |a| a
        .conflicts_with("rates")
        .help("Set by each level from --rates: refused here")
        .long_help(None::<&str>)),
    mut_arg("target_rate", |a| a
        .conflicts_with("rates")
        .help("Set by each level from --rates with --arrival trace: refused here")
        .long_help(None::<&str>)),
    mut_arg("out", |a| a.help("The sweep's folder: sweep.json, plan.json and one run folder per level")),
    mut_arg("duration", |a| a.help("Each level's measured span, lengthened by --min-requests"))
)]
pub struct SweepArgs {
    /// Offered rates in requests/s, comma-separated (e.g. 1,2,4,8,16), run in ascending order;
    /// or `auto`: find the saturation rate with a closed-loop probe, then spread levels below it.
    /// Each level sets --rate (and --target-rate with --arrival trace) itself: both are refused.
    #[arg(long, required = true)]
    pub rates: String,
    /// With --fail-on-slo: fail (exit 3) unless the SLO is met at a sustained rate of at
    /// least this many requests/s.
    #[arg(long, requires = "fail_on_slo")]
    pub require_rate: Option<f64>,
    /// With --rates auto: the levels as fractions of the saturation rate, some just above it
    /// so that the sweep reaches the knee.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.25,0.5,0.7,0.85,1.0,1.15,1.3,1.5"
    )]
    pub auto_fractions: Vec<f64>,
    /// With --rates auto: the measured length of each closed-loop probe step (plus a quarter
    /// of it as warm-up).
    #[arg(long, value_parser = duration_arg, default_value = "10s")]
    pub probe_duration: Duration,
    /// With --rates auto: the largest probe concurrency.
    #[arg(long, default_value_t = 256)]
    pub probe_max_concurrency: usize,
    /// Lengthen each level to hold at least this many measured requests (rate × --duration,
    /// or --num-prompts without --duration); `auto`: as many as the SLO's highest percentile
    /// needs for a 95% interval with an upper bound (p90: 35, p99: 368, p99.9: 3,688): the
    /// default with --slo, so that no level's verdict is unknown for want of requests; `0`
    /// keeps the levels as given.
    #[arg(long)]
    pub min_requests: Option<String>,
    /// With --shard: the time from one level's start to the next (each level starts at
    /// --start-at + i × this on every worker). Default: 1.5 × (warm-up + duration +
    /// cool-down) + 10 s, leaving the level's last requests time to finish; a worker whose
    /// level has not drained by the next start fails rather than start that level late.
    #[arg(long, value_parser = duration_arg)]
    pub level_period: Option<Duration>,
    /// Every `loadgen run` option applies to each level but `--rate` and `--target-rate`,
    /// which each level sets from --rates (refused here). `--out` (required) is the sweep's
    /// folder, one run folder per level inside; `--duration` is each level's measured span,
    /// lengthened by --min-requests; `--slo` takes percentiles: ttft:p99:500ms,tpot:p99:50ms.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The rates of `--rates`: a comma-separated list, or `None` for `auto`.
pub fn parse_rates(text: &str) -> Result<Option<Vec<f64>>> {
    if text.trim().eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    let mut rates = text
        .split(',')
        .map(|r| {
            let rate: f64 = r
                .trim()
                .parse()
                .with_context(|| format!("--rates: `{r}` is not a number (or give `auto`)"))?;
            if !(rate.is_finite() && rate > 0.0) {
                bail!("--rates: rate {rate} is not a positive number");
            }
            Ok(rate)
        })
        .collect::<Result<Vec<f64>>>()?;
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    Ok(Some(rates))
}

/// When a level is saturated, printed under the sweep beside the rates' definitions.
pub const SATURATION_RULE: &str = "A level is saturated when completed < 95% of scheduled, \
requests in flight keep growing, or TTFT keeps rising; unclear with fewer than 10 requests.";

/// The requests each level must hold, from `--min-requests` (a count or `auto`, the default
/// with an SLO).
fn min_requests(text: Option<&str>, slo: Option<&SloSpec>) -> Result<Option<u64>> {
    let text = match (text, slo) {
        (Some(text), _) => text,
        (None, Some(_)) => "auto",
        (None, None) => return Ok(None),
    };
    if text.trim().eq_ignore_ascii_case("auto") {
        let slo = slo.context("--min-requests auto needs an --slo with percentiles")?;
        let highest = slo.targets.iter().map(|t| t.percentile).fold(0.0, f64::max);
        return Ok(Some(min_sample_for_quantile(
            highest / 100.0,
            PERCENTILE_CI_LEVEL,
        )));
    }
    let n: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("--min-requests `{text}`: expected a count or `auto`"))?;
    Ok(Some(n))
}

/// `run` at `rate`, lengthened to hold at least `min` measured requests.
fn sized_level(run: &mut RunArgs, rate: f64, min: Option<u64>) {
    let Some(min) = min else {
        return;
    };
    // A Poisson schedule's count over a span varies by √n: the span expects three standard
    // deviations more than `min`, so that its seeded draw holds `min` all but rarely.
    let expected = min as f64 + 3.0 * (min as f64).sqrt();
    match run.duration {
        Some(d) if rate * d.as_secs_f64() < expected => {
            run.duration = Some(Duration::from_secs_f64(expected / rate));
        }
        Some(_) => {}
        None => {
            let n = run.num_prompts.unwrap_or(DEFAULT_NUM_PROMPTS);
            run.num_prompts = Some(n.max(min as usize));
        }
    }
}

/// With `--shard`: the first level's start instant and the period between level starts.
/// A sharded sweep runs fixed rates on a fixed timetable: no probe, no early stop, since
/// no worker can decide those alone.
fn sharded_timetable(args: &SweepArgs) -> Result<Option<(std::time::SystemTime, Duration)>> {
    let Some(shard) = args.run.shard else {
        if args.run.start_at.is_some() {
            bail!("loadgen sweep: --start-at is for the shards of a sweep (--shard I/K): every level of an unsharded sweep starts when the previous one ends");
        }
        return Ok(None);
    };
    if parse_rates(&args.rates)?.is_none() {
        bail!("loadgen sweep --shard {shard}: give the rates (--rates 1,2,4): a shard cannot probe the saturation rate alone");
    }
    let start = args.run.start_at.with_context(|| {
        format!("loadgen sweep --shard {shard}: every worker needs the same --start-at")
    })?;
    let duration = args.run.duration.with_context(|| {
        format!("loadgen sweep --shard {shard}: levels on a timetable need --duration")
    })?;
    let span = args.run.warmup + duration + args.run.cooldown;
    let period = args
        .level_period
        .unwrap_or(span.mul_f64(1.5) + Duration::from_secs(10));
    if period <= span {
        bail!(
            "--level-period {:?} must exceed a level's warm-up + duration + cool-down ({span:?})",
            period
        );
    }
    Ok(Some((start, period)))
}

/// `loadgen sweep`.
pub async fn sweep_command(args: SweepArgs) -> Result<()> {
    let out: PathBuf = args
        .run
        .out
        .clone()
        .context("loadgen sweep: --out FOLDER is required")?;
    if args.run.concurrency.is_some() {
        bail!("loadgen sweep: --concurrency (closed loop) cannot be combined with --rates");
    }
    let slo = crate::options::slo_spec(&args.run)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let timetable = sharded_timetable(&args)?;
    let (rates, probe) = match parse_rates(&args.rates)? {
        Some(rates) => (rates, None),
        None if args.run.turns.is_some() => bail!(
            "loadgen sweep --rates auto with --turns: the saturation probe is a closed loop of \
             single requests, which sessions are not; give the session rates (--rates 0.5,1,2)"
        ),
        None => {
            eprintln!("loadgen sweep: --rates auto: probing the saturation rate (closed loop)…");
            let (steps, reason) = probe_saturation(
                &args.run,
                args.probe_duration,
                args.probe_max_concurrency.max(1),
            )
            .await?;
            let (probe, rates) = auto_levels(steps, reason, &args.auto_fractions)?;
            eprintln!(
                "loadgen sweep: saturation ≈ {:.3} req/s (concurrency {} / mean E2E; {}); levels {rates:?}",
                probe.saturation_rate, probe.knee_concurrency, probe.stop_reason
            );
            (rates, Some(probe))
        }
    };
    let mut file = SweepFile {
        schema_version: 1,
        slo: args.run.slo.clone(),
        rates: rates.clone(),
        probe,
        levels: Vec::new(),
        stop_reason: None,
    };
    let min_requests = min_requests(args.min_requests.as_deref(), slo.as_ref())?;
    if let Some((_, period)) = timetable {
        // Every level must fit its period, checked before the first one is sent.
        for &rate in &rates {
            let mut run = args.run.clone();
            sized_level(&mut run, rate, min_requests);
            let span = run.warmup + run.duration.unwrap_or_default() + run.cooldown;
            if span >= period {
                bail!("the level at {rate} req/s lasts {span:?} (--min-requests lengthens it), not less than --level-period {period:?}");
            }
        }
    }
    let stop = stop_on_signals()?;
    for (i, &rate) in rates.iter().enumerate() {
        let dir = format!("level-{i:02}");
        eprintln!(
            "loadgen sweep: level {}/{} at {rate} req/s → {}",
            i + 1,
            rates.len(),
            out.join(&dir).display()
        );
        let mut run = args.run.clone();
        run.rate = rate;
        // A replayed trace is rescaled to each level's rate; otherwise levels are Poisson.
        match run.arrival {
            Some(ArrivalKind::Trace) => run.target_rate = Some(rate),
            None => run.arrival = Some(ArrivalKind::Poisson),
            Some(_) => {}
        }
        run.out = Some(out.join(&dir));
        sized_level(&mut run, rate, min_requests);
        if let Some((start, period)) = timetable {
            run.start_at = Some(start + period * i as u32);
        }
        let outcome = prepare_and_execute(&run, stop.clone()).await?;
        print!("{}", reports::table::render(&outcome.summary));
        let (entry, check) = LevelEntry::measure(&out, dir, rate, slo.as_ref())?;
        let saturated = entry.saturated;
        let rule = entry
            .saturation
            .as_ref()
            .map(|s| s.rule.clone())
            .unwrap_or_default();
        file.levels.push(entry);
        // A shard cannot stop early alone: every worker runs every level of the timetable.
        let last = i + 1 == rates.len() || timetable.is_some();
        if saturated && !last {
            file.stop_reason = Some(format!("saturated at {rate} req/s: {rule}"));
        } else if let Some(c) = check
            .as_ref()
            .filter(|c| c.verdict == reports::slo::SloVerdict::NotMet)
        {
            // Higher rates only break it further: the knee lies below this level.
            if !last {
                file.stop_reason = Some(format!(
                    "SLO broken at {rate} req/s (a percentile at {:.2}× its limit)",
                    c.worst_ratio()
                ));
            }
        }
        if *stop.borrow() {
            file.stop_reason = Some(format!("interrupted during the level at {rate} req/s"));
        }
        file.write(&out.join(SWEEP_FILE))?;
        if let Some(reason) = &file.stop_reason {
            eprintln!("loadgen sweep: stopping: {reason}");
            break;
        }
    }
    println!("{} {SATURATION_RULE}", reports::rates::DEFINITIONS);
    for level in &file.levels {
        let (scheduled, completed) = level.rates.map_or(("–".into(), "–".into()), |r| {
            (format!("{:.3}", r.scheduled), format!("{:.3}", r.completed))
        });
        let saturation = level.saturation.as_ref().map_or(
            if level.saturated { "yes" } else { "no" }.to_string(),
            |s| format!("{:?} ({})", s.state, s.rule).to_lowercase(),
        );
        println!(
            "{:>8.3} offered  {scheduled:>8} scheduled  {completed:>8} completed/s  {:>8.1} tok/s  SLO: {:<17}  saturation: {saturation}",
            level.offered_rate,
            level.output_tokens_per_s,
            level.slo_verdict.map_or("–".to_string(), |v| v.to_string()),
        );
    }
    let (_, html) = write_report(&out, &sweep_report(&out)?)?;
    println!(
        "sweep: {}  report: {}",
        out.join(SWEEP_FILE).display(),
        html.display()
    );
    if args.run.fail_on_slo {
        sweep_gate(&file, args.require_rate)?;
    }
    Ok(())
}

/// `--fail-on-slo`: not met (3) when no level met the SLO or the best that did sustained
/// less than `--require-rate`; unknown (5) when no level met it and some were unknown.
fn sweep_gate(file: &SweepFile, require_rate: Option<f64>) -> Result<(), crate::gate::Gate> {
    use reports::slo::SloVerdict;
    let met = file
        .levels
        .iter()
        .filter(|l| l.slo_verdict == Some(SloVerdict::Met) && !l.saturated);
    let best = met
        .map(|l| {
            reports::rates::sustained(
                l.offered_rate,
                l.rates.map(|r| r.scheduled),
                l.completed_rate,
            )
        })
        .fold(None, |best: Option<f64>, r| {
            Some(best.map_or(r, |b| b.max(r)))
        });
    match (best, require_rate) {
        (Some(rate), Some(required)) if rate < required => Err(crate::gate::Gate {
            code: crate::gate::SLO_NOT_MET,
            message: format!(
                "loadgen sweep: the SLO is met up to {rate:.3} req/s sustained, below the \
                 --require-rate {required}"
            ),
        }),
        (Some(_), _) => Ok(()),
        (None, _)
            if file
                .levels
                .iter()
                .any(|l| l.slo_verdict == Some(SloVerdict::Unknown)) =>
        {
            Err(crate::gate::Gate {
                code: crate::gate::SLO_UNKNOWN,
                message: "loadgen sweep: no level met the SLO, and some had too few requests \
                          to bound its percentile: run longer levels (--min-requests auto)"
                    .into(),
            })
        }
        (None, _) => Err(crate::gate::Gate {
            code: crate::gate::SLO_NOT_MET,
            message: "loadgen sweep: no level met the SLO".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_sorted_and_deduplicated() {
        assert_eq!(parse_rates("auto").unwrap(), None);
        assert_eq!(parse_rates("4, 1,2,2").unwrap(), Some(vec![1.0, 2.0, 4.0]));
        assert!(parse_rates("1,x").is_err());
        assert!(parse_rates("0").is_err());
    }

    #[test]
    fn levels_lengthen_to_the_requests_the_slo_percentile_needs() {
        let slo = SloSpec::parse("ttft:p99:500ms,tpot:p90:50ms").unwrap();
        assert_eq!(min_requests(Some("auto"), Some(&slo)).unwrap(), Some(368));
        assert_eq!(
            min_requests(None, Some(&slo)).unwrap(),
            Some(368),
            "auto by default"
        );
        assert_eq!(min_requests(Some("0"), Some(&slo)).unwrap(), Some(0));
        assert_eq!(min_requests(None, None).unwrap(), None);
        assert_eq!(min_requests(Some("100"), None).unwrap(), Some(100));
        assert!(min_requests(Some("auto"), None).is_err());
        assert!(min_requests(Some("many"), None).is_err());
        let mut run = <crate::cli::Cli as clap::Parser>::try_parse_from([
            "loadgen",
            "run",
            "--duration",
            "40s",
        ])
        .map(|c| match c.command {
            crate::cli::Command::Run(r) => *r,
            _ => unreachable!(),
        })
        .unwrap();
        // 0.4 req/s × 40 s = 16 requests < 368: the level lasts long enough to expect
        // 368 + 3·√368 = 425.5 requests, 1,063.9 s.
        sized_level(&mut run, 0.4, Some(368));
        let secs = run.duration.unwrap().as_secs_f64();
        assert!(
            (secs - (368.0 + 3.0 * 368f64.sqrt()) / 0.4).abs() < 1e-6,
            "{secs}"
        );
        sized_level(&mut run, 10.0, Some(368));
        assert_eq!(
            run.duration.unwrap().as_secs_f64(),
            secs,
            "long enough already"
        );
    }
}
