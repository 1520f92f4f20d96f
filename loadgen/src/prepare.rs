//! Run preparation, shared by `run`, `sweep` and `compare`: the `loadgen run` options, the
//! request plan they describe (workload, schedule, warm-up), and one execution of that plan
//! against a server with its `meta.json`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use reports::records::{RunMeta, ShardInfo, SCHEMA_VERSION};
use reports::slo::SloSpec;
use serde_json::json;

use crate::backend::Backend;
use crate::calibrate::{calibrate, CalibrateConfig};
use crate::client;
use crate::extra_body::ExtraBody;
use crate::host::host_info;
use crate::run::{self, LoadMode, Plan, PlannedRequest, PlannedTurn, RunOptions, SessionLimits};
use crate::schedule::{scale_trace, Arrival, Extent, RampUp, ScheduleSpec, TraceScaling};
use crate::scrape::{ScrapeTarget, Scraper};
use crate::shard::Shard;
use crate::target::Target;
use crate::tls::{TlsArgs, TlsSettings};
use crate::units::duration_arg;
use crate::workload::prompt::PromptBuilder;
use crate::workload::sessions::{SessionSpec, ThinkTime, TurnCount};
use crate::workload::synthetic::{LengthModel, PrefixGroups, SyntheticWorkload};
use crate::workload::traces::{self, TraceFormat, TraceRow, MOONCAKE_BLOCK};
use crate::workload::{hash_id_blocks, mix, prefixed_blocks, PromptSource, RequestSpec};

/// Requests a run sends without --duration or a trace to size it.
pub const DEFAULT_NUM_PROMPTS: usize = 1000;

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
    #[arg(long, value_enum, default_value = "completions")]
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
    #[arg(long, value_enum)]
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
    #[arg(long, value_parser = crate::clock::parse_instant)]
    pub start_at: Option<SystemTime>,
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
    /// Calibrate against the built-in mock at this run's rate first; recorded in meta.json.
    #[arg(long)]
    pub calibrate: bool,
    #[arg(long)]
    pub no_progress: bool,
}

