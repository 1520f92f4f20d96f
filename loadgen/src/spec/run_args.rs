//! The options of one run (`loadgen run`, and each run of `sweep`, `compare` and `probe`):
//! the clap types and the parsing of values that clap cannot check alone.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;

use crate::load::plan::ClassBy;
use crate::load::schedule::TraceScaling;
use crate::load::shard::Shard;
use crate::load::workload::agentic::{self, AgenticOptions};
use crate::load::workload::sessions::{SessionSpec, ThinkTime, TurnCount};
use crate::load::workload::traces::TraceFormat;
use crate::spec::bound::BoundOptions;
use crate::spec::run::{
    ArrivalKind, Lengths, LoadSpec, OpenLoad, RunSpec, SessionsSpec, TargetSpec, WindowSpec,
    WorkloadKind, WorkloadSpec,
};
use crate::units::duration_arg;
use crate::wire::backend::Backend;
use crate::wire::extra_body::ExtraBody;
use crate::wire::tls::TlsOptions;
use crate::wire::tls::TlsSettings;
use reports::slo::SloSpec;

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
    /// Split the requests among models or LoRA adapters, `NAME=WEIGHT,…` (weights relative,
    /// drawn from the seed; a session keeps one): each request asks for its model, and the
    /// results are split by it. --model still names the run's model in meta.json.
    #[arg(long, value_name = "NAME=W,…")]
    pub model_mix: Option<String>,
    /// What the results are split into classes by: `auto` (a trace's model or service
    /// column, else --model-mix's models, else a session turn's kind), `trace`, `model`,
    /// `turn` (first, follow-up; agent turns: first, tool-result, final), `prefix-group`,
    /// `none`.
    #[arg(long, value_parser = ["auto", "trace", "model", "turn", "prefix-group", "none"], default_value = "auto")]
    pub class_by: String,
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
    #[arg(long, value_parser = workload_arg(), default_value = "sharegpt-like")]
    pub workload: WorkloadKind,
    /// ShareGPT-like profile: chat, code, summarization, long-context.
    #[arg(long, default_value = "chat")]
    pub profile: String,
    /// ShareGPT-like: lower the profile's upper clip on prompt lengths (tokens); agentic: on
    /// tasks and tool results.
    #[arg(long)]
    pub max_input_len: Option<u32>,
    /// ShareGPT-like and agentic: lower the profile's upper clip on output lengths (tokens).
    #[arg(long)]
    pub max_output_len: Option<u32>,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u32,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u32,
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Shared prefix tokens per group (synthetic workloads), added to the drawn input length.
    /// With --workload agentic: every agent's system prompt length (else drawn).
    #[arg(long, default_value_t = 0)]
    pub prefix_len: u32,
    /// Prefix groups; with --workload agentic, the agents in the pool (each its own system
    /// prompt and tools).
    #[arg(long, default_value_t = 1)]
    pub prefix_groups: u64,
    /// Trace file (project JSONL, Mooncake JSONL, Azure CSV, BurstGPT CSV, ShareGPT JSON /
    /// length table, Bailian JSONL, TraceLab JSONL[.gz], a WEKA session file or folder).
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
    #[arg(long, value_parser = arrival_arg())]
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
    /// Multi-turn sessions (chat or responses backend): turns per session, geometric with mean N,
    /// `constant:N`, or `all` (a ShareGPT file's own turns). `--rate` then counts new
    /// sessions per second; each later turn re-sends the whole history.
    #[arg(long, value_name = "N|constant:N|all")]
    pub turns: Option<String>,
    /// With --turns: the user's think time between an answer and the next turn,
    /// exponential with mean D, or `constant:D`.
    #[arg(long, value_name = "D|constant:D")]
    pub think_time: Option<String>,
    /// With --turns: a session drawn longer ends, capped, after this many turns. With
    /// --workload agentic: a session still calling tools after this many turns ends, capped
    /// (default in traces/agentic.json: 10).
    #[arg(long)]
    pub max_session_turns: Option<u32>,
    /// With --workload agentic: how long the client's tools take to answer a turn's calls
    /// (a turn's calls run together), exponential with mean D, or `constant:D`.
    #[arg(long, value_name = "D|constant:D")]
    pub tool_latency: Option<String>,
    /// With --workload agentic: `auto` lets the model choose; `required` makes the first turn
    /// of each session call a tool (later turns are `auto`).
    #[arg(long, value_parser = ["auto", "required"])]
    pub tool_choice: Option<String>,
    /// With --turns or --workload agentic: a session ends, capped, when its next prompt (history and the next
    /// user turn) would pass this many tokens.
    #[arg(long)]
    pub max_history_tokens: Option<u64>,
    /// With sessions and --duration: how long sessions may go on after the schedule's end
    /// (warm-up + duration + cool-down) before the rest are cut; default 60s.
    #[arg(long, value_parser = duration_arg)]
    pub session_drain: Option<Duration>,
    #[command(flatten)]
    pub bound: BoundArgs,
    /// Calibrate against the built-in mock at this run's rate first; recorded in meta.json.
    #[arg(long)]
    pub calibrate: bool,
    #[arg(long)]
    pub no_progress: bool,
}

