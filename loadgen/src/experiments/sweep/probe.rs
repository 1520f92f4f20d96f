//! The saturation probe of `sweep --rates auto` and `search`: closed-loop probes at
//! concurrency 1, 2, 4, … (each `--probe-duration` long) until the Little's-law rate,
//! concurrency / mean E2E latency, grows by less than 10% on a doubling; the highest such rate
//! is the saturation estimate; `auto`'s levels are `--auto-fractions` of it, and the knee
//! search starts there. Each step is checked against the SLO too: a miss at concurrency 1 is
//! a miss unloaded. Little's law needs whole requests: when a step
//! completes fewer requests than its concurrency, the requests that finished are the short
//! ones and their mean understates E2E (at concurrency 32 a CPU engine once completed 2
//! requests in 8 s, whose mean gave 5.9 req/s against a real 1.8), so such a censored step
//! (or one that completed nothing) is lengthened once to twice the step; if still censored it
//! does not count, and the probe ends with the previous step's rate as its estimate, as it does
//! when every request of a step failed. The probe fails only when its very first step
//! measures nothing.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use reports::metrics::PERCENTILE_CI_LEVEL;
use reports::samples::LatencySamples;
use reports::slo::{SloSpec, SloVerdict};
use reports::stats::quantile_ci;

use crate::run::execute::{execute_prepared, Execution};
use crate::run::prepare::prepare_run;
use crate::spec::RunSpec;
use reports::folders::{Probe, ProbeStep};

/// The probe stops doubling the concurrency when the Little's-law rate grows by less than this.
pub const PROBE_MIN_GAIN: f64 = 1.10;

