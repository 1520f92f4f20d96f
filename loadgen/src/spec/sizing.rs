//! The load to plan for and what an instance costs: `plan`'s and `tune`'s sizing options.

use clap::Args;
use reports::capacity::{PlanOptions, TargetLoad, DEFAULT_HEADROOM};
use reports::stats::Bootstrap;

/// The load to plan for and what an instance costs (`plan`, and `tune`'s plan from its
/// winner).
#[derive(Args, Debug, Clone)]
pub struct SizingArgs {
    /// Peak load to serve, requests/s.
    #[arg(long, conflicts_with = "daily_requests")]
    pub target_qps: Option<f64>,
    /// Requests per day; peak QPS = daily / 86400 × --peak-factor.
    #[arg(long)]
    pub daily_requests: Option<f64>,
    #[arg(long, default_value_t = 1.0)]
    pub peak_factor: f64,
    #[arg(long, default_value_t = 1)]
    pub gpus_per_instance: u32,
    /// Spare capacity: instances = ⌈target × headroom / max QPS⌉.
    #[arg(long, default_value_t = DEFAULT_HEADROOM)]
    pub headroom: f64,
    /// Price of one GPU-hour in USD, for the cost per million output tokens.
    #[arg(long)]
    pub gpu_hour_usd: Option<f64>,
}

impl SizingArgs {
    /// The plan's options, or `None` when no target load was given.
    pub fn options(&self, seed: u64) -> Option<PlanOptions> {
        let target = match (self.target_qps, self.daily_requests) {
            (Some(qps), _) => TargetLoad::Qps(qps),
            (None, Some(requests)) => TargetLoad::Daily {
                requests,
                peak_factor: self.peak_factor,
            },
            (None, None) => return None,
        };
        Some(PlanOptions {
            target,
            gpus_per_instance: self.gpus_per_instance,
            headroom: self.headroom,
            gpu_hour_usd: self.gpu_hour_usd,
            bootstrap: Bootstrap {
                seed,
                ..Bootstrap::default()
            },
        })
    }
}