impl RunArgs {
    /// The flag that makes this run one of sessions (`--turns`, `--workload agentic`), if
    /// any: the commands that cannot run sessions name it.
    pub fn sessions_flag(&self) -> Option<&'static str> {
        if self.workload == WorkloadKind::Agentic {
            Some("--workload agentic")
        } else {
            self.turns.as_ref().map(|_| "--turns")
        }
    }
}

impl RunSpec {
    /// The spec of `args`, every option checked that can be before the run is prepared (the
    /// TLS certificate and an `--extra-body @FILE` are read here; a trace's rows and
    /// timestamps are checked when the run is prepared, the server when it is sent).
    pub fn from_args(args: &RunArgs) -> Result<RunSpec> {
        let sessions = sessions(args)?;
        if args.exact_rate {
            if args.concurrency.is_some() {
                bail!(
                    "--exact-rate scales an open-loop schedule: --concurrency (closed loop) has none"
                );
            }
            if let Some(flag) = args.sessions_flag() {
                bail!("--exact-rate with {flag}: a session's later turns follow its answers, so no factor fixes their rate; give --rate alone");
            }
        }
        if sessions.is_some() {
            if args.length_scale != 1.0 || args.max_model_len.is_some() {
                bail!("--length-scale and --max-model-len reshape single requests; a session's prompt grows with its history: shape sessions with --max-history-tokens");
            }
            let what = if args.workload == WorkloadKind::Agentic {
                "--workload agentic"
            } else {
                "--turns"
            };
            if !args.backend.takes_conversations() {
                bail!("{what} needs --backend chat or responses: a session re-sends its history as messages, which the {} API has no place for", args.backend.name());
            }
            if args.concurrency.is_some() {
                bail!("{what} with --concurrency: sessions arrive open-loop at --rate sessions/s; a closed loop of sessions is not supported");
            }
            if args.arrival == Some(ArrivalKind::Trace) {
                bail!("{what}: sessions arrive on --arrival poisson, gamma or constant at --rate sessions/s");
            }
        }
        let lengths = match args.workload {
            WorkloadKind::SharegptLike => Lengths::SharegptLike {
                profile: args.profile.clone(),
                max_input_len: args.max_input_len,
                max_output_len: args.max_output_len,
            },
            WorkloadKind::Random => Lengths::Random {
                input_len: args.random_input_len,
                output_len: args.random_output_len,
                range_ratio: args.random_range_ratio,
            },
            WorkloadKind::Trace => match &args.trace {
                Some(path) => Lengths::Trace {
                    path: path.clone(),
                    format: args.trace_format,
                },
                None => bail!("--workload trace needs --trace PATH"),
            },
            WorkloadKind::Agentic => {
                if args.min_tokens {
                    bail!("--min-tokens with --workload agentic: an agent's answer ends where the model ends it (a tool call, or its final answer)");
                }
                Lengths::Agentic {
                    options: AgenticOptions {
                        agents: args.prefix_groups,
                        system_len: (args.prefix_len > 0).then_some(args.prefix_len),
                        max_input_len: args.max_input_len,
                        max_output_len: args.max_output_len,
                    },
                    require_first_call: args.tool_choice.as_deref() == Some("required"),
                }
            }
        };
        if args.workload != WorkloadKind::SharegptLike && args.workload != WorkloadKind::Agentic {
            for (flag, given) in [
                ("--max-input-len", args.max_input_len.is_some()),
                ("--max-output-len", args.max_output_len.is_some()),
            ] {
                if given {
                    bail!("{flag} lowers the clip of --workload sharegpt-like or agentic; {} has none", args.workload.name());
                }
            }
        }
        if let (Some(s), Lengths::Trace { .. }) = (&sessions, &lengths) {
            if s.spec.turns != TurnCount::All {
                bail!("--workload trace with sessions: give --turns all to replay a ShareGPT file's conversations with all their turns");
            }
        }
        if let (Some(s), false) = (&sessions, matches!(lengths, Lengths::Trace { .. })) {
            if s.spec.turns == TurnCount::All {
                bail!("--turns all replays a ShareGPT file (--workload trace --trace FILE.json); a synthetic workload takes --turns N or constant:N");
            }
        }
        // Each API also refuses such a body per request (a `Target` built without these
        // options); here a command-line run fails before it sends anything.
        if args.backend == Backend::Responses {
            for (flag, given, why) in [
                ("--min-tokens", args.min_tokens, "the Responses API has no `min_tokens` (vLLM's Responses request takes `ignore_eos` only)"),
                ("--no-continuous-usage", args.no_continuous_usage, "the Responses API reports usage once, at the end: there is no continuous usage to turn off"),
            ] {
                if given {
                    bail!("{flag} with --backend responses: {why}");
                }
            }
        }
        if args.prompt_ids && args.backend != Backend::Completions {
            bail!(
                "--prompt-ids needs --backend completions: only a completions prompt may be token ids"
            );
        }
        let load = match args.concurrency {
            Some(concurrency) => LoadSpec::Closed { concurrency },
            None => LoadSpec::Open(OpenLoad {
                rate: args.rate,
                arrival: args.arrival,
                burstiness: args.burstiness,
                ramp_up: args.ramp_up,
                ramp_start_rate: args.ramp_start_rate,
                exact_rate: args.exact_rate,
                trace: TraceScaling {
                    window: args.trace_window.as_deref().map(parse_window).transpose()?,
                    time_scale: args.time_scale,
                    target_rate: args.target_rate,
                },
            }),
        };
        if let Some(shard) = args.shard {
            if args.concurrency.is_some() {
                bail!("--shard splits an open-loop schedule; a closed loop (--concurrency) has none: give each worker its own --concurrency instead");
            }
            if args.start_at.is_none() {
                bail!("--shard {shard}: every worker needs the same --start-at (RFC 3339 or Unix seconds)");
            }
            if args.max_concurrency.is_some() {
                bail!("--shard with --max-concurrency: each worker would cap its own requests in flight, so K workers would allow K times the cap; leave the cap out");
            }
            if args.calibrate {
                bail!("--shard: calibrate each worker with `loadgen calibrate` before the run, not with --calibrate");
            }
        }
        let model_mix = args
            .model_mix
            .as_deref()
            .map(parse_model_mix)
            .transpose()?
            .unwrap_or_default();
        if !model_mix.is_empty() && args.backend == Backend::Tgi {
            bail!("--model-mix with --backend tgi: TGI's generate_stream names no model");
        }
        let class_by = match args.class_by.as_str() {
            "trace" => Some(ClassBy::Trace),
            "model" => Some(ClassBy::Model),
            "turn" => Some(ClassBy::Turn),
            "prefix-group" => Some(ClassBy::PrefixGroup),
            "none" => Some(ClassBy::None),
            _ => None,
        };
        if class_by == Some(ClassBy::Model) && model_mix.is_empty() {
            bail!("--class-by model splits by --model-mix's models: give --model-mix");
        }
        if class_by == Some(ClassBy::Turn) && sessions.is_none() {
            bail!("--class-by turn splits session turns: give --turns or --workload agentic (a trace's sessions are classed by its own column)");
        }
        Ok(RunSpec {
            model_mix,
            class_by,
            target: TargetSpec {
                url: args.url.clone(),
                backend: args.backend,
                model: args.model.clone(),
                headers: parse_headers(&args.headers)?,
                api_key: args.api_key.clone(),
                tls: TlsSettings::new(&args.tls.options())?,
                extra_body: extra_body(args)?,
                prompt_ids: args.prompt_ids,
                // An agent's answers end where the model ends them: at a tool call, or its
                // final answer.
                ignore_eos: !args.no_ignore_eos && args.workload != WorkloadKind::Agentic,
                min_tokens: args.min_tokens,
                continuous_usage: !args.no_continuous_usage,
                timeout: args.timeout,
            },
            workload: WorkloadSpec {
                lengths,
                prefix_len: args.prefix_len,
                prefix_groups: args.prefix_groups,
                tokenizer: args.tokenizer.clone(),
                length_scale: args.length_scale,
                max_model_len: args.max_model_len,
                prompt_salt: args.prompt_salt,
            },
            load,
            window: WindowSpec {
                warmup: args.warmup,
                duration: args.duration,
                num_prompts: args.num_prompts,
                cooldown: args.cooldown,
                max_concurrency: args.max_concurrency,
            },
            sessions,
            seed: args.seed,
            out: args.out.clone(),
            slo: slo_spec(args)?,
            slo_text: args.slo.clone(),
            fail_on_slo: args.fail_on_slo,
            slice: args.slice,
            scrape_interval: args.scrape_interval,
            shard: args.shard,
            start_at: args.start_at,
            bound: args.bound.options(),
            calibrate: args.calibrate,
            progress: !args.no_progress,
        })
    }
}