fn parse_window(text: &str) -> Result<(f64, f64)> {
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

fn row_spec(seed: u64, index: u64, row: &TraceRow) -> RequestSpec {
    let prompt = match (&row.prompt, row.hash_ids.is_empty()) {
        (Some(text), _) => PromptSource::Text(text.clone()),
        (None, false) => PromptSource::Blocks(hash_id_blocks(
            seed,
            &row.hash_ids,
            row.input_len,
            MOONCAKE_BLOCK,
        )),
        (None, true) => {
            PromptSource::Blocks(prefixed_blocks(seed, index, row.input_len, row.prefix))
        }
    };
    RequestSpec {
        input_len: row.input_len,
        output_len: row.output_len,
        prefix_group: row.prefix.map(|(g, _)| g),
        prompt,
    }
}

/// The session options of `args`; the options that only sessions take are refused without
/// `--turns`, never ignored.
fn session_spec(args: &RunArgs) -> Result<Option<SessionSpec>> {
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
    if args.max_session_turns == Some(0) {
        bail!("--max-session-turns must be at least 1");
    }
    if args.session_drain.is_some() && args.duration.is_none() {
        bail!("--session-drain limits sessions after --duration; without --duration every session runs to its end");
    }
    Ok(Some(SessionSpec {
        turns: TurnCount::parse(turns)?,
        think,
        max_turns: args.max_session_turns,
    }))
}

/// Builds the plan (request list + schedule) for `args`; also returns workload / schedule
/// descriptions for `meta.json`.
pub fn build_plan(
    args: &RunArgs,
    prompts: &PromptBuilder,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    if let Some(spec) = session_spec(args)? {
        return build_session_plan(args, prompts, spec);
    }
    let warmup = args.warmup.as_secs_f64();
    let duration = args.duration.map(|d| d.as_secs_f64());
    let cooldown = args.cooldown.as_secs_f64();
    let schedule_seed = mix(args.seed, 0x5C4E_D01E);
    let mut workload_meta = json!({"kind": format!("{:?}", args.workload), "seed": args.seed});

    // Trace rows (lengths, maybe timestamps) when the workload is a trace.
    let trace_rows = if args.workload == WorkloadKind::Trace {
        let path = args
            .trace
            .as_ref()
            .context("--workload trace needs --trace PATH")?;
        let format = match args.trace_format {
            Some(f) => f,
            None => traces::detect_format(path)?,
        };
        let count = |t: &str| prompts.count_tokens(t);
        let rows = traces::load(path, format, &count)?;
        let usable: Vec<TraceRow> = rows
            .iter()
            .filter(|r| r.input_len > 0 && r.output_len > 0)
            .cloned()
            .collect();
        workload_meta["trace"] = json!({"path": path, "format": format, "rows": rows.len(),
            "skipped_zero_length_rows": rows.len() - usable.len()});
        if usable.is_empty() {
            bail!(
                "{}: no row with positive input and output lengths",
                path.display()
            );
        }
        Some(usable)
    } else {
        None
    };

    // A timestamped trace replays its timestamps unless another arrival process is asked for.
    let timestamped = trace_rows
        .as_ref()
        .is_some_and(|rows| rows.iter().all(|r| r.timestamp_ms.is_some()));
    let arrival = match args.arrival {
        Some(a) => a,
        None if timestamped && args.concurrency.is_none() => {
            eprintln!(
                "loadgen: replaying the trace's timestamps, each row once (--arrival poisson \
                 --rate R for a Poisson schedule instead)"
            );
            ArrivalKind::Trace
        }
        None => ArrivalKind::Poisson,
    };
    let num_prompts = args
        .num_prompts
        .unwrap_or(trace_rows.as_ref().map_or(DEFAULT_NUM_PROMPTS, Vec::len));
    // Send times (open loop) and the number of requests.
    let (times, schedule_meta): (Option<Vec<f64>>, serde_json::Value) =
        match (args.concurrency, arrival) {
            (Some(c), _) => (None, json!({"mode": "closed", "concurrency": c})),
            (None, ArrivalKind::Trace) => {
                let rows = trace_rows
                    .as_ref()
                    .context("--arrival trace needs --workload trace")?;
                let ts: Vec<f64> = rows
                    .iter()
                    .map(|r| r.timestamp_ms)
                    .collect::<Option<Vec<f64>>>()
                    .context("--arrival trace: this trace has no timestamps")?;
                let scaling = TraceScaling {
                    window: args.trace_window.as_deref().map(parse_window).transpose()?,
                    time_scale: args.time_scale,
                    target_rate: args.target_rate,
                };
                let (kept, times) = scale_trace(&ts, &scaling)?;
                let rows: Vec<TraceRow> = kept.iter().map(|&i| rows[i].clone()).collect();
                let meta = json!({"mode": "open", "arrival": "trace", "scaling": scaling,
                "bursts": "rows with equal timestamps are sent at the same instant"});
                let mut times = times;
                if let Some(d) = duration {
                    times.retain(|&t| t < warmup + d + cooldown);
                }
                let n = times.len();
                return finish_plan(
                    args,
                    Some(times),
                    Some(rows[..n].to_vec()),
                    n,
                    workload_meta,
                    meta,
                );
            }
            (None, arrival) => {
                let arrival = match arrival {
                    ArrivalKind::Poisson => Arrival::Poisson,
                    ArrivalKind::Gamma => Arrival::Gamma {
                        burstiness: args.burstiness,
                    },
                    ArrivalKind::Constant | ArrivalKind::Trace => Arrival::Constant,
                };
                let spec = ScheduleSpec {
                    arrival,
                    rate: args.rate,
                    ramp_up: args.ramp_up.map(|r| RampUp {
                        from_rate: args.ramp_start_rate,
                        secs: r.as_secs_f64(),
                    }),
                };
                let extent = match duration {
                    Some(d) => Extent::Until(warmup + d + cooldown),
                    None => Extent::Count(num_prompts),
                };
                let times = spec.generate(extent, schedule_seed)?;
                (
                    Some(times),
                    json!({"mode": "open", "schedule": spec, "schedule_seed": schedule_seed}),
                )
            }
        };
    let n = times.as_ref().map_or(num_prompts, Vec::len);
    finish_plan(args, times, trace_rows, n, workload_meta, schedule_meta)
}

fn finish_plan(
    args: &RunArgs,
    times: Option<Vec<f64>>,
    trace_rows: Option<Vec<TraceRow>>,
    n: usize,
    mut workload_meta: serde_json::Value,
    mut schedule_meta: serde_json::Value,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    if n == 0 {
        bail!("the schedule has no requests (rate too low for the duration?)");
    }
    let specs: Vec<RequestSpec> = match &trace_rows {
        Some(rows) => (0..n)
            .map(|i| row_spec(args.seed, i as u64, &rows[i % rows.len()]))
            .collect(),
        None => synthetic_specs(args, n, &mut workload_meta)?,
    };
    let requests = specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| PlannedRequest {
            id: i as u64,
            at_s: times.as_ref().map(|t| t[i]),
            session: None,
            spec,
        })
        .collect();
    let mode = match args.concurrency {
        Some(c) => LoadMode::Closed { concurrency: c },
        None => LoadMode::Open,
    };
    let plan = Plan {
        requests,
        mode,
        warmup_s: args.warmup.as_secs_f64(),
        duration_s: args.duration.map(|d| d.as_secs_f64()),
        cooldown_s: args.cooldown.as_secs_f64(),
        max_concurrency: args.max_concurrency,
        sessions: None,
    };
    schedule_meta["warmup_s"] = json!(plan.warmup_s);
    schedule_meta["duration_s"] = json!(plan.duration_s);
    schedule_meta["cooldown_s"] = json!(plan.cooldown_s);
    schedule_meta["max_concurrency"] = json!(plan.max_concurrency);
    Ok((plan, workload_meta, schedule_meta))
}

