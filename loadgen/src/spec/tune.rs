//! The options of `loadgen tune`.

use std::time::Duration;

use clap::{Args, ValueEnum};
use reports::ab::DEFAULT_ALPHA;

use crate::spec::run_args::RunArgs;
use crate::spec::search::SearchArgs;
use crate::spec::sizing::SizingArgs;
use crate::units::{duration_arg, parse_fraction};

/// `--url`, `--rate` and `--concurrency` are the tune's to set: given, they are refused.
#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("url", |a| a
        .conflicts_with("server_cmd")
        .help("Set by each configuration's server: refused here")
        .long_help(None::<&str>)),
    mut_arg("rate", |a| a
        .conflicts_with("server_cmd")
        .help("Set by each level of the knee search: refused here")
        .long_help(None::<&str>)),
    mut_arg("target_rate", |a| a
        .conflicts_with("server_cmd")
        .help("Set by each level of the knee search with --arrival trace: refused here")
        .long_help(None::<&str>)),
    mut_arg("fail_on_slo", |a| a
        .conflicts_with("server_cmd")
        .help("tune always exits 3 when no configuration meets the SLO: refused here")
        .long_help(None::<&str>)),
    mut_arg("concurrency", |a| a
        .conflicts_with("server_cmd")
        .help("The knee search runs open-loop levels: refused here")
        .long_help(None::<&str>)),
    mut_arg("out", |a| a.help("The tune's folder: tune.json, one folder per configuration, the report"))
)]
pub struct TuneArgs {
    /// The server command, with `{port}` and one `{NAME}` per --knob, each value put in
    /// verbatim (e.g. "./target/release/engine serve --port {port} --max-num-seqs {seqs}").
    #[arg(long)]
    pub server_cmd: String,
    /// A knob and its values in order of cost, cheapest first: NAME=V1,V2,… (repeatable; a
    /// value may hold a whole flag, `prefix=--enable-prefix-caching,--no-enable-prefix-caching`).
    #[arg(long = "knob", required = true)]
    pub knobs: Vec<String>,
    /// one-at-a-time: each knob in turn over its values, the others at the best found so
    /// far; grid: every combination; guided: the knob the diagnosis names, one value at a
    /// time in its direction, kept only when the capacity improves beyond its interval.
    #[arg(long, value_enum, default_value = "one-at-a-time")]
    pub strategy: Strategy,
    /// What a knob controls, for `--strategy guided`: NAME=ROLE, ROLE one of concurrency,
    /// token-budget, kv-memory, max-context (repeatable). Without it a knob's role comes from
    /// the flag before its {NAME} in --server-cmd, by the server tables (engine, vLLM, SGLang,
    /// llama.cpp, TGI, the mock's --slots).
    #[arg(long = "knob-role")]
    pub knob_roles: Vec<String>,
    /// How long a started server may take to answer GET /health with 200.
    #[arg(long, value_parser = duration_arg, default_value = "300s")]
    pub server_timeout: Duration,
    /// The measured length of each closed-loop probe step of a knee search [default: 10s].
    #[arg(long, value_parser = duration_arg)]
    pub probe_duration: Option<Duration>,
    /// The largest probe concurrency of a knee search [default: 256].
    #[arg(long)]
    pub probe_max_concurrency: Option<usize>,
    /// As for `sweep`: each level holds at least this many measured requests (`auto`, the
    /// default: as many as the SLO's highest percentile needs).
    #[arg(long)]
    pub min_requests: Option<String>,
    #[command(flatten)]
    pub search: SearchArgs,
    /// Rounds per side of the comparison of the two best configurations.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// The smallest effect that matters in that comparison, as a share of the best
    /// configuration's median: `2%` or `0.02`.
    #[arg(long, value_parser = parse_fraction, default_value = "2%")]
    pub min_effect: f64,
    #[arg(long, default_value_t = DEFAULT_ALPHA)]
    pub alpha: f64,
    /// Run-to-run variation, measured: each configuration's search repeats the ends of its
    /// final bracket R − 1 more times (as `sweep --repeats`), so its capacity carries the
    /// between-run interval; the winner is "better" only when, beside the comparison of the
    /// two best, its runs' crossings exceed the runner-up's beyond their spread (Welch's
    /// t-test at --alpha).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
    /// The winner's capacity plan (none without --target-qps or --daily-requests).
    #[command(flatten)]
    pub sizing: SizingArgs,
    /// Every `loadgen run` option applies to each configuration's knee search (the workload,
    /// --model, --backend, --warmup, --duration, --seed, --slo, …) but --url, --rate and
    /// --concurrency; `--out` (required) is the tune's folder.
    #[command(flatten)]
    pub run: RunArgs,
}

/// How `tune` walks the knobs' values (`--strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Strategy {
    /// Each knob in turn over its values, the others at the best found so far.
    OneAtATime,
    /// Every combination of values.
    Grid,
    /// The knob the diagnosis of the failing bracket end names, one value at a time.
    Guided,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::OneAtATime => "one-at-a-time",
            Strategy::Grid => "grid",
            Strategy::Guided => "guided",
        }
    }
}