/// The session options of `args`; the options that only sessions take are refused without
/// `--turns`, never ignored.
fn sessions(args: &RunArgs) -> Result<Option<SessionsSpec>> {
    if args.sessions_flag().is_some() {
        if args.session_drain.is_some() && args.duration.is_none() {
            bail!("--session-drain limits sessions after --duration; without --duration every session runs to its end");
        }
        if args.max_session_turns == Some(0) {
            bail!("--max-session-turns must be at least 1");
        }
    }
    if args.workload == WorkloadKind::Agentic {
        for (flag, given) in [
            ("--turns", args.turns.is_some()),
            ("--think-time", args.think_time.is_some()),
        ] {
            if given {
                bail!("{flag} shapes chat sessions; an agentic session runs while the server calls tools (up to --max-session-turns), each turn --tool-latency after the answer before it");
            }
        }
        let latency = match args.tool_latency.as_deref() {
            Some(t) => ThinkTime::parse_flag(t, "--tool-latency")?,
            None => ThinkTime::Exponential {
                mean_s: DEFAULT_TOOL_LATENCY_S,
            },
        };
        return Ok(Some(SessionsSpec {
            spec: SessionSpec {
                turns: TurnCount::Constant {
                    turns: match args.max_session_turns {
                        Some(turns) => turns,
                        None => agentic::default_max_turns()?,
                    },
                },
                think: latency,
                max_turns: None,
            },
            max_history_tokens: args.max_history_tokens,
            drain: args.session_drain,
        }));
    }
    for (flag, given) in [
        ("--tool-latency", args.tool_latency.is_some()),
        ("--tool-choice", args.tool_choice.is_some()),
    ] {
        if given {
            bail!("{flag} shapes agent sessions: give --workload agentic");
        }
    }
    let Some(turns) = args.turns.as_deref() else {
        let stray = [
            ("--think-time", args.think_time.is_some()),
            ("--max-session-turns", args.max_session_turns.is_some()),
            ("--max-history-tokens", args.max_history_tokens.is_some()),
            ("--session-drain", args.session_drain.is_some()),
        ];
        if let Some((flag, _)) = stray.iter().find(|(_, given)| *given) {
            bail!("{flag} shapes multi-turn sessions: give --turns too");
        }
        return Ok(None);
    };
    let think = match args.think_time.as_deref() {
        Some(t) => ThinkTime::parse(t)?,
        None => ThinkTime::Constant { secs: 0.0 },
    };
    Ok(Some(SessionsSpec {
        spec: SessionSpec {
            turns: TurnCount::parse(turns)?,
            think,
            max_turns: args.max_session_turns,
        },
        max_history_tokens: args.max_history_tokens,
        drain: args.session_drain,
    }))
}

