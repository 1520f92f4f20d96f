//! Self-calibration: run the client against the built-in mock (known TTFT and ITL) and
//! report what the client adds. The mock runs on its own thread and runtime, times each
//! answer from its request's arrival (the kernel's receive stamp) and logs, per request, how
//! late it sent the first chunk against its configured TTFT; the client's error on a request
//! is its measured TTFT minus the configured TTFT minus that lateness. What neither side can
//! see (the kernel's loopback) stays in the client's share, so the figures are an upper
//! bound on it.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use anyhow::{Context, Result};
use reports::records::{Calibration, Phase};
use reports::stats::percentile_nearest_rank;

use crate::load::plan::Plan;
use crate::load::schedule::{Arrival, Extent, ScheduleSpec};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::{prefixed_blocks, PromptSource, RequestSpec};
use crate::mock::{MockConfig, MockLog, ThreadedMock};
use crate::run::send::{send_plan, SendOptions};
use crate::wire::backend::Backend;
use crate::wire::target::Target;

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
    /// Over TLS: the mock's configuration and the client's settings.
    pub tls: Option<Arc<crate::wire::tls::LocalPair>>,
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
            tls: None,
        }
    }
}

/// Runs the calibration on the current runtime and returns the measured client error.
pub async fn calibrate(cfg: &CalibrateConfig) -> Result<Calibration> {
    let log = MockLog::default();
    let (addr, mock) = ThreadedMock::start(MockConfig {
        ttft: cfg.mock_ttft,
        itl: cfg.mock_itl,
        log: Some(log.clone()),
        tls: cfg.tls.as_ref().map(|pair| pair.server.clone()),
        ..MockConfig::default()
    })?;
    let secs = cfg.duration.as_secs_f64();
    let spec = |i: u64| RequestSpec {
        input_len: 32,
        output_len: cfg.output_tokens,
        prefix_group: None,
        prompt: PromptSource::Blocks(prefixed_blocks(cfg.seed, i, 32, None)),
        model: None,
        class: None,
    };
    let plan = match cfg.concurrency {
        Some(c) => Plan::closed(c, c * 4, spec),
        None => {
            let times = ScheduleSpec {
                arrival: Arrival::Poisson,
                rate: cfg.rate,
                ramp_up: None,
            }
            .generate(Extent::Until(secs), cfg.seed)?;
            Plan::open(times, spec)
        }
    };
    let plan = Plan {
        duration_s: Some(secs),
        ..plan
    };
    let target = Target {
        base_url: format!(
            "{}://{addr}",
            if cfg.tls.is_some() { "https" } else { "http" }
        ),
        backend: Backend::Completions,
        model: "loadgen-mock".into(),
        headers: Vec::new(),
        api_key: None,
        timeout: Duration::from_secs(60),
        ignore_eos: true,
        min_tokens: false,
        prompt_ids: false,
        continuous_usage: true,
        extra_body: None,
        tls: cfg.tls.as_ref().map(|pair| pair.client.clone()),
    };
    let outcome = send_plan(
        Arc::new(plan),
        target,
        Arc::new(PromptBuilder::approximate()),
        SendOptions {
            out_dir: None,
            slos: Vec::new(),
            progress: false,
            stop: crate::run::stop::never_stop(),
            start_at: None,
        },
    )
    .await;
    tokio::task::spawn_blocking(move || mock.shutdown())
        .await
        .context("stopping the mock")?;
    let outcome = outcome?;
    let m = &outcome.metrics;
    let ttft = cfg.mock_ttft.as_secs_f64() * 1000.0;
    let itl = cfg.mock_itl.as_secs_f64() * 1000.0;
    let lateness: HashMap<u64, f64> = log
        .events()
        .iter()
        .filter_map(|e| Some((e.id?, e.first_chunk_lateness_ms)))
        .collect();
    let (mut added, mut raw) = (Vec::new(), Vec::new());
    for r in outcome
        .records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
    {
        let (Some(first), Some(late)) = (r.first_token_ms, lateness.get(&r.id)) else {
            continue;
        };
        raw.push(first - r.sent_ms - ttft);
        added.push(first - r.sent_ms - ttft - late);
    }
    let mut late: Vec<f64> = lateness.values().copied().collect();
    for v in [&mut added, &mut raw, &mut late] {
        v.sort_by(f64::total_cmp);
    }
    let pct = |v: &[f64], p: f64| percentile_nearest_rank(v, p).unwrap_or(f64::NAN);
    let events_per_s = m.chunk_itl.count as f64 / m.duration_s.max(1e-9);
    let load = match cfg.concurrency {
        Some(c) => format!("{c} concurrent streams"),
        None => format!("Poisson {} req/s", cfg.rate),
    };
    Ok(Calibration {
        rate: cfg.concurrency.is_none().then_some(cfg.rate),
        concurrency: cfg.concurrency,
        mock_ttft_ms: ttft,
        mock_itl_ms: itl,
        load: format!(
            "{load} × {} tokens, TTFT {ttft} ms, ITL {itl} ms: {events_per_s:.0} SSE events/s",
            cfg.output_tokens
        ),
        requests: m.completed + m.failed,
        added_ttft_p50_ms: pct(&added, 50.0),
        added_ttft_p99_ms: pct(&added, 99.0),
        raw_added_ttft_p99_ms: pct(&raw, 99.0),
        mock_lateness_p99_ms: pct(&late, 99.0),
        added_itl_p50_ms: m.chunk_itl.p50 - itl,
        added_itl_p99_ms: m.chunk_itl.p99 - itl,
        schedule_lag_p99_ms: m.schedule_lag.p99,
        output_tokens_per_s: m.output_throughput,
    })
}
