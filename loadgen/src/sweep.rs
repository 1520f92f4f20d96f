//! `loadgen sweep`: the same seeded workload at a list of offered rates, one level after
//! another, stopping after the first level that saturates or breaks the SLO badly.
//!
//! A level saturates when it completes fewer than 95% of the offered requests/s, or when its
//! waiting requests keep growing. Offered and completed rates are compared over the same
//! requests, so short levels are not misjudged by the Poisson noise of their request count:
//! offered = (n − 1) / span of the measured requests' scheduled send times, completed =
//! (k − 1) / span of the k successful measured requests' end times (a server that keeps up
//! ends them as fast as they were sent; one that does not spreads the ends out). Growing
//! waiting requests: the number of requests in flight (sent, not yet ended),
//! sampled evenly over the measured sends, is higher in the last third than in the first by
//! more than the noise of a stable queue (see [`backlog_trend`]).
//!
//! `--rates auto` first finds the saturation rate: closed-loop probes at concurrency 1, 2, 4, …
//! (each `--probe-duration` long) until the Little's-law rate, concurrency / mean E2E latency,
//! grows by less than 10% on a doubling; the highest such rate is the saturation estimate and
//! the levels are `--auto-fractions` of it (20%, 40%, 60%, 80%, 90%, 100% by default).
//!
//! Layout of the output folder: `sweep.json` (levels and why the sweep stopped, rewritten after
//! every level so a cut-short sweep stays readable) and one run folder per level
//! (`level-00/`, …) as `loadgen run --out` writes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::plan::SweepLevel;
use reports::records::{read_records, Phase, RequestRecord};
use reports::render::{write_report, Conditions};
use reports::slo::SloSpec;
use serde::{Deserialize, Serialize};

use crate::cli::{execute_prepared, prepare_run, run_command, Execution, RunArgs};
use crate::report_cmd::{load_run, sweep_report};
use crate::run::never_stop;
use crate::units::duration_arg;

pub const SWEEP_FILE: &str = "sweep.json";
/// A level saturates when it completes fewer than this fraction of the offered requests/s.
pub const SATURATION_FRACTION: f64 = 0.95;
/// A level breaks the SLO badly when an observed percentile exceeds its limit by this factor.
pub const BAD_SLO_FACTOR: f64 = 2.0;
/// The probe stops doubling the concurrency when the Little's-law rate grows by less than this.
pub const PROBE_MIN_GAIN: f64 = 1.10;

#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Offered rates in requests/s, comma-separated (e.g. 1,2,4,8,16), run in ascending order;
    /// or `auto`: find the saturation rate with a closed-loop probe, then spread levels below it.
    #[arg(long, required = true)]
    pub rates: String,
    /// With --rates auto: the levels as fractions of the saturation rate.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.4,0.6,0.8,0.9,1.0")]
    pub auto_fractions: Vec<f64>,
    /// With --rates auto: the measured length of each closed-loop probe step (plus a quarter
    /// of it as warm-up).
    #[arg(long, value_parser = duration_arg, default_value = "10s")]
    pub probe_duration: Duration,
    /// With --rates auto: the largest probe concurrency.
    #[arg(long, default_value_t = 256)]
    pub probe_max_concurrency: usize,
    /// Every `loadgen run` option applies to each level (`--rate` is replaced by each rate;
    /// `--slo` takes percentiles: ttft:p99:500ms,tpot:p99:50ms; `--out` is required).
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

/// One closed-loop probe step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeStep {
    pub concurrency: usize,
    pub completed: u64,
    pub failed: u64,
    /// Completed requests/s over the measurement window.
    pub throughput: f64,
    pub mean_e2el_ms: f64,
    /// Little's law: concurrency / mean E2E latency, requests/s.
    pub little_rate: f64,
}

/// The saturation probe of `--rates auto`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub steps: Vec<ProbeStep>,
    /// The highest Little's-law rate of the steps (at the knee).
    pub saturation_rate: f64,
    pub knee_concurrency: usize,
    pub fractions: Vec<f64>,
    /// Why the probe stopped.
    pub stop_reason: String,
}

