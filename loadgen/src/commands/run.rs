//! `loadgen run`: one seeded workload against one server.

use anyhow::Result;

use crate::prepare::{run_once, RunArgs};

/// `loadgen run`.
pub async fn run_command(args: RunArgs) -> Result<()> {
    let stop = crate::stop::stop_on_signals()?;
    let outcome = run_once(&args, stop).await?;
    print!("{}", reports::table::render(&outcome.summary));
    Ok(())
}
