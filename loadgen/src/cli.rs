//! The command line: parses `loadgen <command>` and hands it to its module in `commands/`.

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::commands::{
    calibrate, compare, matrix, merge, mock_server, plan, report, run, sweep, tune,
};
use crate::spec::run_args::RunArgs;

#[derive(Parser, Debug)]
#[command(
    name = "loadgen",
    version,
    about = "Open-loop load generator for OpenAI-compatible LLM servers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Drive a server with a seeded workload and schedule; write records, meta and summary.
    Run(Box<RunArgs>),
    /// Serve the built-in OpenAI-compatible mock with known timing.
    MockServer(mock_server::MockArgs),
    /// Measure the client-added TTFT / ITL error against the built-in mock.
    Calibrate(calibrate::CalibrateArgs),
    /// Run the same seeded workload at a series of rates: a list, fractions of the probed
    /// saturation rate, or a knee search that brackets and bisects the SLO's crossing.
    Sweep(Box<crate::spec::sweep::SweepArgs>),
    /// Find the server configuration that serves the most under the SLO: a fresh server and
    /// a knee search per configuration of --knob values, the two best then compared.
    Tune(Box<crate::spec::tune::TuneArgs>),
    /// A benchmark as an experiment: the rows of a matrix file (or --preset methodology),
    /// each a workload with its question, hypothesis and refutable expectations, run one
    /// after another against one server; a verdict, regime and cost per row.
    Matrix(Box<crate::spec::matrix::MatrixCommand>),
    /// Capacity plan of a sweep under an SLO: max sustainable QPS, instances, GPUs, cost.
    Plan(plan::PlanArgs),
    /// A/B verdict per latency metric: online (--a/--b URLs or --a-cmd/--b-cmd servers, in
    /// alternating rounds) or offline from saved runs.
    Compare(Box<crate::spec::compare::CompareArgs>),
    /// Render a run, sweep, comparison, tune or matrix folder to report.md and report.html.
    Report(report::ReportArgs),
    /// Join the folders of the K shards of one schedule (--shard I/K) into one folder.
    Merge(merge::MergeArgs),
}

/// Runs the parsed command line.
pub async fn main(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(args) => run::run_command(*args).await,
        Command::MockServer(args) => mock_server::mock_command(args).await,
        Command::Calibrate(args) => calibrate::calibrate_command(args).await,
        Command::Sweep(args) => sweep::sweep_command(*args).await,
        Command::Tune(args) => tune::tune_command(*args).await,
        Command::Matrix(args) => matrix::matrix_command(args.0).await,
        Command::Plan(args) => plan::plan_command(args),
        Command::Compare(args) => compare::compare_command(*args).await,
        Command::Report(args) => report::report_command(args),
        Command::Merge(args) => merge::merge_command(args),
    }
}