/// Closed-loop probes at concurrency 1, 2, 4, … until the Little's-law rate stops growing
/// (gain < [`PROBE_MIN_GAIN`]), a step fails requests, or `max_concurrency` is reached.
pub async fn probe_saturation(
    run: &RunArgs,
    step_duration: Duration,
    max_concurrency: usize,
) -> Result<(Vec<ProbeStep>, String)> {
    let mut steps: Vec<ProbeStep> = Vec::new();
    let mut concurrency = 1;
    loop {
        let mut args = run.clone();
        args.concurrency = Some(concurrency);
        args.max_concurrency = None;
        args.ramp_up = None;
        args.warmup = step_duration / 4;
        args.duration = Some(step_duration);
        args.cooldown = Duration::ZERO;
        args.slo = None;
        let prepared = prepare_run(&args)?;
        let outcome = execute_prepared(
            &args,
            &prepared,
            Execution {
                url: args.url.clone(),
                out: None,
                server_version: None,
                extra: Default::default(),
                progress: false,
                stop: never_stop(),
            },
        )
        .await
        .with_context(|| format!("probe at concurrency {concurrency}"))?;
        let m = &outcome.metrics;
        let mean_s = m.e2el.mean / 1000.0;
        let step = ProbeStep {
            concurrency,
            completed: m.completed,
            failed: m.failed,
            throughput: m.request_throughput,
            mean_e2el_ms: m.e2el.mean,
            little_rate: if mean_s > 0.0 {
                concurrency as f64 / mean_s
            } else {
                0.0
            },
        };
        eprintln!(
            "loadgen sweep: probe at concurrency {concurrency}: {:.3} req/s (Little: {:.3}), mean E2E {:.1} ms",
            step.throughput, step.little_rate, step.mean_e2el_ms
        );
        let best = steps.iter().map(|s| s.little_rate).fold(0.0, f64::max);
        let (failed, completed, rate) = (step.failed, step.completed, step.little_rate);
        steps.push(step);
        if completed == 0 {
            bail!("probe at concurrency {concurrency}: no request completed");
        }
        if failed > 0 {
            return Ok((
                steps,
                format!("{failed} requests failed at concurrency {concurrency}"),
            ));
        }
        if best > 0.0 && rate < PROBE_MIN_GAIN * best {
            return Ok((
                steps,
                format!(
                    "doubling to concurrency {concurrency} raised the rate by less than {:.0}%",
                    (PROBE_MIN_GAIN - 1.0) * 100.0
                ),
            ));
        }
        if concurrency >= max_concurrency {
            return Ok((
                steps,
                format!("reached --probe-max-concurrency {max_concurrency}"),
            ));
        }
        concurrency = (concurrency * 2).min(max_concurrency);
    }
}

/// The probe's saturation estimate and the levels below it.
pub fn auto_levels(
    steps: Vec<ProbeStep>,
    stop_reason: String,
    fractions: &[f64],
) -> Result<(Probe, Vec<f64>)> {
    let knee = steps
        .iter()
        .max_by(|a, b| a.little_rate.total_cmp(&b.little_rate))
        .context("the probe has no step")?;
    let saturation_rate = knee.little_rate;
    if !(saturation_rate.is_finite() && saturation_rate > 0.0) {
        bail!("the probe found no positive saturation rate");
    }
    if let Some(bad) = fractions.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        bail!("--auto-fractions: {bad} is not a positive number");
    }
    let mut rates: Vec<f64> = fractions
        .iter()
        .map(|f| (f * saturation_rate * 1000.0).round() / 1000.0)
        .filter(|r| *r > 0.0)
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let probe = Probe {
        knee_concurrency: knee.concurrency,
        saturation_rate,
        fractions: fractions.to_vec(),
        stop_reason,
        steps,
    };
    Ok((probe, rates))
}

/// Offered and completed request rates of a level's measured requests (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelRates {
    /// (n − 1) / span of the scheduled send times, requests/s.
    pub scheduled: f64,
    /// (k − 1) / span of the successful requests' end times, requests/s.
    pub completed: f64,
}

/// The rates of [`LevelRates`]; `None` with fewer than two measured or successful requests.
pub fn level_rates(records: &[RequestRecord]) -> Option<LevelRates> {
    let rate = |times: Vec<f64>| -> Option<f64> {
        let first = times.iter().copied().reduce(f64::min)?;
        let last = times.iter().copied().reduce(f64::max)?;
        (times.len() >= 2 && last > first)
            .then(|| (times.len() - 1) as f64 / ((last - first) / 1000.0))
    };
    let measured = || records.iter().filter(|r| r.phase == Phase::Measured);
    Some(LevelRates {
        scheduled: rate(measured().map(|r| r.scheduled_ms).collect())?,
        completed: rate(
            measured()
                .filter(|r| r.is_success())
                .map(|r| r.end_ms)
                .collect(),
        )?,
    })
}