/// `n` requests of the synthetic workload `args` asks for; their length model in
/// `workload_meta`.
fn synthetic_specs(
    args: &RunArgs,
    n: usize,
    workload_meta: &mut serde_json::Value,
) -> Result<Vec<RequestSpec>> {
    let model = match args.workload {
        WorkloadKind::Random => LengthModel::Random {
            input_len: args.random_input_len,
            output_len: args.random_output_len,
            range_ratio: args.random_range_ratio,
        },
        _ => LengthModel::ShareGptLike {
            profile: args.profile.clone(),
            max_input_len: args.max_input_len,
            max_output_len: args.max_output_len,
        },
    };
    let prefix = (args.prefix_len > 0).then_some(PrefixGroups {
        len: args.prefix_len,
        groups: args.prefix_groups,
    });
    workload_meta["lengths"] = serde_json::to_value(&model)?;
    workload_meta["prefix"] = serde_json::to_value(prefix)?;
    SyntheticWorkload::new(model, prefix)?.generate(n, args.seed)
}

/// The plan of a session run (`--turns`): session start times on the arrival process at
/// `--rate` sessions/s, each session's turns (synthetic user turns and answer lengths, or a
/// ShareGPT file's conversations with `--turns all`) and think times, all from the seed.
fn build_session_plan(
    args: &RunArgs,
    prompts: &PromptBuilder,
    spec: SessionSpec,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    if args.backend != Backend::Chat {
        bail!("--turns needs --backend chat: a session re-sends its history as chat messages, which the {} API has no place for", args.backend.name());
    }
    if args.concurrency.is_some() {
        bail!("--turns with --concurrency: sessions arrive open-loop at --rate sessions/s; a closed loop of sessions is not supported");
    }
    let mut workload_meta = json!({"kind": format!("{:?}", args.workload), "seed": args.seed,
        "sessions": spec});
    let conversations = match (args.workload, spec.turns) {
        (WorkloadKind::Trace, TurnCount::All) => {
            let path = args
                .trace
                .as_ref()
                .context("--workload trace needs --trace PATH")?;
            let format = match args.trace_format {
                Some(f) => f,
                None => traces::detect_format(path)?,
            };
            if format != TraceFormat::Sharegpt {
                bail!("--turns all replays the turns of a ShareGPT conversation file; {} is {format:?}, which has none", path.display());
            }
            let count = |t: &str| prompts.count_tokens(t);
            let conversations = traces::load_sharegpt_conversations(path, &count)?;
            if conversations.is_empty() {
                bail!("{}: no conversation with a human turn and its answer", path.display());
            }
            workload_meta["trace"] = json!({"path": path, "format": format,
                "conversations": conversations.len()});
            Some(conversations)
        }
        (WorkloadKind::Trace, _) => bail!("--workload trace with sessions: give --turns all to replay a ShareGPT file's conversations with all their turns"),
        (_, TurnCount::All) => bail!("--turns all replays a ShareGPT file (--workload trace --trace FILE.json); a synthetic workload takes --turns N or constant:N"),
        _ => None,
    };
    let arrival = match args.arrival {
        None | Some(ArrivalKind::Poisson) => Arrival::Poisson,
        Some(ArrivalKind::Gamma) => Arrival::Gamma {
            burstiness: args.burstiness,
        },
        Some(ArrivalKind::Constant) => Arrival::Constant,
        Some(ArrivalKind::Trace) => bail!(
            "--turns: sessions arrive on --arrival poisson, gamma or constant at --rate sessions/s"
        ),
    };
    let schedule = ScheduleSpec {
        arrival,
        rate: args.rate,
        ramp_up: args.ramp_up.map(|r| RampUp {
            from_rate: args.ramp_start_rate,
            secs: r.as_secs_f64(),
        }),
    };
    let warmup = args.warmup.as_secs_f64();
    let extent = match args.duration {
        Some(d) => Extent::Until(warmup + d.as_secs_f64() + args.cooldown.as_secs_f64()),
        None => Extent::Count(
            args.num_prompts
                .unwrap_or(conversations.as_ref().map_or(DEFAULT_NUM_PROMPTS, Vec::len)),
        ),
    };
    let schedule_seed = mix(args.seed, 0x5C4E_D01E);
    let starts = schedule.generate(extent, schedule_seed)?;
    if starts.is_empty() {
        bail!("the schedule has no sessions (rate too low for the duration?)");
    }
    let recorded = |s: usize| {
        conversations
            .as_ref()
            .map_or(1, |c| c[s % c.len()].len() as u32)
    };
    let draws = spec.draw(starts.len(), mix(args.seed, SESSION_SEED_TAG), recorded)?;
    let total: usize = draws.iter().map(|d| d.think_s.len()).sum();
    let mut turn_specs = match &conversations {
        Some(c) => draws
            .iter()
            .enumerate()
            .flat_map(|(s, d)| {
                let rows = &c[s % c.len()];
                (0..d.think_s.len()).map(move |k| RequestSpec {
                    input_len: rows[k].input_len,
                    output_len: rows[k].output_len,
                    prefix_group: None,
                    prompt: PromptSource::Text(rows[k].prompt.clone().unwrap_or_default()),
                })
            })
            .collect::<Vec<_>>(),
        None => synthetic_specs(args, total, &mut workload_meta)?,
    }
    .into_iter();
    let mut requests = Vec::with_capacity(total);
    for (s, (draw, &start)) in draws.iter().zip(&starts).enumerate() {
        let turns = draw.think_s.len();
        for (k, &think_s) in draw.think_s.iter().enumerate() {
            let last = k + 1 == turns;
            requests.push(PlannedRequest {
                id: requests.len() as u64,
                at_s: (k == 0).then_some(start),
                spec: turn_specs.next().context("a turn without its request")?,
                session: Some(PlannedTurn {
                    session: s as u64,
                    turn: k as u32 + 1,
                    think_s,
                    last,
                    capped: last && draw.capped,
                }),
            });
        }
    }
    let plan = Plan {
        requests,
        mode: LoadMode::Open,
        warmup_s: warmup,
        duration_s: args.duration.map(|d| d.as_secs_f64()),
        cooldown_s: args.cooldown.as_secs_f64(),
        max_concurrency: args.max_concurrency,
        sessions: Some(SessionLimits {
            max_history_tokens: args.max_history_tokens,
            drain_s: Some(
                args.session_drain
                    .map_or(DEFAULT_SESSION_DRAIN_S, |d| d.as_secs_f64()),
            ),
        }),
    };
    let schedule_meta = json!({"mode": "open", "unit": "sessions", "schedule": schedule,
        "schedule_seed": schedule_seed, "sessions": starts.len(), "turns": total,
        "warmup_s": plan.warmup_s, "duration_s": plan.duration_s, "cooldown_s": plan.cooldown_s,
        "max_concurrency": plan.max_concurrency, "max_history_tokens": args.max_history_tokens,
        "session_drain_s": plan.sessions.and_then(|s| s.drain_s)});
    Ok((plan, workload_meta, schedule_meta))
}

