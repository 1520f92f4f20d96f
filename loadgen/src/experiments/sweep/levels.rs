//! One level of a sweep: its run options (rate, salt, seed, warm-up, length and start
//! instant), its run, and its measurement; and the closed-loop probe that precedes a
//! search or `--rates auto`.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use reports::folders::{LevelEntry, LevelWarmup, Probe};
use reports::slo::{SloCheck, SloSpec};

use crate::experiments::launch::prepare_and_execute;
use reports::probe::saturation_estimate;

use crate::experiments::sweep::probe::probe_saturation;
use crate::spec::sweep::{SweepArgs, DEFAULT_PROBE_DURATION, DEFAULT_PROBE_MAX_CONCURRENCY};
use crate::spec::RunSpec;

/// What every level of one sweep shares.
pub(super) struct Levels<'a> {
    /// The sweep's run options, typed once; each level's are these at its rate.
    pub(super) spec: &'a RunSpec,
    pub(super) out: &'a Path,
    pub(super) slo: Option<&'a SloSpec>,
    pub(super) min_requests: Option<u64>,
    pub(super) timetable: Option<(SystemTime, Duration)>,
    /// The saturation probe, whose E2E at each load sets that level's warm-up.
    pub(super) probe: Option<Probe>,
    pub(super) stop: tokio::sync::watch::Receiver<bool>,
}

/// Which run of a level: the first (repeat 0, the search's or the list's own), or a repeat.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LevelRun {
    /// Twice the requests (a re-run of an unknown verdict).
    pub(super) doubled: bool,
    pub(super) repeat: usize,
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
    pub(super) async fn run(
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
        let mut run = self.spec.at_level(rate, i, self.out.join(&dir));
        if how.repeat > 0 {
            run.seed = repeat_seed(self.spec.seed, how.repeat);
        }
        // A timetable fixes every level's span in advance, and a level of --num-prompts
        // requests (no --duration) measures all of them after the warm-up given.
        let warmup = if self.timetable.is_some() || run.window.duration.is_none() {
            level_warmup(run.window.warmup, None, rate)
        } else {
            level_warmup(run.window.warmup, self.probe.as_ref(), rate)
        };
        run.window.warmup = Duration::from_secs_f64(warmup.secs);
        let mut run = run.lengthened_to(rate, self.min_requests);
        if how.doubled {
            run = run.doubled();
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

    pub(super) fn interrupted(&self) -> bool {
        *self.stop.borrow()
    }
}

/// The stop reason of a level cut short by a stop (SIGTERM, Ctrl-C): its folder keeps the
/// requests that finished, but the level is neither judged nor kept in `sweep.json`, since the
/// stop, not the server, cut its requests in flight (a saturation verdict would blame the
/// server for them).
pub(super) fn cut_level(rate: f64, dir: &str) -> String {
    format!(
        "interrupted during the level at {rate} req/s: its folder {dir} keeps the requests that \
         finished; the level is not judged"
    )
}

/// The seed of a level's `repeat`-th repeat: a fresh schedule and workload draw.
pub fn repeat_seed(seed: u64, repeat: usize) -> u64 {
    crate::load::workload::mix(seed, 0x5EED_0000 + repeat as u64)
}

/// The closed-loop probe of `--rates auto` and `search` (`for_search`: it ends early when
/// the SLO is missed unloaded).
pub(super) async fn probe(
    args: &SweepArgs,
    spec: &RunSpec,
    slo: Option<&SloSpec>,
    for_search: bool,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Probe> {
    eprintln!(
        "loadgen sweep: --rates {}: probing the saturation rate (closed loop)…",
        args.rates
    );
    let (steps, reason) = probe_saturation(
        spec,
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::sweep::min_requests;

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
        let run = <crate::cli::Cli as clap::Parser>::try_parse_from([
            "loadgen",
            "run",
            "--duration",
            "40s",
        ])
        .map(|c| match c.command {
            crate::cli::Command::Run(r) => RunSpec::from_args(&r).unwrap(),
            _ => unreachable!(),
        })
        .unwrap();
        // 0.4 req/s × 40 s = 16 requests < 368: the level lasts long enough to expect
        // 368 + 3·√368 = 425.5 requests, 1,063.9 s.
        let run = run.lengthened_to(0.4, Some(368));
        let secs = run.window.duration.unwrap().as_secs_f64();
        assert!(
            (secs - (368.0 + 3.0 * 368f64.sqrt()) / 0.4).abs() < 1e-6,
            "{secs}"
        );
        let run = run.lengthened_to(10.0, Some(368));
        assert_eq!(
            run.window.duration.unwrap().as_secs_f64(),
            secs,
            "long enough already"
        );
    }
}
