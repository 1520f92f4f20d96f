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

use reports::probe::measure_step;
use reports::slo::{SloSpec, SloVerdict};

use crate::run::execute::{execute_prepared, Execution};
use crate::run::prepare::prepare_run;
use crate::spec::RunSpec;
use reports::folders::ProbeStep;

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
    let step = measure_step(concurrency, &outcome.metrics, &outcome.records, slo);
    eprintln!(
        "loadgen sweep: probe at concurrency {concurrency}: {:.3} req/s (Little: {:.3}), mean E2E {:.1} ms",
        step.throughput, step.little_rate, step.mean_e2el_ms
    );
    Ok(Some(step))
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
    use reports::probe::saturation_estimate;

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
}