/// `--session-drain` unless given, seconds.
const DEFAULT_SESSION_DRAIN_S: f64 = 60.0;

/// Seeds the session draws apart from the schedule's and the workload's.
const SESSION_SEED_TAG: u64 = 0x5E55_1015;

fn parse_headers(raw: &[String]) -> Result<Vec<(String, String)>> {
    raw.iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .with_context(|| format!("--header `{h}`: expected `Name: value`"))
        })
        .collect()
}

/// Everything a run decides before sending: prompts, SLOs, headers and the request plan.
/// Built once and executed any number of times (sweep probes, A/B rounds) with identical
/// requests and schedule.
pub struct PreparedRun {
    pub prompts: Arc<PromptBuilder>,
    pub slos: Vec<reports::metrics::Slo>,
    pub headers: Vec<(String, String)>,
    pub plan: Arc<Plan>,
    pub workload_meta: serde_json::Value,
    pub schedule_meta: serde_json::Value,
    /// Recorded in `meta.json` when the run calibrated against the mock first.
    pub calibration: Option<reports::records::Calibration>,
    /// Requests in the whole schedule (`plan` holds only a shard's with `--shard`).
    pub schedule_requests: u64,
    /// See [`reports::records::ShardInfo::schedule_digest`].
    pub schedule_digest: String,
    /// `--extra-body`, checked.
    pub extra_body: Option<ExtraBody>,
    /// `--ca-cert` / `--insecure`, read.
    pub tls: Option<TlsSettings>,
}