/// `--model-mix NAME=W,…`: names with positive weights.
fn parse_model_mix(text: &str) -> Result<Vec<(String, f64)>> {
    let mix = text
        .split(',')
        .map(|part| {
            let (name, weight) = part.split_once('=').with_context(|| {
                format!("--model-mix `{part}`: expected NAME=WEIGHT (e.g. base=0.7,lora-a=0.3)")
            })?;
            let weight: f64 = weight
                .trim()
                .parse()
                .with_context(|| format!("--model-mix `{part}`: the weight is not a number"))?;
            if !(weight > 0.0 && weight.is_finite()) {
                bail!("--model-mix `{part}`: a weight is positive");
            }
            let name = name.trim();
            if name.is_empty() {
                bail!("--model-mix `{part}`: a model needs its name");
            }
            Ok((name.to_string(), weight))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut names: Vec<&str> = mix.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        bail!("--model-mix names `{}` twice", w[0]);
    }
    Ok(mix)
}

/// `--extra-body`, parsed for the backend; an agent's own fields are refused in it.
fn extra_body(args: &RunArgs) -> Result<Option<ExtraBody>> {
    let Some(extra) = args
        .extra_body
        .as_deref()
        .map(|arg| ExtraBody::parse(arg, args.backend))
        .transpose()?
    else {
        return Ok(None);
    };
    if args.workload == WorkloadKind::Agentic {
        if let Some(key) = extra.first_of(crate::wire::extra_body::AGENTIC_REFUSED) {
            bail!("--extra-body: field `{key}` is refused with --workload agentic: each turn offers its agent's tools (--tool-choice sets the first turn's choice)");
        }
    }
    Ok(Some(extra))
}

/// `--tool-latency` unless given: exponential with this mean, seconds.
const DEFAULT_TOOL_LATENCY_S: f64 = 0.5;

/// The `--slo` of `args` with its `--max-error-rate`.
fn slo_spec(args: &RunArgs) -> Result<Option<SloSpec>> {
    if args.fail_on_slo && args.slo.is_none() {
        bail!("--fail-on-slo needs --slo (e.g. --slo ttft:p90:2s,tpot:p90:100ms)");
    }
    Ok(args
        .slo
        .as_deref()
        .map(SloSpec::parse)
        .transpose()?
        .map(|spec| SloSpec {
            max_error_rate: args.max_error_rate,
            ..spec
        }))
}

/// The roofline's flags (`spec::bound` resolves them).
#[derive(Args, Debug, Clone, Default)]
pub struct BoundArgs {
    /// For the roofline: the model's Hugging Face config.json (layer shapes → parameters,
    /// weight bytes a decode step reads, KV bytes per token, attention FLOPs per token of
    /// context).
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// With --model-config: the weights' dtype as served (bf16, f16, fp8, int8, int4, fp4)
    /// [default: bf16].
    #[arg(long, requires = "model_config")]
    pub weight_dtype: Option<String>,
    /// With --model-config: the KV cache's dtype [default: bf16].
    #[arg(long, requires = "model_config")]
    pub kv_dtype: Option<String>,
    /// For the roofline's memory side: the bytes one decode step reads for the weights.
    #[arg(long)]
    pub weight_bytes: Option<f64>,
    /// For the roofline's memory side: the KV-cache bytes of one token.
    #[arg(long)]
    pub kv_bytes_per_token: Option<f64>,
    /// For the roofline: the server's accelerator from the built-in table (h100-sxm,
    /// h100-pcie, h200, a100-40gb, a100-80gb, l40s, l4): its bandwidth and dense BF16 FLOP/s.
    #[arg(long)]
    pub hardware: Option<String>,
    /// For the roofline's memory side: the memory bandwidth in bytes/s (e.g. 3.35e12).
    #[arg(long)]
    pub bandwidth: Option<f64>,
    /// For the roofline's compute side and the prefill floor: dense FLOP/s (e.g. 989e12).
    #[arg(long)]
    pub flops: Option<f64>,
}

impl BoundArgs {
    pub fn options(&self) -> BoundOptions {
        BoundOptions {
            model_config: self.model_config.clone(),
            weight_dtype: self.weight_dtype.clone(),
            kv_dtype: self.kv_dtype.clone(),
            weight_bytes: self.weight_bytes,
            kv_bytes_per_token: self.kv_bytes_per_token,
            hardware: self.hardware.clone(),
            bandwidth: self.bandwidth,
            flops: self.flops,
        }
    }
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

/// A value parser for one of the enums the run's spec and the layers below it hold, by its
/// names and their help: those modules keep no command-line types of their own.
fn named<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> Option<&'static str>,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(all.iter().map(|&v| {
        let value = PossibleValue::new(name(v));
        match help(v) {
            Some(text) => value.help(text),
            None => value,
        }
    }))
    .map(move |text| {
        *all.iter()
            .find(|&&v| name(v) == text)
            .expect("clap took one of the names")
    })
}

fn backend_arg() -> impl TypedValueParser<Value = Backend> {
    named(&Backend::ALL, Backend::name, |b| Some(b.help()))
}

fn trace_format_arg() -> impl TypedValueParser<Value = TraceFormat> {
    named(&TraceFormat::ALL, TraceFormat::name, |_| None)
}

fn workload_arg() -> impl TypedValueParser<Value = WorkloadKind> {
    named(&WorkloadKind::ALL, WorkloadKind::name, |w| Some(w.help()))
}

fn arrival_arg() -> impl TypedValueParser<Value = ArrivalKind> {
    named(&ArrivalKind::ALL, ArrivalKind::name, ArrivalKind::help)
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