/// Requests in flight over a level's measured sends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backlog {
    /// Mean number of requests in flight over the first and the last third of the window.
    pub first_third: f64,
    pub last_third: f64,
    /// The last third exceeds the first by more than a stable queue's noise.
    pub growing: bool,
}

/// Samples taken over the measured sends.
const BACKLOG_SAMPLES: usize = 30;

/// The in-flight trend of a level: the number of requests sent and not yet ended (any phase),
/// sampled at evenly spaced instants from the first to the last measured send. It keeps
/// growing when the means of the three thirds rise (first < middle < last), the count at the
/// end (mean of the last 3 samples) is still at least the last third's mean, and the rise
/// from the first third to the last exceeds max(3·√(first + 1), first / 2): a stable queue's
/// count fluctuates by about its square root, and a burst near the end of the window has
/// drained (or is draining) by the end, while an overloaded queue is still climbing.
pub fn backlog_trend(records: &[RequestRecord]) -> Option<Backlog> {
    let sends: Vec<f64> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .map(|r| r.sent_ms)
        .collect();
    let start = sends.iter().copied().reduce(f64::min)?;
    let end = sends.iter().copied().reduce(f64::max)?;
    if end <= start {
        return None;
    }
    let in_flight = |t: f64| {
        records
            .iter()
            .filter(|r| r.sent_ms <= t && r.end_ms > t)
            .count() as f64
    };
    let samples: Vec<f64> = (0..BACKLOG_SAMPLES)
        .map(|i| in_flight(start + (end - start) * i as f64 / (BACKLOG_SAMPLES - 1) as f64))
        .collect();
    let third = BACKLOG_SAMPLES / 3;
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let first_third = mean(&samples[..third]);
    let middle_third = mean(&samples[third..BACKLOG_SAMPLES - third]);
    let last_third = mean(&samples[BACKLOG_SAMPLES - third..]);
    let at_end = mean(&samples[BACKLOG_SAMPLES - 3..]);
    let noise = (3.0 * (first_third + 1.0).sqrt()).max(first_third / 2.0);
    let rising = first_third < middle_third && middle_third < last_third && at_end >= last_third;
    Some(Backlog {
        first_third,
        last_third,
        growing: rising && last_third - first_third > noise,
    })
}

/// One level in `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelEntry {
    /// Run folder, relative to the sweep folder.
    pub dir: String,
    pub offered_rate: f64,
    /// Completed requests/s over the measurement window.
    pub achieved_rate: f64,
    pub output_tokens_per_s: f64,
    /// Achieved < 95% of offered, or the backlog kept growing.
    pub saturated: bool,
    /// Offered and completed rates over the same requests (see [`level_rates`]).
    #[serde(default)]
    pub rates: Option<LevelRates>,
    /// Requests in flight over the level (see [`backlog_trend`]).
    #[serde(default)]
    pub backlog: Option<Backlog>,
    /// `None` without an SLO.
    pub slo_met: Option<bool>,
}

/// `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepFile {
    pub schema_version: u32,
    /// The SLO as given (`--slo`).
    pub slo: Option<String>,
    pub rates: Vec<f64>,
    /// The saturation probe, with `--rates auto`.
    #[serde(default)]
    pub probe: Option<Probe>,
    pub levels: Vec<LevelEntry>,
    /// Why the sweep stopped before the last rate, if it did.
    pub stop_reason: Option<String>,
}

impl SweepFile {
    pub fn read(path: &Path) -> Result<SweepFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid sweep file", path.display()))
    }

    fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// A sweep folder, loaded.
pub struct LoadedSweep {
    pub file: SweepFile,
    pub slo: Option<SloSpec>,
    pub levels: Vec<SweepLevel>,
    pub conditions: Conditions,
}