/// Builds the prompts, SLOs, headers and plan of `args` (no network).
pub fn prepare_run(args: &RunArgs) -> Result<PreparedRun> {
    let prompts = Arc::new(match &args.tokenizer {
        Some(p) => PromptBuilder::from_tokenizer(p)?,
        None => PromptBuilder::approximate(),
    });
    let slos = args
        .slo
        .as_deref()
        .map(SloSpec::parse)
        .transpose()?
        .map(|spec| spec.per_request())
        .unwrap_or_default();
    let headers = parse_headers(&args.headers)?;
    // Each API also refuses such a body per request (a `Target` built without these options);
    // here a command-line run fails before it sends anything.
    if args.prompt_ids && args.backend != Backend::Completions {
        bail!(
            "--prompt-ids needs --backend completions: only a completions prompt may be token ids"
        );
    }
    let extra_body = args
        .extra_body
        .as_deref()
        .map(|arg| ExtraBody::parse(arg, args.backend))
        .transpose()?;
    let tls = Some(TlsSettings::new(&args.tls)?);
    let (mut plan, workload_meta, schedule_meta) = build_plan(args, &prompts)?;
    let schedule_requests = plan.requests.len() as u64;
    let schedule_digest = schedule_digest(args, &plan, &prompts, extra_body.as_ref())?;
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
        shard.restrict(&mut plan)?;
    }
    Ok(PreparedRun {
        prompts,
        slos,
        headers,
        plan: Arc::new(plan),
        workload_meta,
        schedule_meta,
        calibration: None,
        schedule_requests,
        schedule_digest,
        extra_body,
        tls,
    })
}

/// The digest that tells the shards of one schedule apart from those of another: the whole
/// request list and every option that shapes a request on the wire (FNV-1a, 64 bits, hex).
fn schedule_digest(
    args: &RunArgs,
    plan: &Plan,
    prompts: &PromptBuilder,
    extra_body: Option<&ExtraBody>,
) -> Result<String> {
    let shape = json!({
        "requests": plan.requests,
        "phases": [plan.warmup_s, plan.duration_s, plan.cooldown_s],
        "backend": args.backend.name(),
        "prompt_ids": args.prompt_ids,
        "ignore_eos": !args.no_ignore_eos,
        "min_tokens": args.min_tokens,
        "continuous_usage": !args.no_continuous_usage,
        "timeout_s": args.timeout.as_secs_f64(),
        "slo": args.slo,
        "approximate_lengths": prompts.is_approximate(),
        "extra_body": extra_body.map(ExtraBody::to_value),
    });
    Ok(format!("{:016x}", fnv1a(&serde_json::to_vec(&shape)?)))
}