/// Closed-loop probes at concurrency 1, 2, 4, … until the Little's-law rate stops growing
/// (gain < [`PROBE_MIN_GAIN`]), a step fails requests, or `max_concurrency` is reached; each
/// step checked against `slo` when given, and with `end_if_unloaded_misses` the probe ends
/// after a concurrency-1 step that does not meet it (a knee search has nothing left to find).
pub async fn probe_saturation(
    run: &RunSpec,
    step_duration: Duration,
    max_concurrency: usize,
    slo: Option<&SloSpec>,
    end_if_unloaded_misses: bool,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(Vec<ProbeStep>, String)> {
    let mut steps: Vec<ProbeStep> = Vec::new();
    let mut concurrency = 1;
    // Every execution gets prompt words of its own, a lengthened retry too: the server's
    // prefix cache would otherwise answer the retry's prompts faster.
    let mut executions = 0;
    loop {
        let mut lengthened = false;
        let step = loop {
            let duration = if lengthened {
                step_duration * 2
            } else {
                step_duration
            };
            executions += 1;
            let Some(step) = probe_step(
                run,
                concurrency,
                duration,
                executions - 1,
                slo,
                stop.clone(),
            )
            .await?
            else {
                if steps.is_empty() {
                    bail!("interrupted during the probe at concurrency {concurrency}");
                }
                return Ok((steps, format!("interrupted at concurrency {concurrency}")));
            };
            // Little's law needs whole requests: with fewer completions than the concurrency,
            // only the short requests finished.
            if (step.completed as usize) >= concurrency.max(1) {
                break step;
            }
            if step.completed == 0 && step.failed > 0 {
                if steps.is_empty() {
                    bail!(
                        "probe at concurrency {concurrency}: no request completed ({} failed)",
                        step.failed
                    );
                }
                return Ok((
                    steps,
                    format!(
                        "all {} requests failed at concurrency {concurrency}: the previous \
                         step's rate stands",
                        step.failed
                    ),
                ));
            }
            if !lengthened {
                eprintln!(
                    "loadgen sweep: probe at concurrency {concurrency}: {} requests completed \
                     within the step; lengthening it once to {:?}",
                    step.completed,
                    duration * 2
                );
                lengthened = true;
                continue;
            }
            let Some(previous) = steps.last() else {
                bail!(
                    "probe at concurrency {concurrency}: {} requests completed even in a step \
                     lengthened to {duration:?}: requests outlast it (give a longer \
                     --probe-duration)",
                    step.completed
                );
            };
            let reason = format!(
                "at concurrency {concurrency} only {} requests completed, even in a step \
                 lengthened to {duration:?}: requests outlast it, so the previous step's rate \
                 (concurrency {}) stands as the estimate",
                step.completed, previous.concurrency
            );
            eprintln!("loadgen sweep: probe: {reason}");
            return Ok((steps, reason));
        };
        let best = steps.iter().map(|s| s.little_rate).fold(0.0, f64::max);
        let (failed, rate) = (step.failed, step.little_rate);
        let missed = step.slo_verdict == Some(SloVerdict::NotMet) || step.slo_missed;
        steps.push(step);
        if concurrency == 1 && missed && end_if_unloaded_misses {
            return Ok((
                steps,
                "the SLO is not met at concurrency 1 (unloaded)".into(),
            ));
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

/// One closed-loop probe step at `concurrency` for `duration` (plus a quarter of it as
/// warm-up), the `index`-th step run; `None` when interrupted.
async fn probe_step(
    run: &RunSpec,
    concurrency: usize,
    duration: Duration,
    index: usize,
    slo: Option<&SloSpec>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<ProbeStep>> {
    let args = run.probe_step(concurrency, duration, index);
    let prepared = prepare_run(&args)?;
    let outcome = execute_prepared(
        &args,
        &prepared,
        Execution {
            url: args.target.url.clone(),
            out: None,
            server_version: None,
            extra: Default::default(),
            progress: false,
            stop: stop.clone(),
        },
    )
    .await
    .with_context(|| format!("probe at concurrency {concurrency}"))?;
    if *stop.borrow() {
        return Ok(None);
    }
    let m = &outcome.metrics;
    let mean_s = m.e2el.mean / 1000.0;
    let samples = LatencySamples::from_records(&outcome.records);
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
        slo_verdict: slo.map(|s| s.check(&samples).verdict),
        slo_missed: slo.is_some_and(|s| surely_missed(s, &samples)),
    };
    eprintln!(
        "loadgen sweep: probe at concurrency {concurrency}: {:.3} req/s (Little: {:.3}), mean E2E {:.1} ms",
        step.throughput, step.little_rate, step.mean_e2el_ms
    );
    Ok(Some(step))
}

/// Whether `samples` miss a target of `slo` beyond doubt: the target percentile's 95%
/// interval lies wholly above its limit. A short step cannot bound a high percentile from
/// above (the "p99" of 20 requests is their maximum), but it can from below: when the 4th
/// smallest of 5 values already exceeds the limit, so does the p99.
pub fn surely_missed(slo: &SloSpec, samples: &LatencySamples) -> bool {
    slo.targets.iter().any(|t| {
        let mut values = samples.values(t.metric);
        values.sort_by(f64::total_cmp);
        quantile_ci(&values, t.percentile / 100.0, PERCENTILE_CI_LEVEL)
            .lower
            .is_some_and(|low| low > t.limit_ms)
    })
}

/// The probe's saturation estimate: its step with the highest Little's-law rate.
pub fn saturation_estimate(steps: Vec<ProbeStep>, stop_reason: String) -> Result<Probe> {
    let knee = steps
        .iter()
        .max_by(|a, b| a.little_rate.total_cmp(&b.little_rate))
        .context("the probe has no step")?;
    let saturation_rate = knee.little_rate;
    if !(saturation_rate.is_finite() && saturation_rate > 0.0) {
        bail!("the probe found no positive saturation rate");
    }
    Ok(Probe {
        knee_concurrency: knee.concurrency,
        saturation_rate,
        fractions: Vec::new(),
        stop_reason,
        steps,
    })
}

/// `--rates auto`'s levels: `fractions` of the saturation rate, rounded to 0.001 req/s.
pub fn auto_levels(saturation_rate: f64, fractions: &[f64]) -> Result<Vec<f64>> {
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
    Ok(rates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_levels_spread_below_saturation() {
        let step = |concurrency: usize, little_rate: f64| ProbeStep {
            concurrency,
            completed: 10,
            failed: 0,
            throughput: little_rate,
            mean_e2el_ms: concurrency as f64 / little_rate * 1000.0,
            little_rate,
            slo_verdict: None,
            slo_missed: false,
        };
        let steps = vec![step(1, 10.0), step(2, 19.0), step(4, 30.0), step(8, 31.0)];
        let probe = saturation_estimate(steps, "knee".into()).unwrap();
        assert_eq!(probe.knee_concurrency, 8);
        assert_eq!(probe.saturation_rate, 31.0);
        let rates = auto_levels(probe.saturation_rate, &[0.2, 0.4, 0.6, 0.8, 0.9, 1.0]).unwrap();
        assert_eq!(rates, vec![6.2, 12.4, 18.6, 24.8, 27.9, 31.0]);
        assert!(saturation_estimate(Vec::new(), String::new()).is_err());
        assert!(auto_levels(31.0, &[0.5, -1.0]).is_err());
    }

    #[test]
    fn a_short_step_surely_misses_when_even_its_low_values_do() {
        let slo = SloSpec::parse("ttft:p99:100ms").unwrap();
        let samples = |ttfts: &[f64]| LatencySamples {
            requests: ttfts
                .iter()
                .enumerate()
                .map(|(i, &t)| reports::samples::RequestSample {
                    id: i as u64,
                    ttft_ms: t,
                    ttfa_ms: Some(t),
                    tpot_ms: None,
                    e2el_ms: t,
                })
                .collect(),
            schedule_lag_ms: Vec::new(),
        };
        // 5 values: the p99's 95% interval starts at the 4th smallest.
        assert!(surely_missed(
            &slo,
            &samples(&[90.0, 120.0, 130.0, 140.0, 150.0])
        ));
        assert!(!surely_missed(
            &slo,
            &samples(&[90.0, 95.0, 99.0, 100.0, 150.0])
        ));
        // Even 2 values both above the limit put a p99 above it (0.01² chance otherwise),
        // but not a p50 (a 1 in 4 chance).
        assert!(surely_missed(&slo, &samples(&[150.0, 160.0])));
        let p50 = SloSpec::parse("ttft:p50:100ms").unwrap();
        assert!(
            !surely_missed(&p50, &samples(&[150.0, 160.0])),
            "too few to say"
        );
    }
}
