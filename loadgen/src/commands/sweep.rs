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

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::metrics::PERCENTILE_CI_LEVEL;
use reports::render::write_report;
use reports::search::{SearchEnd, SearchPath, StepReason};
use reports::slo::{SloCheck, SloSpec, SloVerdict};
use reports::stats::min_sample_for_quantile;

use crate::knee_search::{self, Measured, Next, RepeatRun, SearchArgs};
use crate::launch::prepare_and_execute;
use crate::options::{ArrivalKind, RunArgs, DEFAULT_NUM_PROMPTS};
use crate::probe::{auto_levels, probe_saturation, saturation_estimate};
use crate::stop::stop_on_signals;
use crate::units::duration_arg;
use crate::workload::prompt::{salt_for, SaltFor};
use reports::folders::{LevelEntry, LevelWarmup, Probe, SweepFile, SWEEP_FILE};
use reports::render::views::sweep_report;

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
const DEFAULT_AUTO_FRACTIONS: [f64; 8] = [0.25, 0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5];
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
fn refuse_unused(args: &SweepArgs, rates: &Rates) -> Result<()> {
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

/// When a level is saturated, printed under the sweep beside the rates' definitions.
pub const SATURATION_RULE: &str = "A level is saturated when, each beyond noise (one-sided p < \
0.01), its schedule asked more than the server's capacity (its ends per second while requests \
waited for it) or it carried fewer than 95% of its requests; never when the server's waiting \
gauge read 0 throughout the window, every request succeeded and none waited for --max-concurrency; \
unclear with fewer than 10 successful requests.";

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
pub fn sized_level(run: &mut RunArgs, rate: f64, min: Option<u64>) {
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
fn sharded_timetable(args: &SweepArgs) -> Result<Option<(SystemTime, Duration)>> {
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

/// What every level of one sweep shares.
struct Levels<'a> {
    args: &'a SweepArgs,
    out: &'a Path,
    slo: Option<&'a SloSpec>,
    min_requests: Option<u64>,
    timetable: Option<(SystemTime, Duration)>,
    /// The saturation probe, whose E2E at each load sets that level's warm-up.
    probe: Option<Probe>,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// Which run of a level: the first (repeat 0, the search's or the list's own), or a repeat.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LevelRun {
    /// Twice the requests (a re-run of an unknown verdict).
    doubled: bool,
    repeat: usize,
}

/// A level's warm-up: the `--warmup` given, or (for a level of a given `--duration` after a
/// probe) at least twice the probe's mean E2E at the level's load (the first probe step whose throughput reached its rate, else the busiest),
/// so that the requests in flight have settled before the window opens.
pub fn level_warmup(given: Duration, probe: Option<&Probe>, rate: f64) -> LevelWarmup {
    let given_rule = || LevelWarmup {
        secs: given.as_secs_f64(),
        rule: "--warmup as given".into(),
    };
    let Some(probe) = probe else {
        return given_rule();
    };
    let step = probe
        .steps
        .iter()
        .find(|s| s.throughput >= rate)
        .or_else(|| {
            probe
                .steps
                .iter()
                .max_by(|a, b| a.throughput.total_cmp(&b.throughput))
        });
    match step {
        Some(step) if 2.0 * step.mean_e2el_ms / 1000.0 > given.as_secs_f64() => LevelWarmup {
            secs: 2.0 * step.mean_e2el_ms / 1000.0,
            rule: format!(
                "twice the probe's mean E2E at this load (concurrency {}: 2 × {:.2} s), \
                 longer than --warmup {:.2} s",
                step.concurrency,
                step.mean_e2el_ms / 1000.0,
                given.as_secs_f64()
            ),
        },
        _ => given_rule(),
    }
}

impl Levels<'_> {
    /// Runs level `i` at `rate` into `level-NN/` and measures it: its schedule scaled to
    /// hold `rate` over the window (`--exact-rate`, but for sessions, whose later turns
    /// follow the answers), its warm-up from [`level_warmup`], a repeat with a seed of its
    /// own.
    async fn run(
        &self,
        i: usize,
        rate: f64,
        how: LevelRun,
    ) -> Result<(LevelEntry, Option<SloCheck>)> {
        let dir = format!("level-{i:02}");
        let repeat = if how.repeat > 0 {
            format!(" (repeat {})", how.repeat)
        } else {
            String::new()
        };
        eprintln!(
            "loadgen sweep: level {} at {rate} req/s{repeat} → {}",
            i + 1,
            self.out.join(&dir).display()
        );
        let mut run = self.args.run.clone();
        run.rate = rate;
        // A replayed trace is rescaled to each level's rate; otherwise levels are Poisson.
        match run.arrival {
            Some(ArrivalKind::Trace) => run.target_rate = Some(rate),
            None => run.arrival = Some(ArrivalKind::Poisson),
            Some(_) => {}
        }
        run.exact_rate = run.turns.is_none();
        run.out = Some(self.out.join(&dir));
        run.prompt_salt = salt_for(self.args.run.prompt_salt, SaltFor::SweepLevel, i);
        if how.repeat > 0 {
            run.seed = repeat_seed(self.args.run.seed, how.repeat);
        }
        // A timetable fixes every level's span in advance, and a level of --num-prompts
        // requests (no --duration) measures all of them after the warm-up given.
        let warmup = if self.timetable.is_some() || run.duration.is_none() {
            level_warmup(run.warmup, None, rate)
        } else {
            level_warmup(run.warmup, self.probe.as_ref(), rate)
        };
        run.warmup = Duration::from_secs_f64(warmup.secs);
        sized_level(&mut run, rate, self.min_requests);
        if how.doubled {
            double_requests(&mut run);
        }
        if let Some((start, period)) = self.timetable {
            run.start_at = Some(start + period * i as u32);
        }
        let outcome = prepare_and_execute(&run, self.stop.clone()).await?;
        print!("{}", reports::table::render(&outcome.summary));
        let (mut entry, check) = LevelEntry::measure(self.out, dir, rate, self.slo)?;
        entry.warmup = Some(warmup);
        entry.repeat = (how.repeat > 0).then_some(how.repeat);
        Ok((entry, check))
    }

    fn interrupted(&self) -> bool {
        *self.stop.borrow()
    }
}

/// The stop reason of a level cut short by a stop (SIGTERM, Ctrl-C): its folder keeps the
/// requests that finished, but the level is neither judged nor kept in `sweep.json`, since the
/// stop, not the server, cut its requests in flight (a saturation verdict would blame the
/// server for them).
fn cut_level(rate: f64, dir: &str) -> String {
    format!(
        "interrupted during the level at {rate} req/s: its folder {dir} keeps the requests that \
         finished; the level is not judged"
    )
}

/// The seed of a level's `repeat`-th repeat: a fresh schedule and workload draw.
pub fn repeat_seed(seed: u64, repeat: usize) -> u64 {
    crate::workload::mix(seed, 0x5EED_0000 + repeat as u64)
}

/// `run` with twice the requests: twice the duration, or twice --num-prompts.
fn double_requests(run: &mut RunArgs) {
    match run.duration {
        Some(d) => run.duration = Some(d * 2),
        None => run.num_prompts = Some(2 * run.num_prompts.unwrap_or(DEFAULT_NUM_PROMPTS)),
    }
}

/// The closed-loop probe of `--rates auto` and `search` (`for_search`: it ends early when
/// the SLO is missed unloaded).
async fn probe(
    args: &SweepArgs,
    slo: Option<&SloSpec>,
    for_search: bool,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Probe> {
    if args.run.turns.is_some() {
        bail!(
            "loadgen sweep --rates {} with --turns: the saturation probe is a closed loop of \
             single requests, which sessions are not; give the session rates (--rates 0.5,1,2)",
            args.rates
        );
    }
    eprintln!(
        "loadgen sweep: --rates {}: probing the saturation rate (closed loop)…",
        args.rates
    );
    let (steps, reason) = probe_saturation(
        &args.run,
        args.probe_duration.unwrap_or(DEFAULT_PROBE_DURATION),
        args.probe_max_concurrency
            .unwrap_or(DEFAULT_PROBE_MAX_CONCURRENCY)
            .max(1),
        slo,
        for_search,
        stop,
    )
    .await?;
    let probe = saturation_estimate(steps, reason)?;
    eprintln!(
        "loadgen sweep: saturation ≈ {:.3} req/s (concurrency {} / mean E2E; {})",
        probe.saturation_rate, probe.knee_concurrency, probe.stop_reason
    );
    Ok(probe)
}

/// `loadgen sweep`: [`run_sweep`], then the `--fail-on-slo` gate.
pub async fn sweep_command(args: SweepArgs) -> Result<()> {
    let file = run_sweep(&args, stop_on_signals()?).await?;
    if args.run.fail_on_slo {
        sweep_gate(&file, args.require_rate)?;
    }
    Ok(())
}

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
    let slo = crate::options::slo_spec(&args.run)?;
    if rates == Rates::Search && slo.is_none() {
        bail!("loadgen sweep --rates search looks for where the SLO breaks: give --slo (e.g. ttft:p90:2s,tpot:p90:100ms)");
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let timetable = sharded_timetable(args)?;
    let min_requests = min_requests(args.min_requests.as_deref(), slo.as_ref())?;
    if args.run.exact_rate && args.run.turns.is_some() {
        bail!("loadgen sweep --exact-rate with --turns: a session's later turns follow its answers, so no factor fixes their rate; session levels run their raw draw");
    }
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
        args,
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
            let probe = probe(args, slo.as_ref(), false, stop.clone()).await?;
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
            let probe = probe(args, slo.as_ref(), true, stop.clone()).await?;
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

/// The knee search (`knee_search`), `sweep.json` rewritten after every level.
async fn run_search(
    levels: &Levels<'_>,
    file: &mut SweepFile,
    mut search: SearchPath,
    unloaded_missed: bool,
) -> Result<()> {
    let path = levels.out.join(SWEEP_FILE);
    let mut next = knee_search::start(&mut search, unloaded_missed);
    file.search = Some(search.clone());
    file.stop_reason = search.end_reason.clone();
    file.write(&path)?;
    while let Next::Run { rate, reason } = next {
        if levels.interrupted() {
            knee_search::interrupt(&mut search, rate);
            file.search = Some(search.clone());
            file.stop_reason = search.end_reason.clone();
            file.write(&path)?;
            break;
        }
        let i = file.levels.len();
        eprintln!("loadgen sweep: search: {reason} → {rate} req/s");
        let how = LevelRun {
            doubled: reason == StepReason::Rerun,
            repeat: 0,
        };
        let (entry, _) = levels.run(i, rate, how).await?;
        if levels.interrupted() {
            knee_search::interrupt(&mut search, rate);
            file.search = Some(search.clone());
            file.stop_reason = Some(cut_level(rate, &entry.dir));
            file.write(&path)?;
            break;
        }
        let verdict = knee_search::verdict(entry.saturated, entry.slo_verdict);
        next = knee_search::record(
            &mut search,
            Measured {
                dir: entry.dir.clone(),
                offered_rate: rate,
                scheduled_rate: entry.rates.map(|r| r.scheduled),
                completed_rate: entry.completed_rate,
                verdict,
            },
            reason,
        );
        let sustained = search.steps.last().map_or(0.0, |s| s.sustained_rate);
        file.levels.push(entry);
        eprintln!(
            "loadgen sweep: search: {verdict} at {rate} req/s (sustained {sustained:.3}); bracket {}",
            search.bracket()
        );
        file.rates = file.levels.iter().map(|l| l.offered_rate).collect();
        file.rates.sort_by(f64::total_cmp);
        file.rates.dedup();
        file.search = Some(search.clone());
        file.stop_reason = search.end_reason.clone();
        file.write(&path)?;
    }
    if let Some(reason) = &search.end_reason {
        eprintln!("loadgen sweep: search ended: {reason}");
    }
    Ok(())
}

/// The repeats of the search's final bracket (`--repeats`, [`knee_search::next_repeat`]),
/// `sweep.json` rewritten after every level; none when the search was interrupted.
async fn run_search_repeats(levels: &Levels<'_>, file: &mut SweepFile) -> Result<()> {
    let path = levels.out.join(SWEEP_FILE);
    let Some(search) = file.search.clone() else {
        return Ok(());
    };
    if file.repeats < 2 || search.end == Some(SearchEnd::Interrupted) {
        return Ok(());
    }
    let mut done: Vec<RepeatRun> = Vec::new();
    while let Some(next) = knee_search::next_repeat(&search, file.repeats, &done) {
        if levels.interrupted() {
            file.stop_reason = Some(format!(
                "{}; interrupted before repeat {} at {} req/s",
                search.end_reason.as_deref().unwrap_or("search ended"),
                next.repeat,
                next.rate
            ));
            file.write(&path)?;
            return Ok(());
        }
        eprintln!(
            "loadgen sweep: repeat {} of {}: {:?} end → {} req/s",
            next.repeat,
            file.repeats - 1,
            next.side,
            next.rate
        );
        let how = LevelRun {
            doubled: false,
            repeat: next.repeat,
        };
        let (entry, _) = levels.run(file.levels.len(), next.rate, how).await?;
        if levels.interrupted() {
            file.stop_reason = Some(format!(
                "{}; {}",
                search.end_reason.as_deref().unwrap_or("search ended"),
                cut_level(next.rate, &entry.dir)
            ));
            file.write(&path)?;
            return Ok(());
        }
        let verdict = knee_search::verdict(entry.saturated, entry.slo_verdict);
        eprintln!(
            "loadgen sweep: repeat {}: {verdict} at {} req/s",
            next.repeat, next.rate
        );
        done.push(RepeatRun {
            repeat: next.repeat,
            rate: next.rate,
            verdict,
        });
        file.levels.push(entry);
        file.rates = file.levels.iter().map(|l| l.offered_rate).collect();
        file.rates.sort_by(f64::total_cmp);
        file.rates.dedup();
        file.write(&path)?;
    }
    if done.is_empty() {
        let note = format!(
            "--repeats {}: the search left no bracket with both ends to repeat",
            file.repeats
        );
        eprintln!("loadgen sweep: {note}");
        file.stop_reason = Some(format!(
            "{}; {note}",
            search.end_reason.as_deref().unwrap_or("search ended")
        ));
        file.write(&path)?;
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
                l.saturated,
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
        assert_eq!(parse_rates("auto").unwrap(), Rates::Auto);
        assert_eq!(parse_rates(" Search").unwrap(), Rates::Search);
        assert_eq!(
            parse_rates("4, 1,2,2").unwrap(),
            Rates::List(vec![1.0, 2.0, 4.0])
        );
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