/// FNV-1a, 64 bits: a digest to tell things apart (not a secret's protection against guessing).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where one execution of a prepared run goes.
pub struct Execution {
    /// Base URL of the server (without /v1).
    pub url: String,
    /// Run folder (`meta.json` is written there too); `None` keeps everything in memory.
    pub out: Option<PathBuf>,
    /// Server version, when known (e.g. from its `/version`).
    pub server_version: Option<String>,
    /// Extra facts for `meta.json` (A/B side and round, server command line, …).
    pub extra: std::collections::BTreeMap<String, serde_json::Value>,
    pub progress: bool,
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Runs `prepared` against `exec.url` with the target options of `args` (backend, model,
/// headers, timeouts); writes `meta.json` beside the records when `exec.out` is set.
pub async fn execute_prepared(
    args: &RunArgs,
    prepared: &PreparedRun,
    exec: Execution,
) -> Result<run::RunOutcome> {
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            client::first_model(
                &crate::connections::http_client(1, prepared.tls.as_ref()),
                &exec.url,
                &prepared.headers,
                args.api_key.as_deref(),
            )
            .await?
        }
    };
    // Who is measured, in meta.json: asked once per execution unless the caller knows.
    let mut extra = exec.extra;
    let server_version = match exec.server_version {
        Some(v) => Some(v),
        None => {
            let identity = crate::server_proc::identify(
                &exec.url,
                &prepared.headers,
                args.api_key.as_deref(),
                prepared.tls.as_ref(),
            )
            .await;
            if let Some(info) = identity.info {
                extra.entry("server_info".into()).or_insert(info);
            }
            if let Some(hardware) = identity.hardware {
                extra
                    .entry("server_hardware".into())
                    .or_insert(serde_json::Value::String(hardware));
            }
            identity.version
        }
    };
    let target = Target {
        base_url: exec.url.clone(),
        backend: args.backend,
        model: model.clone(),
        headers: prepared.headers.clone(),
        api_key: args.api_key.clone(),
        timeout: args.timeout,
        ignore_eos: !args.no_ignore_eos,
        min_tokens: args.min_tokens,
        prompt_ids: args.prompt_ids,
        continuous_usage: !args.no_continuous_usage,
        extra_body: prepared.extra_body.clone(),
        tls: prepared.tls.clone(),
    };
    let mut meta = RunMeta {
        schema_version: SCHEMA_VERSION,
        loadgen_version: env!("CARGO_PKG_VERSION").to_string(),
        command_line: redacted_command_line(std::env::args()),
        seed: args.seed,
        workload: prepared.workload_meta.clone(),
        schedule: prepared.schedule_meta.clone(),
        url: exec.url.clone(),
        backend: args.backend.name().to_string(),
        model,
        server_version,
        host: host_info(),
        start_time: chrono::Utc::now().to_rfc3339(),
        approximate_lengths: prepared.prompts.is_approximate(),
        planned_requests: prepared.plan.requests.len() as u64,
        calibration: prepared.calibration.clone(),
        extra,
        complete: false,
        shard: args.shard.zip(args.start_at).map(|(shard, at)| ShardInfo {
            index: shard.index,
            count: shard.count,
            schedule_requests: prepared.schedule_requests,
            schedule_digest: prepared.schedule_digest.clone(),
            start_at: crate::clock::rfc3339(at),
            ready_before_start_ms: None,
            clock: crate::clock::clock_sync(),
        }),
        merged_from: Vec::new(),
        extra_body: prepared.extra_body.as_ref().map(ExtraBody::to_value),
    };
    // Written first as it stands, so that a run killed hard still says what it was.
    if let Some(dir) = &exec.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_meta(dir, &meta)?;
    }
    let scraper = match &exec.out {
        Some(dir) if !args.scrape_interval.is_zero() => Some(Scraper::start(ScrapeTarget {
            base_url: exec.url.clone(),
            headers: prepared.headers.clone(),
            api_key: args.api_key.clone(),
            interval: args.scrape_interval,
            out_dir: dir.clone(),
            start_at: args.start_at,
            tls: prepared.tls.clone(),
        })),
        _ => None,
    };
    let outcome = run::execute(
        prepared.plan.clone(),
        target,
        prepared.prompts.clone(),
        RunOptions {
            out_dir: exec.out.clone(),
            slos: prepared.slos.clone(),
            progress: exec.progress,
            stop: exec.stop,
            start_at: args.start_at,
        },
    )
    .await;
    if let Some(scraper) = scraper {
        scraper.finish().await;
    }
    let outcome = outcome?;
    if let Some(dir) = &exec.out {
        meta.start_time = outcome.start_time.to_rfc3339();
        meta.complete = true;
        if let Some(shard) = meta.shard.as_mut() {
            shard.ready_before_start_ms = outcome.ready_before_start_ms;
            shard.clock = crate::clock::clock_sync();
        }
        write_meta(dir, &meta)?;
        write_timeline(
            dir,
            &prepared.plan,
            &outcome.records,
            outcome.start_time,
            args.slice,
        )?;
    }
    Ok(outcome)
}