/// Reads `sweep.json` and every level's records.
pub fn load_sweep(dir: &Path) -> Result<LoadedSweep> {
    let file = SweepFile::read(&dir.join(SWEEP_FILE))?;
    let slo = file.slo.as_deref().map(SloSpec::parse).transpose()?;
    let per_request = slo.as_ref().map(SloSpec::per_request).unwrap_or_default();
    let mut levels = Vec::new();
    let mut conditions = None;
    for entry in &file.levels {
        let run = load_run(&dir.join(&entry.dir), &per_request)
            .with_context(|| format!("sweep level {}", entry.dir))?;
        if conditions.is_none() {
            let mut c = Conditions::from_meta(&run.meta);
            c.schedule = format!(
                "sweep over offered rates {:?} req/s; each level: {}",
                file.rates, c.schedule
            );
            conditions = Some(c);
        }
        levels.push(SweepLevel {
            offered_rate: entry.offered_rate,
            achieved_rate: entry.achieved_rate,
            output_tokens_per_s: entry.output_tokens_per_s,
            saturated: entry.saturated,
            samples: run.samples,
        });
    }
    let conditions = conditions
        .with_context(|| format!("{}: the sweep has no completed level", dir.display()))?;
    Ok(LoadedSweep {
        file,
        slo,
        levels,
        conditions,
    })
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
    let slo = args.run.slo.as_deref().map(SloSpec::parse).transpose()?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (rates, probe) = match parse_rates(&args.rates)? {
        Some(rates) => (rates, None),
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
    let per_request = slo.as_ref().map(SloSpec::per_request).unwrap_or_default();
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
        run.out = Some(out.join(&dir));
        run_command(run).await?;
        let loaded = load_run(&out.join(&dir), &per_request)?;
        let achieved = loaded.metrics.request_throughput;
        let records_path = out.join(&dir).join("records.jsonl");
        let records = read_records(&records_path)?;
        let backlog = backlog_trend(&records);
        let level_rates = level_rates(&records);
        let slow = match level_rates {
            Some(r) => r.completed < SATURATION_FRACTION * r.scheduled,
            None => achieved < SATURATION_FRACTION * rate,
        };
        let growing = backlog.is_some_and(|b| b.growing);
        let saturated = slow || growing;
        let check = slo.as_ref().map(|s| s.check(&loaded.samples));
        file.levels.push(LevelEntry {
            dir,
            offered_rate: rate,
            achieved_rate: achieved,
            output_tokens_per_s: loaded.metrics.output_throughput,
            saturated,
            rates: level_rates,
            backlog,
            slo_met: check.as_ref().map(|c| c.met),
        });
        let last = i + 1 == rates.len();
        if saturated && !last {
            file.stop_reason = Some(match backlog.filter(|_| !slow) {
                Some(b) => format!(
                    "saturated at {rate} req/s: requests in flight kept growing ({:.1} → {:.1} \
                     from the first to the last third of the window)",
                    b.first_third, b.last_third
                ),
                None => match level_rates {
                    Some(r) => format!(
                        "saturated at {rate} req/s: completed {:.3} req/s < {:.0}% of the \
                         {:.3} req/s scheduled over the same requests",
                        r.completed,
                        SATURATION_FRACTION * 100.0,
                        r.scheduled
                    ),
                    None => format!(
                        "saturated at {rate} req/s: achieved {achieved:.3} req/s < {:.0}% of \
                         offered",
                        SATURATION_FRACTION * 100.0
                    ),
                },
            });
        } else if let Some(c) = check.as_ref().filter(|c| c.worst_ratio() > BAD_SLO_FACTOR) {
            if !last {
                file.stop_reason = Some(format!(
                    "SLO broken badly at {rate} req/s (a percentile at {:.1}× its limit)",
                    c.worst_ratio()
                ));
            }
        }
        file.write(&out.join(SWEEP_FILE))?;
        if let Some(reason) = &file.stop_reason {
            eprintln!("loadgen sweep: stopping: {reason}");
            break;
        }
    }
    for level in &file.levels {
        println!(
            "{:>10.3} req/s offered  {:>10.3} achieved  {:>10.1} tok/s  saturated: {:<3}  SLO met: {}",
            level.offered_rate,
            level.achieved_rate,
            level.output_tokens_per_s,
            if level.saturated { "yes" } else { "no" },
            level.slo_met.map_or("–", |m| if m { "yes" } else { "no" })
        );
    }
    let (_, html) = write_report(&out, &sweep_report(&out)?)?;
    println!(
        "sweep: {}  report: {}",
        out.join(SWEEP_FILE).display(),
        html.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use reports::records::{ChunkTokensSource, CountSource};

    use super::*;

    /// A measured request scheduled and sent at `sent_ms`, ending at `end_ms`.
    fn record(id: u64, sent_ms: f64, end_ms: f64) -> RequestRecord {
        RequestRecord {
            id,
            phase: Phase::Measured,
            scheduled_ms: sent_ms,
            queue_ms: 0.0,
            sent_ms,
            first_token_ms: Some(sent_ms + 1.0),
            end_ms,
            chunk_ms: vec![sent_ms + 1.0, end_ms],
            chunk_tokens: vec![1, 1],
            chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
            prompt_tokens: 4,
            prompt_tokens_source: CountSource::Usage,
            output_tokens: 2,
            output_tokens_source: CountSource::Usage,
            requested_output_tokens: 2,
            short_output: false,
            prefix_group: None,
            http_status: Some(200),
            error: None,
        }
    }

    /// 40 req/s for 5 s to a server that serves `capacity` req/s FIFO with 100 ms service.
    fn level(capacity: f64) -> Vec<RequestRecord> {
        let mut free_at: f64 = 0.0;
        (0..200)
            .map(|i| {
                let sent = i as f64 * 25.0;
                let start = free_at.max(sent);
                free_at = start + 1000.0 / capacity;
                record(i, sent, start + 100.0)
            })
            .collect()
    }

    #[test]
    fn backlog_grows_only_past_capacity() {
        let stable = backlog_trend(&level(50.0)).unwrap();
        assert!(!stable.growing, "{stable:?}");
        assert!((stable.first_third - 4.0).abs() <= 1.0, "{stable:?}");
        // 40 req/s offered, 30 served: 10 more waiting every second, about 33 over 5 s.
        let overloaded = backlog_trend(&level(30.0)).unwrap();
        assert!(overloaded.growing, "{overloaded:?}");
        assert!(
            overloaded.last_third - overloaded.first_third > 20.0,
            "{overloaded:?}"
        );
        assert_eq!(backlog_trend(&[]), None);
        // A stable level with a slow spell near the end (requests sent from 3.25 s to 4.4 s
        // take 500 ms) that has drained by the end of the window.
        let mut burst = level(50.0);
        for r in burst.iter_mut().filter(|r| (130..176).contains(&r.id)) {
            r.end_ms = r.sent_ms + 500.0;
        }
        let burst = backlog_trend(&burst).unwrap();
        let noise = 3.0 * (burst.first_third + 1.0).sqrt();
        assert!(burst.last_third - burst.first_third > noise, "{burst:?}");
        assert!(!burst.growing, "{burst:?}");
    }

    #[test]
    fn level_rates_compare_the_same_requests() {
        let rates = level_rates(&level(50.0)).unwrap();
        assert!((rates.scheduled - 40.0).abs() < 1e-9);
        assert!((rates.completed - 40.0).abs() < 1e-9);
        let rates = level_rates(&level(30.0)).unwrap();
        assert!((rates.completed - 30.0).abs() < 1e-9, "{rates:?}");
        let mut failed = level(50.0);
        for r in failed.iter_mut().skip(1).step_by(2) {
            r.error = Some(reports::records::RequestError {
                kind: reports::records::ErrorKind::Http5xx,
                message: "500".into(),
            });
        }
        let rates = level_rates(&failed).unwrap();
        assert!((rates.completed - 20.0).abs() < 0.2, "{rates:?}");
    }

    #[test]
    fn rates_parse_and_auto_levels_spread_below_saturation() {
        assert_eq!(parse_rates("auto").unwrap(), None);
        assert_eq!(parse_rates("4, 1,2,2").unwrap(), Some(vec![1.0, 2.0, 4.0]));
        assert!(parse_rates("1,x").is_err());
        assert!(parse_rates("0").is_err());
        let step = |concurrency: usize, little_rate: f64| ProbeStep {
            concurrency,
            completed: 10,
            failed: 0,
            throughput: little_rate,
            mean_e2el_ms: concurrency as f64 / little_rate * 1000.0,
            little_rate,
        };
        let steps = vec![step(1, 10.0), step(2, 19.0), step(4, 30.0), step(8, 31.0)];
        let (probe, rates) =
            auto_levels(steps, "knee".into(), &[0.2, 0.4, 0.6, 0.8, 0.9, 1.0]).unwrap();
        assert_eq!(probe.knee_concurrency, 8);
        assert_eq!(probe.saturation_rate, 31.0);
        assert_eq!(rates, vec![6.2, 12.4, 18.6, 24.8, 27.9, 31.0]);
        assert!(auto_levels(Vec::new(), String::new(), &[1.0]).is_err());
    }
}
