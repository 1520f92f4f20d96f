//! Run preparation, shared by `run`, `sweep`, `compare` and `probe`: the request plan the
//! options describe (workload, schedule, warm-up, sessions), built without touching the
//! network, and its digest.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use reports::slo::SloSpec;
use serde_json::json;

use crate::load::plan::{
    AgenticPlan, ClassBy, LoadMode, Plan, PlannedRequest, PlannedTurn, SessionLimits,
};
use crate::load::schedule::{
    scale_to_rate, scale_trace, Arrival, ExactRate, Extent, RampUp, ScheduleSpec, TraceScaling,
    Window, EXACT_RATE_TOLERANCE,
};
use crate::load::workload::agentic::AgenticProfile;
use crate::load::workload::lengths::{clip_to_context, scale_lengths};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::synthetic::{LengthModel, PrefixGroups, SyntheticWorkload};
use crate::load::workload::traces::{self, TraceFormat, TraceRow};
use crate::load::workload::{mix, PromptSource, RequestSpec};
use crate::spec::run::{
    ArrivalKind, Lengths, LoadSpec, OpenLoad, RunSpec, SessionsSpec, WindowSpec,
    DEFAULT_NUM_PROMPTS,
};
use crate::wire::extra_body::ExtraBody;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Builds the plan (request list + schedule) for `run`; also returns workload / schedule
/// descriptions for `meta.json`.
pub fn build_plan(
    run: &RunSpec,
    prompts: &PromptBuilder,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    if let Some(sessions) = &run.sessions {
        return build_session_plan(run, prompts, sessions);
    }
    let warmup = run.window.warmup.as_secs_f64();
    let duration = run.window.duration.map(|d| d.as_secs_f64());
    let cooldown = run.window.cooldown.as_secs_f64();
    let schedule_seed = mix(run.seed, 0x5C4E_D01E);
    let mut workload_meta =
        json!({"kind": format!("{:?}", run.workload.lengths.kind()), "seed": run.seed});

    // Trace rows (lengths, maybe timestamps) when the workload is a trace.
    let trace_rows = if let Lengths::Trace { path, format } = &run.workload.lengths {
        let format = match format {
            Some(f) => *f,
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
        if usable.iter().any(|r| r.prompt.is_none()) {
            workload_meta["trace"]["synthesised"] = json!(
                "prompts without recorded text are \
                seeded words to the recorded lengths; rows with equal block ids or one prefix \
                group share those words"
            );
        }
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
    let open = match &run.load {
        LoadSpec::Open(open) => Some(open),
        LoadSpec::Closed { .. } => None,
    };
    let arrival = match open.and_then(|o| o.arrival) {
        Some(a) => a,
        None if timestamped && open.is_some() => {
            eprintln!(
                "loadgen: replaying the trace's timestamps, each row once (--arrival poisson \
                 --rate R for a Poisson schedule instead)"
            );
            ArrivalKind::Trace
        }
        None => ArrivalKind::Poisson,
    };
    if let Some(rows) = trace_rows
        .as_ref()
        .filter(|rows| rows.iter().any(|r| r.session.is_some()))
    {
        let Some(open) = open else {
            bail!("--concurrency with a trace that links turns into sessions: a closed loop sends single requests; replay its sessions open-loop (leave --concurrency out)");
        };
        return trace_session_plan(run, rows, open, arrival, workload_meta);
    }
    let num_prompts = run
        .window
        .num_prompts
        .unwrap_or(trace_rows.as_ref().map_or(DEFAULT_NUM_PROMPTS, Vec::len));
    // How requests are sent, and the number of requests.
    let (sends, schedule_meta): (Sends, serde_json::Value) = match (&run.load, arrival) {
        (&LoadSpec::Closed { concurrency: c }, _) => (
            Sends::Closed(c),
            json!({"mode": "closed", "concurrency": c}),
        ),
        (LoadSpec::Open(open), ArrivalKind::Trace) => {
            let rows = trace_rows
                .as_ref()
                .context("--arrival trace needs --workload trace")?;
            let ts: Vec<f64> = rows
                .iter()
                .map(|r| r.timestamp_ms)
                .collect::<Option<Vec<f64>>>()
                .context("--arrival trace: this trace has no timestamps")?;
            let scaling = open.trace;
            let (kept, times) = scale_trace(&ts, &scaling)?;
            let rows: Vec<TraceRow> = kept.iter().map(|&i| rows[i].clone()).collect();
            let mut meta = json!({"mode": "open", "arrival": "trace", "scaling": scaling,
                "bursts": "rows with equal timestamps are sent at the same instant"});
            let end = duration.map(|d| warmup + d + cooldown);
            let mut times = times;
            // The rows whose timestamps the shift of an exact rate dropped go with them.
            let mut first_row = 0;
            if open.exact_rate {
                let target = open.trace.target_rate.context(
                    "--exact-rate with --arrival trace needs --target-rate: a trace's own \
                     timestamps are replayed as recorded",
                )?;
                let (scaled, exact) = scale_to_rate(&times, target, window(&run.window), end)?;
                warn_residual(&exact);
                times = scaled;
                first_row = exact.dropped;
                meta["exact_rate"] = json!(exact);
            }
            if let Some(end) = end {
                times.retain(|&t| t < end);
            }
            let n = times.len();
            return finish_plan(
                run,
                Sends::At(times),
                Some(rows[first_row..first_row + n].to_vec()),
                n,
                workload_meta,
                meta,
            );
        }
        (LoadSpec::Open(open), arrival) => {
            let arrival = match arrival {
                ArrivalKind::Poisson => Arrival::Poisson,
                ArrivalKind::Gamma => Arrival::Gamma {
                    burstiness: open.burstiness,
                },
                ArrivalKind::Constant | ArrivalKind::Trace => Arrival::Constant,
            };
            let spec = schedule_spec(open, arrival);
            let end = duration.map(|d| warmup + d + cooldown);
            let mut meta =
                json!({"mode": "open", "schedule": spec, "schedule_seed": schedule_seed});
            let times = if open.exact_rate {
                // Drawn well past the end, so that a draw slowed down still fills the window.
                let extent = match end {
                    Some(end) => Extent::Until(4.0 * end),
                    None => Extent::Count(num_prompts),
                };
                let draw = spec.generate(extent, schedule_seed)?;
                let (times, exact) = scale_to_rate(&draw, open.rate, window(&run.window), end)?;
                warn_residual(&exact);
                meta["exact_rate"] = json!(exact);
                times
            } else {
                let extent = match end {
                    Some(end) => Extent::Until(end),
                    None => Extent::Count(num_prompts),
                };
                spec.generate(extent, schedule_seed)?
            };
            (Sends::At(times), meta)
        }
    };
    let n = match &sends {
        Sends::At(times) => times.len(),
        Sends::Closed(_) => num_prompts,
    };
    finish_plan(run, sends, trace_rows, n, workload_meta, schedule_meta)
}

/// Says so when no scaling brought the scheduled rate within the tolerance of its target.
fn warn_residual(exact: &ExactRate) {
    if exact.residual.abs() > EXACT_RATE_TOLERANCE {
        eprintln!(
            "loadgen: --exact-rate: the schedule holds {:.4} req/s over the window, {:+.2}% off \
             the {} asked (no scaling of this draw lands within {:.1}%; meta.json records it)",
            exact.scheduled_rate,
            exact.residual * 100.0,
            exact.target_rate,
            EXACT_RATE_TOLERANCE * 100.0
        );
    }
}

/// The measured window of a run's schedule.
fn window(window: &WindowSpec) -> Window {
    Window {
        warmup_s: window.warmup.as_secs_f64(),
        duration_s: window.duration.map(|d| d.as_secs_f64()),
    }
}

/// The open-loop schedule of `open` on `arrival`: its rate and ramp.
fn schedule_spec(open: &OpenLoad, arrival: Arrival) -> ScheduleSpec {
    ScheduleSpec {
        arrival,
        rate: open.rate,
        ramp_up: open.ramp_up.map(|r| RampUp {
            from_rate: open.ramp_start_rate,
            secs: r.as_secs_f64(),
        }),
    }
}

/// How a plan's requests are sent: at these times (open loop), or by this many workers.
enum Sends {
    At(Vec<f64>),
    Closed(usize),
}

fn finish_plan(
    run: &RunSpec,
    sends: Sends,
    trace_rows: Option<Vec<TraceRow>>,
    n: usize,
    mut workload_meta: serde_json::Value,
    mut schedule_meta: serde_json::Value,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    if n == 0 {
        bail!("the schedule has no requests (rate too low for the duration?)");
    }
    let mut specs: Vec<RequestSpec> = match &trace_rows {
        Some(rows) => (0..n)
            .map(|i| rows[i % rows.len()].spec(run.seed, i as u64))
            .collect(),
        None => synthetic_specs(run, n, &mut workload_meta)?,
    };
    reshape(run, &mut specs, &mut workload_meta)?;
    let mut specs = specs.into_iter();
    let mut next = |_| specs.next().expect("one spec per request");
    let plan = match sends {
        Sends::Closed(c) => Plan::closed(c, n, &mut next),
        Sends::At(times) => Plan::open(times, &mut next),
    };
    let plan = Plan {
        warmup_s: run.window.warmup.as_secs_f64(),
        duration_s: run.window.duration.map(|d| d.as_secs_f64()),
        cooldown_s: run.window.cooldown.as_secs_f64(),
        max_concurrency: run.window.max_concurrency,
        ..plan
    };
    schedule_meta["warmup_s"] = json!(plan.warmup_s);
    schedule_meta["duration_s"] = json!(plan.duration_s);
    schedule_meta["cooldown_s"] = json!(plan.cooldown_s);
    schedule_meta["max_concurrency"] = json!(plan.max_concurrency);
    Ok((plan, workload_meta, schedule_meta))
}

/// `--length-scale`, `--max-model-len` and `--prompt-salt` applied to the drawn requests
/// (the salt acts when prompts are built) and recorded in `workload_meta`.
fn reshape(
    run: &RunSpec,
    specs: &mut [RequestSpec],
    workload_meta: &mut serde_json::Value,
) -> Result<()> {
    let workload = &run.workload;
    if workload.length_scale != 1.0 {
        scale_lengths(specs, workload.length_scale)?;
        workload_meta["length_scale"] = json!(workload.length_scale);
    }
    if let Some(limit) = workload.max_model_len {
        let clipped = clip_to_context(specs, limit)?;
        workload_meta["max_model_len"] = json!({"limit": limit, "clipped_requests": clipped});
    }
    if workload.prompt_salt != 0 {
        workload_meta["prompt_salt"] = json!(workload.prompt_salt);
    }
    Ok(())
}

/// `n` requests of the synthetic workload `run` asks for; their length model in
/// `workload_meta`.
fn synthetic_specs(
    run: &RunSpec,
    n: usize,
    workload_meta: &mut serde_json::Value,
) -> Result<Vec<RequestSpec>> {
    let model = match &run.workload.lengths {
        Lengths::Random {
            input_len,
            output_len,
            range_ratio,
        } => LengthModel::Random {
            input_len: *input_len,
            output_len: *output_len,
            range_ratio: *range_ratio,
        },
        Lengths::SharegptLike {
            profile,
            max_input_len,
            max_output_len,
        } => LengthModel::ShareGptLike {
            profile: profile.clone(),
            max_input_len: *max_input_len,
            max_output_len: *max_output_len,
        },
        Lengths::Trace { .. } => unreachable!("a trace's requests come from its rows"),
        Lengths::Agentic { .. } => unreachable!("agentic requests are sessions' turns"),
    };
    let prefix = (run.workload.prefix_len > 0).then_some(PrefixGroups {
        len: run.workload.prefix_len,
        groups: run.workload.prefix_groups,
    });
    workload_meta["lengths"] = serde_json::to_value(&model)?;
    workload_meta["prefix"] = serde_json::to_value(prefix)?;
    SyntheticWorkload::new(model, prefix)?.generate(n, run.seed)
}

/// The plan of a session run (`--turns`): session start times on the arrival process at
/// `--rate` sessions/s, each session's turns (synthetic user turns and answer lengths, or a
/// ShareGPT file's conversations with `--turns all`) and think times, all from the seed.
fn build_session_plan(
    run: &RunSpec,
    prompts: &PromptBuilder,
    sessions: &SessionsSpec,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    let spec = &sessions.spec;
    let mut workload_meta = json!({"kind": format!("{:?}", run.workload.lengths.kind()),
        "seed": run.seed, "sessions": spec});
    // `RunSpec::from_args` took a trace with `--turns all` only, and a synthetic workload
    // without it.
    let conversations = match &run.workload.lengths {
        Lengths::Trace { path, format } => {
            let format = match format {
                Some(f) => *f,
                None => traces::detect_format(path)?,
            };
            if matches!(
                format,
                TraceFormat::Bailian | TraceFormat::Tracelab | TraceFormat::Weka
            ) {
                bail!("{} ({}) links its own turns into sessions, replayed as they are: leave --turns out", path.display(), format.name());
            }
            if format != TraceFormat::Sharegpt {
                bail!("--turns all replays the turns of a ShareGPT conversation file; {} is {}, which has none", path.display(), format.name());
            }
            let count = |t: &str| prompts.count_tokens(t);
            let conversations = traces::load_sharegpt_conversations(path, &count)?;
            if conversations.is_empty() {
                bail!(
                    "{}: no conversation with a human turn and its answer",
                    path.display()
                );
            }
            workload_meta["trace"] = json!({"path": path, "format": format,
                "conversations": conversations.len()});
            Some(conversations)
        }
        _ => None,
    };
    // Sessions arrive open-loop, never on a trace's timestamps (`RunSpec::from_args`).
    let LoadSpec::Open(open) = &run.load else {
        unreachable!("a closed loop of sessions is refused by RunSpec::from_args")
    };
    let arrival = match open.arrival {
        Some(ArrivalKind::Gamma) => Arrival::Gamma {
            burstiness: open.burstiness,
        },
        Some(ArrivalKind::Constant) => Arrival::Constant,
        _ => Arrival::Poisson,
    };
    let schedule = schedule_spec(open, arrival);
    let window = &run.window;
    let warmup = window.warmup.as_secs_f64();
    let extent = match window.duration {
        Some(d) => Extent::Until(warmup + d.as_secs_f64() + window.cooldown.as_secs_f64()),
        None => Extent::Count(
            window
                .num_prompts
                .unwrap_or(conversations.as_ref().map_or(DEFAULT_NUM_PROMPTS, Vec::len)),
        ),
    };
    let schedule_seed = mix(run.seed, 0x5C4E_D01E);
    let starts = schedule.generate(extent, schedule_seed)?;
    if starts.is_empty() {
        bail!("the schedule has no sessions (rate too low for the duration?)");
    }
    let recorded = |s: usize| {
        conversations
            .as_ref()
            .map_or(1, |c| c[s % c.len()].len() as u32)
    };
    let draws = spec.draw(starts.len(), mix(run.seed, SESSION_SEED_TAG), recorded)?;
    let total: usize = draws.iter().map(|d| d.think_s.len()).sum();
    let mut agentic = None;
    let mut turn_specs = match (&conversations, &run.workload.lengths) {
        (Some(c), _) => draws
            .iter()
            .enumerate()
            .flat_map(|(s, d)| {
                let rows = &c[s % c.len()];
                (0..d.think_s.len()).map(move |k| RequestSpec {
                    input_len: rows[k].input_len,
                    output_len: rows[k].output_len,
                    prefix_group: None,
                    prompt: PromptSource::Text(rows[k].prompt.clone().unwrap_or_default()),
                    model: None,
                    class: None,
                })
            })
            .collect::<Vec<_>>(),
        (
            None,
            Lengths::Agentic {
                options,
                require_first_call,
            },
        ) => {
            let profile = AgenticProfile::new(options)?;
            let agents = profile.agents(options, run.seed, prompts)?;
            workload_meta["agentic"] = json!({
                "profile": profile,
                "agents": agents.iter().map(|a| json!({
                    "system_tokens": prompts.count_tokens(&a.system),
                    "tools": a.tools.iter().map(|t| &t.name).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "tool_choice": if *require_first_call { "required on each session's first turn" } else { "auto" },
                "synthesised": "system prompts, tool descriptions, tasks and tool results are seeded word sequences of the drawn lengths",
            });
            agentic = Some(AgenticPlan {
                agents,
                require_first_call: *require_first_call,
            });
            profile
                .turns(
                    draws.iter().map(|d| d.think_s.len()),
                    options.agents,
                    mix(run.seed, AGENTIC_SEED_TAG),
                )?
                .into_iter()
                .flatten()
                .collect()
        }
        (None, _) => synthetic_specs(run, total, &mut workload_meta)?,
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
        warmup_s: warmup,
        duration_s: window.duration.map(|d| d.as_secs_f64()),
        cooldown_s: window.cooldown.as_secs_f64(),
        max_concurrency: window.max_concurrency,
        sessions: Some(SessionLimits {
            max_history_tokens: sessions.max_history_tokens,
            drain_s: Some(
                sessions
                    .drain
                    .map_or(DEFAULT_SESSION_DRAIN_S, |d| d.as_secs_f64()),
            ),
        }),
        agentic,
        ..Plan::with_requests(LoadMode::Open, requests)
    };
    let schedule_meta = json!({"mode": "open", "unit": "sessions", "schedule": schedule,
        "schedule_seed": schedule_seed, "sessions": starts.len(), "turns": total,
        "warmup_s": plan.warmup_s, "duration_s": plan.duration_s, "cooldown_s": plan.cooldown_s,
        "max_concurrency": plan.max_concurrency, "max_history_tokens": sessions.max_history_tokens,
        "session_drain_s": plan.sessions.and_then(|s| s.drain_s)});
    Ok((plan, workload_meta, schedule_meta))
}

/// The plan of a trace that links turns into sessions: each session's turns at their
/// recorded times (scaled, windowed), or, with `--arrival poisson|gamma|constant`, sessions
/// starting on that process at `--rate` sessions/s and each turn at its recorded offset in
/// its session (`--time-scale` applies); a later turn also waits for the previous answer.
fn trace_session_plan(
    run: &RunSpec,
    rows: &[TraceRow],
    open: &OpenLoad,
    arrival: ArrivalKind,
    mut workload_meta: serde_json::Value,
) -> Result<(Plan, serde_json::Value, serde_json::Value)> {
    if run.window.num_prompts.is_some() {
        bail!("--num-prompts with a trace that links turns into sessions: its sessions replay whole; bound the run with --duration or --trace-window");
    }
    if open.exact_rate {
        bail!("--exact-rate with a trace that links turns into sessions: a session's later turns follow its answers, so no factor fixes their rate");
    }
    let warmup = run.window.warmup.as_secs_f64();
    let end = run
        .window
        .duration
        .map(|d| warmup + d.as_secs_f64() + run.window.cooldown.as_secs_f64());
    let recorded: Vec<f64> = rows
        .iter()
        .map(|r| r.timestamp_ms)
        .collect::<Option<Vec<f64>>>()
        .context("this trace links turns into sessions but has rows without a time")?;
    let (times, mut schedule_meta) = match arrival {
        ArrivalKind::Trace => {
            // --trace-window keeps whole sessions: those whose first turn is in it.
            let own: Vec<Option<f64>> = recorded.iter().map(|&t| Some(t / 1000.0)).collect();
            let origin = recorded.iter().copied().fold(f64::INFINITY, f64::min) / 1000.0;
            let kept: Vec<usize> = crate::run::trace_sessions::sessions(rows, &own)
                .into_iter()
                .filter(|turns| {
                    let first = turns
                        .iter()
                        .filter_map(|&i| own[i])
                        .fold(f64::INFINITY, f64::min)
                        - origin;
                    open.trace
                        .window
                        .is_none_or(|(start, end)| first >= start && first < end)
                })
                .flatten()
                .collect();
            if kept.is_empty() {
                bail!("--trace-window keeps no session (a session is kept, whole, when its first turn is in the window)");
            }
            let kept_times: Vec<f64> = kept.iter().map(|&i| recorded[i]).collect();
            let whole = TraceScaling {
                window: None,
                ..open.trace
            };
            let (order, scaled) = scale_trace(&kept_times, &whole)?;
            let mut times = vec![None; rows.len()];
            for (&k, &t) in order.iter().zip(&scaled) {
                times[kept[k]] = Some(t);
            }
            (
                times,
                json!({"mode": "open", "unit": "turns", "arrival": "trace",
                    "scaling": open.trace,
                    "window": "whole sessions whose first turn is in --trace-window"}),
            )
        }
        other => {
            if open.trace.target_rate.is_some() || open.trace.window.is_some() {
                bail!("--target-rate and --trace-window act on the trace's own times; with --arrival {} sessions start at --rate sessions/s", other.name());
            }
            let speedup = open.trace.time_scale.unwrap_or(1.0);
            if speedup <= 0.0 {
                bail!("--time-scale must be positive");
            }
            let own: Vec<Option<f64>> = recorded.iter().map(|&t| Some(t / 1000.0)).collect();
            let groups = crate::run::trace_sessions::sessions(rows, &own);
            let kind = match other {
                ArrivalKind::Gamma => Arrival::Gamma {
                    burstiness: open.burstiness,
                },
                ArrivalKind::Constant => Arrival::Constant,
                _ => Arrival::Poisson,
            };
            let spec = schedule_spec(open, kind);
            let schedule_seed = mix(run.seed, 0x5C4E_D01E);
            let extent = match end {
                Some(end) => Extent::Until(end),
                None => Extent::Count(groups.len()),
            };
            let starts = spec.generate(extent, schedule_seed)?;
            let mut times = vec![None; rows.len()];
            // Sessions replay in the trace's order, as many as the process starts.
            for (turns, start) in groups.iter().zip(starts) {
                // From the session's earliest turn (turn numbers need not follow times).
                let first = turns
                    .iter()
                    .map(|&i| recorded[i])
                    .fold(f64::INFINITY, f64::min)
                    / 1000.0;
                for &i in turns {
                    times[i] = Some(start + (recorded[i] / 1000.0 - first) / speedup);
                }
            }
            (
                times,
                json!({"mode": "open", "unit": "sessions", "schedule": spec,
                    "schedule_seed": schedule_seed, "time_scale": speedup}),
            )
        }
    };
    let groups = crate::run::trace_sessions::sessions(rows, &times);
    let (requests, sessions_meta) =
        crate::run::trace_sessions::requests(run.seed, rows, &groups, &times, end);
    if requests.is_empty() {
        bail!(
            "the trace's sessions start after the run's end (--duration) or outside --trace-window"
        );
    }
    let mut specs: Vec<RequestSpec> = requests.iter().map(|r| r.spec.clone()).collect();
    reshape(run, &mut specs, &mut workload_meta)?;
    let requests: Vec<PlannedRequest> = requests
        .into_iter()
        .zip(specs)
        .map(|(r, spec)| PlannedRequest { spec, ..r })
        .collect();
    workload_meta["trace"]["sessions"] = sessions_meta;
    let plan = Plan {
        warmup_s: warmup,
        duration_s: run.window.duration.map(|d| d.as_secs_f64()),
        cooldown_s: run.window.cooldown.as_secs_f64(),
        max_concurrency: run.window.max_concurrency,
        sessions: Some(SessionLimits {
            max_history_tokens: None,
            drain_s: Some(DEFAULT_SESSION_DRAIN_S),
        }),
        recorded_sessions: true,
        ..Plan::with_requests(LoadMode::Open, requests)
    };
    schedule_meta["turns"] = json!(plan.requests.len());
    schedule_meta["warmup_s"] = json!(plan.warmup_s);
    schedule_meta["duration_s"] = json!(plan.duration_s);
    schedule_meta["cooldown_s"] = json!(plan.cooldown_s);
    schedule_meta["max_concurrency"] = json!(plan.max_concurrency);
    schedule_meta["session_drain_s"] = json!(DEFAULT_SESSION_DRAIN_S);
    schedule_meta["later_turns"] =
        json!("each at its time, but not before the previous turn's answer ended");
    Ok((plan, workload_meta, schedule_meta))
}

/// `--session-drain` unless given, seconds.
const DEFAULT_SESSION_DRAIN_S: f64 = 60.0;

/// Seeds the session draws apart from the schedule's and the workload's.
const SESSION_SEED_TAG: u64 = 0x5E55_1015;

/// Seeds an agentic workload's turn draws apart from its agents'.
const AGENTIC_SEED_TAG: u64 = 0xA6E7_0003;

/// Everything a run decides before sending: prompts, SLOs and the request plan.
/// Built once and executed any number of times (sweep probes, A/B rounds) with identical
/// requests and schedule.
pub struct PreparedRun {
    pub prompts: Arc<PromptBuilder>,
    pub slos: Vec<reports::metrics::Slo>,
    pub plan: Arc<Plan>,
    pub workload_meta: serde_json::Value,
    pub schedule_meta: serde_json::Value,
    /// Recorded in `meta.json` when the run calibrated against the mock first.
    pub calibration: Option<reports::records::Calibration>,
    /// Requests in the whole schedule (`plan` holds only a shard's with `--shard`).
    pub schedule_requests: u64,
    /// See [`reports::records::ShardInfo::schedule_digest`].
    pub schedule_digest: String,
}

/// Builds the prompts, SLOs and plan of `run` (no network).
pub fn prepare_run(run: &RunSpec) -> Result<PreparedRun> {
    let prompts = Arc::new(
        match &run.workload.tokenizer {
            Some(p) => PromptBuilder::from_tokenizer(p)?,
            None => PromptBuilder::approximate(),
        }
        .with_salt(run.workload.prompt_salt),
    );
    let slos = run
        .slo
        .as_ref()
        .map(SloSpec::per_request)
        .unwrap_or_default();
    let (mut plan, mut workload_meta, schedule_meta) = build_plan(run, &prompts)?;
    classes(run, &mut plan, &mut workload_meta)?;
    let schedule_requests = plan.requests.len() as u64;
    let schedule_digest = schedule_digest(run, &plan, &prompts)?;
    if let Some(shard) = run.shard {
        shard.restrict(&mut plan)?;
    }
    Ok(PreparedRun {
        prompts,
        slos,
        plan: Arc::new(plan),
        workload_meta,
        schedule_meta,
        calibration: None,
        schedule_requests,
        schedule_digest,
    })
}

/// `--model-mix` drawn onto the plan's requests from the seed (a session's turns share
/// its first turn's draw), and `--class-by` resolved: `auto` is the trace's model or
/// service column, else the mix's models, else a session turn's kind, else no classes.
fn classes(run: &RunSpec, plan: &mut Plan, workload_meta: &mut serde_json::Value) -> Result<()> {
    if !run.model_mix.is_empty() {
        let total: f64 = run.model_mix.iter().map(|(_, w)| w).sum();
        let mut rng = StdRng::seed_from_u64(mix(run.seed, MODEL_MIX_SEED_TAG));
        let mut drawn: std::collections::BTreeMap<&str, u64> = Default::default();
        let mut session_model: Option<String> = None;
        for r in &mut plan.requests {
            let model = match (r.session, &session_model) {
                (Some(t), Some(model)) if t.turn > 1 => model.clone(),
                _ => {
                    let mut u = rng.random::<f64>() * total;
                    let (name, _) = run
                        .model_mix
                        .iter()
                        .find(|(_, w)| {
                            u -= w;
                            u < 0.0
                        })
                        .unwrap_or(&run.model_mix[run.model_mix.len() - 1]);
                    *drawn.entry(name.as_str()).or_default() += 1;
                    name.clone()
                }
            };
            session_model = Some(model.clone());
            r.spec.model = Some(model);
        }
        workload_meta["model_mix"] = json!({"weights": run.model_mix, "drawn": drawn,
            "per": if plan.sessions.is_some() { "session" } else { "request" }});
    }
    let trace_classes = plan.requests.iter().any(|r| r.spec.class.is_some());
    let class_by = match run.class_by {
        Some(ClassBy::Trace) if !trace_classes => {
            bail!("--class-by trace: this workload's requests have no model or service column (bailian, tracelab and weka traces have one)")
        }
        Some(ClassBy::PrefixGroup)
            if plan.requests.iter().all(|r| r.spec.prefix_group.is_none()) =>
        {
            bail!("--class-by prefix-group: this workload has no prefix groups (--prefix-len, a trace's prefix groups, or agents)")
        }
        Some(class_by) => class_by,
        None if trace_classes => ClassBy::Trace,
        None if !run.model_mix.is_empty() => ClassBy::Model,
        None if plan.sessions.is_some() && !plan.recorded_sessions => ClassBy::Turn,
        None => ClassBy::None,
    };
    plan.class_by = class_by;
    workload_meta["class_by"] = json!(class_by);
    Ok(())
}

/// Seeds `--model-mix`'s draws apart from the others.
const MODEL_MIX_SEED_TAG: u64 = 0x30DE_1313;

/// The digest that tells the shards of one schedule apart from those of another: the whole
/// request list and every option that shapes a request on the wire (FNV-1a, 64 bits, hex).
fn schedule_digest(run: &RunSpec, plan: &Plan, prompts: &PromptBuilder) -> Result<String> {
    let target = &run.target;
    let shape = json!({
        "requests": plan.requests,
        "phases": [plan.warmup_s, plan.duration_s, plan.cooldown_s],
        "backend": target.backend.name(),
        "prompt_ids": target.prompt_ids,
        "ignore_eos": target.ignore_eos,
        "min_tokens": target.min_tokens,
        "continuous_usage": target.continuous_usage,
        "timeout_s": target.timeout.as_secs_f64(),
        "slo": run.slo_text,
        "approximate_lengths": prompts.is_approximate(),
        "prompt_salt": run.workload.prompt_salt,
        "extra_body": target.extra_body.as_ref().map(ExtraBody::to_value),
        "require_first_call": plan.agentic.as_ref().map(|a| a.require_first_call),
        "class_by": plan.class_by,
    });
    Ok(format!("{:016x}", fnv1a(&serde_json::to_vec(&shape)?)))
}

/// FNV-1a, 64 bits: a digest to tell things apart (not a secret's protection against guessing).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The spec of `loadgen run ARGV`.
    fn run_spec(argv: &[&str]) -> RunSpec {
        spec(argv).unwrap()
    }

    fn spec(argv: &[&str]) -> Result<RunSpec> {
        let mut full = vec!["loadgen", "run"];
        full.extend_from_slice(argv);
        match crate::cli::Cli::try_parse_from(full).unwrap().command {
            crate::cli::Command::Run(args) => RunSpec::from_args(&args),
            _ => unreachable!(),
        }
    }

    /// `loadgen run ARGV`'s spec and its prepared run.
    fn prepare(argv: &[&str]) -> Result<PreparedRun> {
        prepare_run(&spec(argv)?)
    }

    #[test]
    fn shards_of_one_schedule_share_its_digest_and_other_options_change_it() {
        let base = ["--num-prompts", "20", "--start-at", "2099-01-01T00:00:00Z"];
        let digest = |extra: &[&str]| {
            let mut argv = base.to_vec();
            argv.extend_from_slice(extra);
            let prepared = prepare_run(&run_spec(&argv)).unwrap();
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
        assert_ne!(digest(&["--prompt-salt", "3"]).0, d0);
        assert_ne!(digest(&["--length-scale", "0.5"]).0, d0);
        assert_eq!(d0.len(), 16);
    }

    #[test]
    fn lengths_scale_then_clip_to_the_context_and_are_recorded() {
        let base = [
            "--workload",
            "random",
            "--random-input-len",
            "1000",
            "--random-output-len",
            "100",
            "--num-prompts",
            "4",
        ];
        let with = |extra: &[&str]| {
            let mut argv = base.to_vec();
            argv.extend_from_slice(extra);
            build_plan(&run_spec(&argv), &PromptBuilder::approximate()).unwrap()
        };
        let lengths = |plan: &Plan| -> Vec<(u32, u32)> {
            plan.requests
                .iter()
                .map(|r| (r.spec.input_len, r.spec.output_len))
                .collect()
        };
        let (plan, meta, _) = with(&["--length-scale", "0.5"]);
        assert_eq!(lengths(&plan), [(500, 50); 4]);
        assert_eq!(meta["length_scale"], 0.5);
        let (plan, meta, _) = with(&["--length-scale", "0.5", "--max-model-len", "300"]);
        assert_eq!(lengths(&plan), [(250, 50); 4]);
        assert_eq!(meta["max_model_len"]["clipped_requests"], 4);
        let (plain, _, _) = with(&[]);
        assert_eq!(lengths(&plain), [(1000, 100); 4]);
    }

    #[test]
    fn prompt_ids_are_refused_before_the_run_for_apis_that_take_text() {
        for backend in ["chat", "tgi"] {
            let err = prepare(&["--prompt-ids", "--backend", backend])
                .err()
                .unwrap();
            assert!(format!("{err}").contains("--prompt-ids needs --backend completions"));
        }
        assert!(prepare(&["--prompt-ids", "--num-prompts", "3"]).is_ok());
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
            &run_spec(&["--workload", "trace", "--trace", path]),
            &prompts,
        )
        .unwrap();
        let times: Vec<f64> = plan.requests.iter().map(|r| r.at_s.unwrap()).collect();
        assert_eq!(times, [0.0, 0.5, 0.5, 3.0]);
        assert_eq!(schedule["arrival"], "trace");
        // Asked otherwise: Poisson at --rate, the rows cycled for --num-prompts.
        let args = run_spec(&[
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
        let (plan, _, _) = build_plan(&run_spec(&[]), &prompts).unwrap();
        assert_eq!(plan.requests.len(), DEFAULT_NUM_PROMPTS);
    }
}