/// `timeline.json` of a run folder: its records in slices, with the scrapes written beside
/// them (which is why it comes after the scraper's last scrape).
fn write_timeline(
    dir: &std::path::Path,
    plan: &Plan,
    records: &[reports::records::RequestRecord],
    origin: chrono::DateTime<chrono::Utc>,
    slice: Option<Duration>,
) -> Result<()> {
    let origin_unix_ms = origin.timestamp_micros() as f64 / 1000.0;
    let phases = reports::timeline::PhaseBounds {
        warmup_s: plan.warmup_s,
        measured_end_s: plan.duration_s.map(|d| plan.warmup_s + d),
    };
    let scrapes = reports::server_metrics::read_scrapes(dir)?;
    reports::timeline::build(
        records,
        phases,
        slice.map(|s| s.as_secs_f64()),
        &scrapes,
        origin_unix_ms,
    )
    .write(dir)
}

/// The `--slo` of `args` with its `--max-error-rate`.
pub fn slo_spec(args: &RunArgs) -> Result<Option<SloSpec>> {
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

/// The command line with the values of `--api-key` and `--header` replaced by a digest: enough
/// to tell two runs apart, never the secret.
pub fn redacted_command_line(args: impl IntoIterator<Item = String>) -> Vec<String> {
    const SECRET_FLAGS: [&str; 2] = ["--api-key", "--header"];
    let digest = |value: &str| format!("<redacted fnv1a:{:016x}>", fnv1a(value.as_bytes()));
    let mut out = Vec::new();
    let mut secret_next = false;
    for arg in args {
        if secret_next {
            out.push(digest(&arg));
            secret_next = false;
        } else if let Some((flag, value)) = arg
            .split_once('=')
            .filter(|(flag, _)| SECRET_FLAGS.contains(flag))
        {
            out.push(format!("{flag}={}", digest(value)));
        } else {
            secret_next = SECRET_FLAGS.contains(&arg.as_str());
            out.push(arg);
        }
    }
    out
}

fn write_meta(dir: &std::path::Path, meta: &RunMeta) -> Result<()> {
    let path = dir.join("meta.json");
    std::fs::write(&path, serde_json::to_string_pretty(meta)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Prepares `args`, calibrates against the built-in mock first when `--calibrate` asks, and
/// executes the plan against `--url` into `--out` (`loadgen run`, and each sweep level).
pub async fn run_once(
    args: &RunArgs,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<run::RunOutcome> {
    let mut prepared = prepare_run(args)?;
    if args.calibrate {
        eprintln!("loadgen: calibrating against the built-in mock…");
        prepared.calibration = Some(
            calibrate(&CalibrateConfig {
                rate: args.rate,
                concurrency: args.concurrency,
                // An https:// run is calibrated over TLS too.
                tls: args
                    .url
                    .starts_with("https://")
                    .then(crate::tls::self_signed_pair)
                    .transpose()?
                    .map(Arc::new),
                ..CalibrateConfig::default()
            })
            .await?,
        );
    }
    execute_prepared(
        args,
        &prepared,
        Execution {
            url: args.url.clone(),
            out: args.out.clone(),
            server_version: None,
            extra: Default::default(),
            progress: !args.no_progress,
            stop,
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn run_args(argv: &[&str]) -> RunArgs {
        let mut full = vec!["loadgen", "run"];
        full.extend_from_slice(argv);
        match crate::cli::Cli::try_parse_from(full).unwrap().command {
            crate::cli::Command::Run(args) => *args,
            _ => unreachable!(),
        }
    }

    #[test]
    fn shards_of_one_schedule_share_its_digest_and_other_options_change_it() {
        let base = ["--num-prompts", "20", "--start-at", "2099-01-01T00:00:00Z"];
        let digest = |extra: &[&str]| {
            let mut argv = base.to_vec();
            argv.extend_from_slice(extra);
            let prepared = prepare_run(&run_args(&argv)).unwrap();
            (prepared.schedule_digest, prepared.plan.requests.len())
        };
        let (d0, n0) = digest(&["--shard", "0/2"]);
        let (d1, n1) = digest(&["--shard", "1/2"]);
        assert_eq!(d0, d1);
        assert_eq!((n0, n1), (10, 10));
        assert_eq!(digest(&[]).0, d0);
        assert_ne!(digest(&["--min-tokens"]).0, d0);
        assert_ne!(digest(&["--seed", "1"]).0, d0);
        assert_ne!(digest(&["--rate", "2"]).0, d0);
        assert_ne!(digest(&["--extra-body", r#"{"temperature": 0}"#]).0, d0);
        assert_eq!(d0.len(), 16);
    }

    #[test]
    fn secrets_never_reach_the_recorded_command_line() {
        let argv = [
            "loadgen",
            "run",
            "--api-key",
            "sk-live-123",
            "--header=X-Token: abc",
            "--header",
            "Authorization: Bearer xyz",
            "--rate",
            "2",
        ];
        let line = redacted_command_line(argv.iter().map(|s| s.to_string())).join(" ");
        for secret in ["sk-live-123", "abc", "xyz"] {
            assert!(!line.contains(secret), "{line}");
        }
        assert!(
            line.contains("--api-key <redacted fnv1a:") && line.contains("--rate 2"),
            "{line}"
        );
        assert!(line.contains("--header=<redacted fnv1a:"), "{line}");
        // Two runs with another key tell apart.
        let other = redacted_command_line(["--api-key", "sk-live-124"].map(String::from));
        assert!(!line.contains(&other[1]));
    }

    #[test]
    fn prompt_ids_are_refused_before_the_run_for_apis_that_take_text() {
        for backend in ["chat", "tgi"] {
            let err = prepare_run(&run_args(&["--prompt-ids", "--backend", backend]))
                .err()
                .unwrap();
            assert!(format!("{err}").contains("--prompt-ids needs --backend completions"));
        }
        assert!(prepare_run(&run_args(&["--prompt-ids", "--num-prompts", "3"])).is_ok());
    }

    #[test]
    fn a_timestamped_trace_replays_its_timestamps_once_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("mooncake.jsonl");
        let lines: Vec<String> = [1000, 1500, 1500, 4000]
            .iter()
            .map(|t| {
                format!(r#"{{"timestamp": {t}, "input_length": 64, "output_length": 8, "hash_ids": [1]}}"#)
            })
            .collect();
        std::fs::write(&trace, lines.join("\n")).unwrap();
        let path = trace.to_str().unwrap();
        let prompts = PromptBuilder::approximate();
        let (plan, _, schedule) = build_plan(
            &run_args(&["--workload", "trace", "--trace", path]),
            &prompts,
        )
        .unwrap();
        let times: Vec<f64> = plan.requests.iter().map(|r| r.at_s.unwrap()).collect();
        assert_eq!(times, [0.0, 0.5, 0.5, 3.0]);
        assert_eq!(schedule["arrival"], "trace");
        // Asked otherwise: Poisson at --rate, the rows cycled for --num-prompts.
        let args = run_args(&[
            "--workload",
            "trace",
            "--trace",
            path,
            "--arrival",
            "poisson",
            "--num-prompts",
            "10",
        ]);
        let (plan, _, schedule) = build_plan(&args, &prompts).unwrap();
        assert_eq!(plan.requests.len(), 10);
        assert_eq!(schedule["schedule"]["arrival"]["kind"], "poisson");
        // A synthetic workload keeps the default of 1,000 Poisson requests.
        let (plan, _, _) = build_plan(&run_args(&[]), &prompts).unwrap();
        assert_eq!(plan.requests.len(), DEFAULT_NUM_PROMPTS);
    }
}
