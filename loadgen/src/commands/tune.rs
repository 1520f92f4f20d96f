//! `loadgen tune`: the tune (`experiments::tune`), then exit 3 when no configuration meets
//! the SLO.

use anyhow::Result;

use crate::experiments::tune::run_tune;
use crate::run::stop::stop_on_signals;
use crate::spec::tune::TuneArgs;

/// `loadgen tune`.
pub async fn tune_command(args: TuneArgs) -> Result<()> {
    let file = run_tune(&args, stop_on_signals()?).await?;
    if file.winner.is_none() {
        return Err(crate::gate::Gate {
            code: crate::gate::SLO_NOT_MET,
            message: "loadgen tune: no configuration meets the SLO".into(),
        }
        .into());
    }
    Ok(())
}
