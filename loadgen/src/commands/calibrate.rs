//! `loadgen calibrate`: the client's own error, measured against the built-in mock.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::calibrate::{calibrate, CalibrateConfig};
use crate::units::duration_arg;

#[derive(Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// Open-loop Poisson rate.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Closed loop at this concurrency instead.
    #[arg(long)]
    pub concurrency: Option<usize>,
    #[arg(long, value_parser = duration_arg, default_value = "10s")]
    pub duration: Duration,
    #[arg(long, default_value_t = 64)]
    pub output_tokens: u32,
    #[arg(long, value_parser = duration_arg, default_value = "50ms")]
    pub ttft: Duration,
    #[arg(long, value_parser = duration_arg, default_value = "10ms")]
    pub itl: Duration,
}

/// `loadgen calibrate`: prints the calibration as JSON.
pub async fn calibrate_command(args: CalibrateArgs) -> Result<()> {
    let cal = calibrate(&CalibrateConfig {
        rate: args.rate,
        concurrency: args.concurrency,
        duration: args.duration,
        output_tokens: args.output_tokens,
        mock_ttft: args.ttft,
        mock_itl: args.itl,
        seed: 1,
    })
    .await?;
    println!("{}", serde_json::to_string_pretty(&cal)?);
    Ok(())
}
