//! Self-calibration: run the client against the built-in mock (known TTFT and ITL) and
//! report what the client adds. The mock's own timer granularity (tokio, ~1 ms) is part of
//! the measured error, so the numbers are an upper bound on the client's share.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use reports::records::Calibration;

use crate::client::{Backend, Target};
use crate::mock::{self, MockConfig};
use crate::run::{self, LoadMode, Plan, PlannedRequest, RunOptions};
use crate::schedule::{Arrival, Extent, ScheduleSpec};
use crate::workload::prompt::PromptBuilder;
use crate::workload::{prefixed_blocks, PromptSource, RequestSpec};

/// What to calibrate.
#[derive(Debug, Clone)]
pub struct CalibrateConfig {
    /// Open-loop Poisson rate; ignored when `concurrency` is set.
    pub rate: f64,
    /// Closed loop at this concurrency instead.
    pub concurrency: Option<usize>,
    pub duration: Duration,
    pub output_tokens: u32,
    pub mock_ttft: Duration,
    pub mock_itl: Duration,
    pub seed: u64,
}

impl Default for CalibrateConfig {
    fn default() -> Self {
        CalibrateConfig {
            rate: 20.0,
            concurrency: None,
            duration: Duration::from_secs(5),
            output_tokens: 64,
            mock_ttft: Duration::from_millis(50),
            mock_itl: Duration::from_millis(10),
            seed: 1,
        }
    }
}

/// Runs the calibration on the current runtime and returns the measured client error.
pub async fn calibrate(cfg: &CalibrateConfig) -> Result<Calibration> {
    let (addr, handle) = mock::spawn(MockConfig {
        ttft: cfg.mock_ttft,
        itl: cfg.mock_itl,
        ..MockConfig::default()
    })
    .await?;
    let secs = cfg.duration.as_secs_f64();
    let spec = |i: u64| RequestSpec {
        input_len: 32,
        output_len: cfg.output_tokens,
        prefix_group: None,
        prompt: PromptSource::Blocks(prefixed_blocks(cfg.seed, i, 32, None)),
    };
    let (mode, requests) = match cfg.concurrency {
        Some(c) => (
            LoadMode::Closed { concurrency: c },
            (0..c as u64 * 4)
                .map(|i| PlannedRequest {
                    id: i,
                    at_s: None,
                    spec: spec(i),
                })
                .collect(),
        ),
        None => {
            let times = ScheduleSpec {
                arrival: Arrival::Poisson,
                rate: cfg.rate,
                ramp_up: None,
            }
            .generate(Extent::Until(secs), cfg.seed)?;
            let requests = times
                .into_iter()
                .enumerate()
                .map(|(i, t)| PlannedRequest {
                    id: i as u64,
                    at_s: Some(t),
                    spec: spec(i as u64),
                })
                .collect();
            (LoadMode::Open, requests)
        }
    };
    let plan = Plan {
        requests,
        mode,
        warmup_s: 0.0,
        duration_s: Some(secs),
        cooldown_s: 0.0,
        max_concurrency: None,
    };
    let target = Target {
        base_url: format!("http://{addr}"),
        backend: Backend::Completions,
        model: "loadgen-mock".into(),
        headers: Vec::new(),
        api_key: None,
        timeout: Duration::from_secs(60),
        ignore_eos: true,
        min_tokens: false,
        prompt_ids: false,
        continuous_usage: true,
    };
    let outcome = run::execute(
        Arc::new(plan),
        target,
        Arc::new(PromptBuilder::approximate()),
        RunOptions {
            out_dir: None,
            slos: Vec::new(),
            progress: false,
            stop: run::never_stop(),
        },
    )
    .await?;
    handle.shutdown().await;
    let m = &outcome.metrics;
    let ttft = cfg.mock_ttft.as_secs_f64() * 1000.0;
    let itl = cfg.mock_itl.as_secs_f64() * 1000.0;
    Ok(Calibration {
        rate: cfg.concurrency.is_none().then_some(cfg.rate),
        concurrency: cfg.concurrency,
        mock_ttft_ms: ttft,
        mock_itl_ms: itl,
        requests: m.completed + m.failed,
        added_ttft_p50_ms: m.ttft.p50 - ttft,
        added_ttft_p99_ms: m.ttft.p99 - ttft,
        added_itl_p50_ms: m.chunk_itl.p50 - itl,
        added_itl_p99_ms: m.chunk_itl.p99 - itl,
        schedule_lag_p99_ms: m.schedule_lag.p99,
        output_tokens_per_s: m.output_throughput,
    })
}
