//! The options of one run (`loadgen run`, and each run of `sweep`, `compare` and `probe`):
//! the clap types and the parsing of values that clap cannot check alone.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};

use crate::load::shard::Shard;
use crate::load::workload::traces::TraceFormat;
use crate::units::duration_arg;
use crate::wire::backend::Backend;
use crate::wire::tls::TlsOptions;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// Seeded log-normal lengths (`--profile`), parameters in traces/sharegpt-like.json.
    SharegptLike,
    /// vLLM `random`: uniform lengths around --random-input-len / --random-output-len.
    Random,
    /// Lengths (and timestamps) from `--trace`.
    Trace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArrivalKind {
    Poisson,
    Gamma,
    Constant,
    /// The trace's own timestamps (after --trace-window, --time-scale / --target-rate).
    Trace,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Base URL of the server (without /v1).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    #[arg(long, value_parser = backend_arg(), default_value = "completions")]
    pub backend: Backend,
    /// Model name; default: the first of GET /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// Extra header `Name: value` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    #[arg(long)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// JSON object (or `@FILE` holding one) merged into every request body, e.g.
    /// '{"chat_template_kwargs": {"enable_thinking": false}}'; with --backend tgi, into
    /// `parameters`. Fields loadgen sets itself (stream, max_tokens, model, …) are refused.
    #[arg(long, value_name = "JSON|@FILE")]
    pub extra_body: Option<String>,
    #[arg(long, value_enum, default_value = "sharegpt-like")]
    pub workload: WorkloadKind,
    /// ShareGPT-like profile: chat, code, summarization, long-context.
    #[arg(long, default_value = "chat")]
    pub profile: String,
    /// ShareGPT-like: lower the profile's upper clip on prompt lengths (tokens).
    #[arg(long)]
    pub max_input_len: Option<u32>,
    /// ShareGPT-like: lower the profile's upper clip on output lengths (tokens).
    #[arg(long)]
    pub max_output_len: Option<u32>,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u32,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u32,
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Shared prefix tokens per group (synthetic workloads), added to the drawn input length.
    #[arg(long, default_value_t = 0)]
    pub prefix_len: u32,
    #[arg(long, default_value_t = 1)]
    pub prefix_groups: u64,
    /// Trace file (project JSONL, Mooncake JSONL, Azure CSV, BurstGPT CSV, ShareGPT JSON / length table).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace format; guessed from the file when omitted.
    #[arg(long, value_parser = trace_format_arg())]
    pub trace_format: Option<TraceFormat>,
    /// Replay the trace this many times faster (2 = twice as fast).
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Rescale trace times so the mean rate is this (req/s).
    #[arg(long)]
    pub target_rate: Option<f64>,
    /// Slice of the trace `START:END` in seconds from its first row.
    #[arg(long)]
    pub trace_window: Option<String>,
    /// Arrival process. Default: the trace's own timestamps when `--workload trace` has them
    /// (each row sent once), else Poisson at --rate.
    #[arg(long, value_enum)]
    pub arrival: Option<ArrivalKind>,
    /// Requests per second (open loop).
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// Scale the seeded draw by one factor so that its scheduled rate over the measured
    /// window is --rate (with --arrival trace, --target-rate) within 0.5%; meta.json records
    /// the factor. Without it the raw draw runs, whose window holds a rate off by about
    /// 1/√n for n requests. Every sweep level runs so.
    #[arg(long)]
    pub exact_rate: bool,
    /// Gamma shape (vLLM meaning: 1 = Poisson, < 1 burstier).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Closed loop at this many concurrent requests instead of a schedule.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Cap on requests in flight (open loop); queued requests record their wait.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Linear ramp of the rate from --ramp-start-rate to --rate over this time.
    #[arg(long, value_parser = duration_arg)]
    pub ramp_up: Option<Duration>,
    #[arg(long, default_value_t = 0.0)]
    pub ramp_start_rate: f64,
    /// Measured span (after warm-up). Without it, --num-prompts requests are sent.
    #[arg(long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Requests to send without --duration. Default: 1000, or each trace row once.
    #[arg(long)]
    pub num_prompts: Option<usize>,
    #[arg(long, value_parser = duration_arg, default_value = "0s")]
    pub warmup: Duration,
    #[arg(long, value_parser = duration_arg, default_value = "0s")]
    pub cooldown: Duration,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run folder for schedule.jsonl, records.jsonl, meta.json, summary.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// tokenizer.json of the target model, for prompts of exact token length.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Send prompts as token ids (completions backend).
    #[arg(long)]
    pub prompt_ids: bool,
    /// Do not send `ignore_eos: true`.
    #[arg(long)]
    pub no_ignore_eos: bool,
    /// Also send `min_tokens` equal to `max_tokens`.
    #[arg(long)]
    pub min_tokens: bool,
    /// Do not ask for `continuous_usage_stats`.
    #[arg(long)]
    pub no_continuous_usage: bool,
    #[arg(long, value_parser = duration_arg, default_value = "600s")]
    pub timeout: Duration,
    /// SLOs for goodput, e.g. `ttft:500ms,tpot:50ms`.
    #[arg(long)]
    pub slo: Option<String>,
    /// The slices of the run's timeline.json (default: 10s, or a thirtieth of the run when
    /// shorter).
    #[arg(long, value_parser = duration_arg)]
    pub slice: Option<Duration>,
    /// With --slo: the share of measured requests that may fail before the SLO is not met.
    #[arg(long, value_parser = crate::units::parse_fraction, default_value = "1%")]
    pub max_error_rate: f64,
    /// With --slo: exit 3 when the SLO is not met over the measured window, 5 when the
    /// sample is too small to bound its percentile (a sweep: when no level meets it).
    #[arg(long)]
    pub fail_on_slo: bool,
    /// Scrape the server's Prometheus /metrics this often during the run (running and
    /// waiting requests, KV-cache usage, preemptions, prefix-cache hits); 0s turns it off.
    #[arg(long, value_parser = duration_arg, default_value = "2s")]
    pub scrape_interval: Duration,
    /// Send only this worker's share of the schedule, `I/K`: the requests whose id ≡ I
    /// (mod K), each at --start-at + its scheduled offset. K workers with the same options
    /// and --start-at send the whole schedule once; `loadgen merge` joins their folders.
    #[arg(long, value_parser = Shard::parse)]
    pub shard: Option<Shard>,
    /// The schedule's start instant, t = 0 (RFC 3339 or Unix seconds, in the future). A
    /// worker not ready to send by then fails instead of sending late.
    #[arg(long, value_parser = crate::units::parse_instant)]
    pub start_at: Option<SystemTime>,
    /// Multiply every drawn request length (prompt, shared prefix and output) by this factor,
    /// rounded, at least 1 token: the same seeded workload, smaller or larger. Literal-text
    /// prompts (a ShareGPT file's) have no length to change and are refused.
    #[arg(long, default_value_t = 1.0)]
    pub length_scale: f64,
    /// Shorten each request whose prompt + output would pass this many tokens (the server's
    /// context): its prompt first, from the end, then its output. With --backend chat the
    /// server's chat template adds a few tokens more: leave room for them.
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Mixed into every synthetic prompt's words: the same lengths, prefix groups and
    /// schedule with other tokens, so that nothing a server cached from an earlier run
    /// matches (0: none). Literal-text prompts are sent as they are.
    #[arg(long, default_value_t = 0)]
    pub prompt_salt: u64,
    /// Multi-turn sessions (chat backend): turns per session, geometric with mean N,
    /// `constant:N`, or `all` (a ShareGPT file's own turns). `--rate` then counts new
    /// sessions per second; each later turn re-sends the whole history.
    #[arg(long, value_name = "N|constant:N|all")]
    pub turns: Option<String>,
    /// With --turns: the user's think time between an answer and the next turn,
    /// exponential with mean D, or `constant:D`.
    #[arg(long, value_name = "D|constant:D")]
    pub think_time: Option<String>,
    /// With --turns: a session drawn longer ends, capped, after this many turns.
    #[arg(long)]
    pub max_session_turns: Option<u32>,
    /// With --turns: a session ends, capped, when its next prompt (history and the next
    /// user turn) would pass this many tokens.
    #[arg(long)]
    pub max_history_tokens: Option<u64>,
    /// With --turns and --duration: how long sessions may go on after the schedule's end
    /// (warm-up + duration + cool-down) before the rest are cut; default 60s.
    #[arg(long, value_parser = duration_arg)]
    pub session_drain: Option<Duration>,
    #[command(flatten)]
    pub bound: crate::spec::bound::BoundArgs,
    /// Calibrate against the built-in mock at this run's rate first; recorded in meta.json.
    #[arg(long)]
    pub calibrate: bool,
    #[arg(long)]
    pub no_progress: bool,
}

