//! The options of `loadgen matrix`: its own flags, and the run options given on its command
//! line, which every row starts from.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};

use crate::spec::matrix_toml::row_command;
use crate::spec::run_args::RunArgs;
use crate::units::duration_arg;

/// A matrix loadgen carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Six rows: A 256 in / 128 out at 1 stream; B 2,048 / 128, 1 stream; C 256 / 1,024,
    /// 1 stream; D 2,048 / 1,024 at 8 concurrent; E 4,096 / 256 at 16 concurrent over a
    /// warm shared prefix; F ShareGPT-like chat at 2 req/s.
    Methodology,
}

#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("url", |a| a.conflicts_with("server_cmd")),
    mut_arg("out", |a| a.help("The matrix's folder: matrix.json, one folder per row, the report")),
)]
pub struct MatrixArgs {
    /// The matrix file: `[[row]]` tables with `name`, `question`, `hypothesis`, the workload
    /// and load as `loadgen run` options by their long names (`random-input-len = 256`,
    /// `concurrency = 8`, `rate = 2`, or `rates = "search"` with the row's `slo`),
    /// `duration` or `num-prompts`, `prefix = "cold" | "warm"`, and `expect`, statements the
    /// run can refute: "ttft:p95 < 1s", "tpot:p50 < 1.5 * bound", "itl:p99 < 3 * bound",
    /// "regime = decode-memory-bound", "regime != queueing", "capacity > 2 req/s".
    #[arg(required_unless_present = "preset", conflicts_with = "preset")]
    pub file: Option<PathBuf>,
    /// Run a matrix loadgen carries instead of a file (with --write: write it out).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// With --preset: write its rows to this TOML file and exit, running nothing.
    #[arg(long, requires = "preset", value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Multiply every row's lengths (prompt, prefix, output) and durations (warm-up, measured
    /// span, cool-down, ramp, probe steps) by this: 0.1 runs a GPU matrix on a CPU. Lengths are
    /// also clipped to the server's context when its /v1/models (or /props) gives it.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The server command, with `{port}`: started once for the whole matrix, stopped after.
    #[arg(long)]
    pub server_cmd: Option<String>,
    /// How long the started server may take to answer GET /health with 200.
    #[arg(long, value_parser = duration_arg, default_value = "300s")]
    pub server_timeout: Duration,
    /// Price of one GPU-hour in USD: each row's cost per million output tokens at the
    /// output rate it sustained.
    #[arg(long)]
    pub gpu_hour_usd: Option<f64>,
    /// GPUs the server runs on, for the cost.
    #[arg(long, default_value_t = 1)]
    pub gpus_per_instance: u32,
    /// Exit 3 when a row's hypothesis is refuted (after every row ran and the report is
    /// written).
    #[arg(long)]
    pub fail_on_refuted: bool,
    /// Run every row R times, interleaved across rows (every row once, then every row again),
    /// each run with a fresh seed and prompt words, into `row-NN-NAME/repeat-K/` after the
    /// first. Each statement is then decided across the runs (a Student t-interval over their
    /// values, R − 1 degrees of freedom) as well as within each: confirmed or refuted only
    /// where both agree, so that a verdict is one the next run would repeat.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
    /// Every `loadgen run` option given here is each row's default (--model, --backend,
    /// --header, --api-key, TLS, --tokenizer, --seed, --slo, …); a row's own keys win.
    /// `--out` (required) is the matrix's folder.
    #[command(flatten)]
    pub run: RunArgs,
    /// The run options given on the command line, as words (filled by [`MatrixCommand`]).
    #[arg(skip)]
    pub defaults: Vec<String>,
}

/// [`MatrixArgs`] as parsed from a command line: the run options given there kept as words,
/// every row's defaults. Every way of parsing the command line fills them.
#[derive(Debug, Clone)]
pub struct MatrixCommand(pub MatrixArgs);

impl FromArgMatches for MatrixCommand {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = MatrixArgs::from_arg_matches(matches)?;
        args.defaults = given_run_options(matches);
        Ok(MatrixCommand(args))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)?;
        self.0.defaults = given_run_options(matches);
        Ok(())
    }
}

impl Args for MatrixCommand {
    fn augment_args(command: clap::Command) -> clap::Command {
        MatrixArgs::augment_args(command)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        MatrixArgs::augment_args_for_update(command)
    }
}

/// The words of the run options given on the matrix's own command line (`matches`), which
/// every row starts from; `--url` and `--out` are the matrix's and are left out.
fn given_run_options(matches: &ArgMatches) -> Vec<String> {
    let command = row_command::<RunArgs>();
    let mut words = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "url" | "out")
            || matches.value_source(id) != Some(clap::parser::ValueSource::CommandLine)
        {
            continue;
        }
        if !arg.get_action().takes_values() {
            words.push(format!("--{long}"));
            continue;
        }
        let Ok(Some(occurrences)) = matches.try_get_raw_occurrences(id) else {
            continue;
        };
        for values in occurrences {
            for value in values {
                words.push(format!("--{long}={}", value.to_string_lossy()));
            }
        }
    }
    words
}
