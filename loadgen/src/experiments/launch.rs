//! A run from its flags (`loadgen run`, each sweep level, each matrix row): prepared,
//! calibrated against the built-in mock first when `--calibrate` asks, and executed. The
//! mock is reached from here, never from `execute` below it.

use std::sync::Arc;

use anyhow::Result;

use crate::mock::calibrate::{calibrate, CalibrateConfig};
use crate::run::execute::{execute_prepared, Execution};
use crate::run::prepare::prepare_run;
use crate::run::send::RunOutcome;
use crate::spec::RunSpec;

/// Prepares `run`, calibrates against the built-in mock first when `--calibrate` asks, and
/// executes the plan against `--url` into `--out` (`loadgen run`, and each sweep level).
pub async fn prepare_and_execute(
    run: &RunSpec,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<RunOutcome> {
    let mut prepared = prepare_run(run)?;
    if run.calibrate {
        eprintln!("loadgen: calibrating against the built-in mock…");
        prepared.calibration = Some(
            calibrate(&CalibrateConfig {
                // The rate is unused by a closed loop.
                rate: run.rate().unwrap_or(CalibrateConfig::default().rate),
                concurrency: run.concurrency(),
                // An https:// run is calibrated over TLS too.
                tls: run
                    .target
                    .url
                    .starts_with("https://")
                    .then(crate::wire::tls::self_signed_pair)
                    .transpose()?
                    .map(Arc::new),
                ..CalibrateConfig::default()
            })
            .await?,
        );
    }
    execute_prepared(
        run,
        &prepared,
        Execution {
            url: run.target.url.clone(),
            out: run.out.clone(),
            server_version: None,
            extra: Default::default(),
            progress: run.progress,
            stop,
        },
    )
    .await
}
