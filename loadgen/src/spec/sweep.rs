//! The options of `loadgen sweep` (and of the knee searches that `tune` and `matrix` run):
//! the clap type, the parsing of `--rates` and `--min-requests`, the refusal of options the
//! chosen rates would not use, and a sharded sweep's timetable.

use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::slo::SloSpec;

use crate::spec::run_args::RunArgs;
use crate::spec::search::SearchArgs;
use crate::units::duration_arg;

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
    /// `auto`: find the saturation rate with a closed-loop probe, then run levels at
    /// --auto-fractions of it; or `search`: after the probe, bracket the SLO's crossing and
    /// bisect it to --precision (needs --slo). Each level sets --rate (and --target-rate
    /// with --arrival trace) itself: both are refused.
    #[arg(long, required = true)]
    pub rates: String,
    /// With --fail-on-slo: fail (exit 3) unless the SLO is met at a sustained rate of at
    /// least this many requests/s.
    #[arg(long, requires = "fail_on_slo")]
    pub require_rate: Option<f64>,
    /// With --rates auto: the levels as fractions of the saturation rate, some just above it
    /// so that the sweep reaches the knee [default: 0.25,0.5,0.7,0.85,1.0,1.15,1.3,1.5].
    #[arg(long, value_delimiter = ',')]
    pub auto_fractions: Option<Vec<f64>>,
    /// With --rates auto or search: the measured length of each closed-loop probe step (plus
    /// a quarter of it as warm-up) [default: 10s].
    #[arg(long, value_parser = duration_arg)]
    pub probe_duration: Option<Duration>,
    /// With --rates auto or search: the largest probe concurrency [default: 256].
    #[arg(long)]
    pub probe_max_concurrency: Option<usize>,
    #[command(flatten)]
    pub search: SearchArgs,
    /// Run-to-run variation, measured: after a search, each end of its final bracket runs
    /// R − 1 more times (interleaved, each with a fresh seed and prompt words, stepping
    /// outward when both ends agree); a list of rates runs every level R times. The plan's
    /// `crossing_between_runs` is the Student t-interval over the runs' crossings.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
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

/// Default `--auto-fractions`.
pub const DEFAULT_AUTO_FRACTIONS: [f64; 8] = [0.25, 0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5];
/// Default `--probe-duration`.
pub const DEFAULT_PROBE_DURATION: Duration = Duration::from_secs(10);
/// Default `--probe-max-concurrency`.
pub const DEFAULT_PROBE_MAX_CONCURRENCY: usize = 256;

/// What `--rates` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Rates {
    /// These offered rates, ascending.
    List(Vec<f64>),
    /// Fractions of the probed saturation rate.
    Auto,
    /// A knee search from the probed saturation rate (`knee_search`).
    Search,
}

/// Parses `--rates`: a comma-separated list, `auto` or `search`.
pub fn parse_rates(text: &str) -> Result<Rates> {
    let word = text.trim();
    if word.eq_ignore_ascii_case("auto") {
        return Ok(Rates::Auto);
    }
    if word.eq_ignore_ascii_case("search") {
        return Ok(Rates::Search);
    }
    let mut rates = text
        .split(',')
        .map(|r| {
            let rate: f64 = r.trim().parse().with_context(|| {
                format!("--rates: `{r}` is not a number (or give `auto` or `search`)")
            })?;
            if !(rate.is_finite() && rate > 0.0) {
                bail!("--rates: rate {rate} is not a positive number");
            }
            Ok(rate)
        })
        .collect::<Result<Vec<f64>>>()?;
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    Ok(Rates::List(rates))
}

/// Refuses the options that `rates` would not use: nothing given is silently ignored.
pub fn refuse_unused(args: &SweepArgs, rates: &Rates) -> Result<()> {
    let mut unused: Vec<String> = Vec::new();
    if *rates != Rates::Auto && args.auto_fractions.is_some() {
        unused.push("--auto-fractions is for --rates auto".into());
    }
    if let Rates::List(_) = rates {
        for (given, flag) in [
            (args.probe_duration.is_some(), "--probe-duration"),
            (
                args.probe_max_concurrency.is_some(),
                "--probe-max-concurrency",
            ),
        ] {
            if given {
                unused.push(format!("{flag} is for --rates auto or search"));
            }
        }
    }
    if *rates != Rates::Search {
        for flag in args.search.given() {
            unused.push(format!("{flag} is for --rates search"));
        }
    }
    if !unused.is_empty() {
        bail!(
            "loadgen sweep --rates {}: {}",
            args.rates,
            unused.join("; ")
        );
    }
    Ok(())
}

/// The requests each level must hold, from `--min-requests` (a count or `auto`, the default
/// with an SLO).
pub fn min_requests(text: Option<&str>, slo: Option<&SloSpec>) -> Result<Option<u64>> {
    let text = match (text, slo) {
        (Some(text), _) => text,
        (None, Some(_)) => "auto",
        (None, None) => return Ok(None),
    };
    if text.trim().eq_ignore_ascii_case("auto") {
        let slo = slo.context("--min-requests auto needs an --slo with percentiles")?;
        return Ok(Some(slo.min_requests()));
    }
    let n: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("--min-requests `{text}`: expected a count or `auto`"))?;
    Ok(Some(n))
}

/// With `--shard`: the first level's start instant and the period between level starts.
/// A sharded sweep runs fixed rates on a fixed timetable: no probe, no early stop, since
/// no worker can decide those alone.
pub fn sharded_timetable(args: &SweepArgs) -> Result<Option<(SystemTime, Duration)>> {
    let Some(shard) = args.run.shard else {
        if args.run.start_at.is_some() {
            bail!("loadgen sweep: --start-at is for the shards of a sweep (--shard I/K): every level of an unsharded sweep starts when the previous one ends");
        }
        return Ok(None);
    };
    if !matches!(parse_rates(&args.rates)?, Rates::List(_)) {
        bail!("loadgen sweep --shard {shard}: give the rates (--rates 1,2,4): a shard cannot probe the saturation rate or search alone");
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
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_sorted_and_deduplicated() {
        assert_eq!(parse_rates("auto").unwrap(), Rates::Auto);
        assert_eq!(parse_rates(" Search").unwrap(), Rates::Search);
        assert_eq!(
            parse_rates("4, 1,2,2").unwrap(),
            Rates::List(vec![1.0, 2.0, 4.0])
        );
        assert!(parse_rates("1,x").is_err());
        assert!(parse_rates("0").is_err());
    }
}