/// How loadgen checks the servers it talks to over TLS.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsArgs {
    /// PEM file of a CA certificate (or several) to trust besides the webpki roots, for a
    /// server whose certificate a private CA signed (curl's --cacert).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Do not verify the server's certificate (curl's -k): for a self-signed test server.
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    pub fn options(&self) -> TlsOptions {
        TlsOptions {
            ca_cert: self.ca_cert.clone(),
            insecure: self.insecure,
        }
    }
}

/// `--backend`'s values (`wire::backend::Backend`), with their help: the wire keeps no
/// command-line types of its own.
fn backend_arg() -> impl TypedValueParser<Value = Backend> {
    PossibleValuesParser::new(Backend::ALL.map(|b| PossibleValue::new(b.name()).help(b.help())))
        .map(|name| {
            Backend::ALL
                .into_iter()
                .find(|b| b.name() == name)
                .expect("clap took one of the names")
        })
}

/// `--trace-format`'s values (`load::workload::traces::TraceFormat`).
fn trace_format_arg() -> impl TypedValueParser<Value = TraceFormat> {
    PossibleValuesParser::new(TraceFormat::ALL.map(TraceFormat::name)).map(|name| {
        TraceFormat::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .expect("clap took one of the names")
    })
}

/// `--trace-window START:END` in seconds.
pub fn parse_window(text: &str) -> Result<(f64, f64)> {
    let (a, b) = text
        .split_once(':')
        .with_context(|| format!("--trace-window `{text}`: expected START:END in seconds"))?;
    let start: f64 = a
        .trim()
        .parse()
        .with_context(|| format!("--trace-window start `{a}`"))?;
    let end: f64 = b
        .trim()
        .parse()
        .with_context(|| format!("--trace-window end `{b}`"))?;
    if end <= start {
        bail!("--trace-window: END must be after START");
    }
    Ok((start, end))
}

/// `--header Name: value` pairs.
pub fn parse_headers(raw: &[String]) -> Result<Vec<(String, String)>> {
    raw.iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .with_context(|| format!("--header `{h}`: expected `Name: value`"))
        })
        .collect()
}
