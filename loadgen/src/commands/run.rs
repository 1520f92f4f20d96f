//! `loadgen run`: one seeded workload against one server.

use anyhow::Result;
use reports::samples::LatencySamples;

use crate::experiments::launch::prepare_and_execute;
use crate::gate::slo_gate;
use crate::spec::run_args::RunArgs;
use crate::spec::RunSpec;

/// `loadgen run`; with `--fail-on-slo`, the SLO judged over the measured window as a sweep
/// level is judged decides the exit code.
pub async fn run_command(args: RunArgs) -> Result<()> {
    let spec = RunSpec::from_args(&args)?;
    let stop = crate::run::stop::stop_on_signals()?;
    let outcome = prepare_and_execute(&spec, stop).await?;
    print!("{}", reports::table::render(&outcome.summary));
    if let Some(slo) = &spec.slo {
        let check = slo.check(&LatencySamples::from_records(&outcome.records));
        println!("SLO {slo}: {}", check.verdict);
        if spec.fail_on_slo {
            slo_gate("loadgen run", &check)?;
        }
    }
    Ok(())
}
