//! Shared by the sweep tests: the subcommand parsers and a mock whose saturation rate is known.

use std::time::Duration;

use clap::Parser;
use loadgen::commands::plan::PlanArgs;
use loadgen::mock::MockConfig;
use loadgen::spec::sweep::SweepArgs;

#[derive(Parser)]
pub struct Sweep {
    #[command(flatten)]
    pub args: SweepArgs,
}

#[derive(Parser)]
pub struct Plan {
    #[command(flatten)]
    pub args: PlanArgs,
}

/// Saturation rate of [`four_slot_mock`] with 16 output tokens: K / S = 4 / 0.1 s.
pub const SATURATION: f64 = 40.0;

/// 4 slots × (20 ms TTFT + 16 × 5 ms ITL = 100 ms per request).
pub fn four_slot_mock() -> MockConfig {
    MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        slots: 4,
        ..MockConfig::default()
    }
}
