//! `loadgen plan SWEEP_DIR`: the capacity plan of a sweep under its SLO, printed and written
//! to `plan.json` (and into the sweep's report).

use std::fmt::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use reports::capacity::{capacity_plan, CapacityPlan};
use reports::render::write_report;
use reports::slo::SloSpec;

use reports::folders::{load_sweep, PLAN_FILE};
use reports::render::views::sweep_report;

use crate::spec::sizing::SizingArgs;

#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// Sweep folder (with sweep.json).
    pub dir: PathBuf,
    /// SLO to plan under (default: the sweep's --slo), e.g. ttft:p99:500ms,tpot:p99:50ms.
    #[arg(long)]
    pub slo: Option<String>,
    #[command(flatten)]
    pub sizing: SizingArgs,
    /// Seed of the bootstrap CI of the interpolated crossing.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

/// `loadgen plan`.
pub fn plan_command(args: PlanArgs) -> Result<()> {
    let options = args
        .sizing
        .options(args.seed)
        .context("loadgen plan: give --target-qps or --daily-requests")?;
    let sweep = load_sweep(&args.dir)?;
    let slo = match (&args.slo, &sweep.slo) {
        (Some(text), _) => SloSpec::parse(text)?,
        (None, Some(slo)) => slo.clone(),
        (None, None) => bail!(
            "{}: the sweep has no SLO; give one with --slo ttft:p99:500ms,…",
            args.dir.display()
        ),
    };
    let plan = capacity_plan(&sweep.levels, &slo, &options)?;
    print!("{}", plan_text(&plan));
    let path = args.dir.join(PLAN_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&plan)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let (_, html) = write_report(&args.dir, &sweep_report(&args.dir)?)?;
    println!("plan: {}  report: {}", path.display(), html.display());
    Ok(())
}

/// The plan as terminal text.
pub fn plan_text(plan: &CapacityPlan) -> String {
    let mut out = format!("Capacity plan under SLO: {}\n", plan.slo);
    for level in &plan.levels {
        let _ = writeln!(
            out,
            "  {:>9.3} req/s offered, {:>9.3} completed: {}{}{}",
            level.offered_rate,
            level.completed_rate,
            if level.passed { "meets SLO" } else { "fails" },
            if level.saturated { " (saturated)" } else { "" },
            if level.runs > 1 {
                format!(" ({} runs pooled)", level.runs)
            } else {
                String::new()
            }
        );
    }
    if let Some(max) = plan.max_sustainable {
        let _ = writeln!(
            out,
            "Max sustainable QPS: {:.3} req/s sustained ({} req/s offered); the plan sizes from \
             the sustained rate",
            max.sustained_rate, max.offered_rate
        );
    }
    if let Some(c) = plan.crossing {
        let _ = writeln!(
            out,
            "Interpolated crossing: {:.3} req/s ({:.0}% CI {:.3}–{:.3})",
            c.estimate,
            c.confidence * 100.0,
            c.lower,
            c.upper
        );
    }
    if let Some(c) = plan.crossing_between_runs {
        let _ = writeln!(
            out,
            "Crossing between runs: {:.3} req/s ({:.0}% Student t-interval {:.3}–{:.3} over the \
             runs' crossings {})",
            c.estimate,
            c.confidence * 100.0,
            c.lower,
            c.upper,
            plan.run_crossings_text()
        );
    }
    if let Some(s) = &plan.sizing {
        let _ = writeln!(out, "Sized from {}", s.sized_from);
        let _ = writeln!(
            out,
            "Target {:.3} req/s × headroom {} → {} instances × {} GPU = {} GPUs",
            s.target_qps, s.headroom, s.instances, s.gpus_per_instance, s.gpus
        );
        if let Some(cost) = s.cost {
            let _ = writeln!(
                out,
                "Cost: ${:.4} per million output tokens at capacity; fleet ${:.2}/h = ${:.4} per million at the target",
                cost.usd_per_million_output_tokens_at_capacity,
                cost.fleet_usd_per_hour,
                cost.usd_per_million_output_tokens_at_target
            );
        }
    }
    for note in &plan.notes {
        let _ = writeln!(out, "Note: {note}");
    }
    out
}
