//! `loadgen calibrate`: the client's own error, measured against the built-in mock.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::mock::calibrate::{calibrate, CalibrateConfig};
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
    /// Over TLS, with a self-signed certificate made for the run.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls: bool,
    /// Over TLS, the mock serving this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
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
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(std::sync::Arc::new(crate::wire::tls::files_pair(
                cert, key,
            )?)),
            _ if args.tls => Some(std::sync::Arc::new(crate::wire::tls::self_signed_pair()?)),
            _ => None,
        },
    })
    .await?;
    eprintln!(
        "loadgen calibrate: {}\n  client's TTFT error: p50 {:.3} ms, p99 {:.3} ms (the mock's own \
         lateness, p99 {:.3} ms, subtracted per request); send lag p99 {:.3} ms",
        cal.load,
        cal.added_ttft_p50_ms,
        cal.added_ttft_p99_ms,
        cal.mock_lateness_p99_ms,
        cal.schedule_lag_p99_ms
    );
    println!("{}", serde_json::to_string_pretty(&cal)?);
    Ok(())
}
