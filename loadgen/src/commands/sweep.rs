//! `loadgen sweep`: the sweep (`experiments::sweep`), then the `--fail-on-slo` gate.

use anyhow::Result;
use reports::folders::SweepFile;

use crate::experiments::sweep::run_sweep;
use crate::run::stop::stop_on_signals;
use crate::spec::sweep::SweepArgs;

/// `loadgen sweep`: [`run_sweep`], then the `--fail-on-slo` gate.
pub async fn sweep_command(args: SweepArgs) -> Result<()> {
    let file = run_sweep(&args, stop_on_signals()?).await?;
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
