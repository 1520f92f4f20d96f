//! The send loop: sends a [`Plan`] to a server. Before the window, the connection pool is
//! opened (one connection per expected concurrent request, see [`Plan::warm_connections`])
//! so that no measured request pays connection set-up. Open loop: a dedicated sender thread
//! serialises each request's body, then waits for its scheduled instant (sleep, then spin
//! for the last stretch) and fires it without waiting for responses; each request runs as
//! its own tokio task. Closed loop: N workers, each sending its next request when the
//! previous one ends. Records are appended to `records.jsonl` (one line, flushed) as each
//! request ends, by a writer thread off the runtime that timestamps chunks. A stop signal
//! ends the run early: finished records are kept and the summary is marked incomplete.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use reports::metrics::{self, Metrics, MetricsOptions, Slo};
use reports::records::{ErrorKind, Phase, RequestError, RequestRecord, SessionEnd, SessionTurn};
use reports::summary::Summary;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::load::plan::{ClassBy, LoadMode, Plan, SessionLimits};
use crate::load::workload::agentic;
use crate::load::workload::prompt::PromptBuilder;
use crate::run::client_cpu::CpuClock;
use crate::run::progress::Progress;
use crate::wire::api::{Conversation, Message, ToolCall};
use crate::wire::client::stopped;
use crate::wire::client::{self, Answer, RequestStub};
use crate::wire::connections::{self, HttpClient};
use crate::wire::target::Target;
use crate::wire::tls::TlsSettings;

/// Options of sending one plan.
pub struct SendOptions {
    /// Folder for `schedule.jsonl`, `records.jsonl` and `summary.json` (`meta.json` is the caller's).
    pub out_dir: Option<PathBuf>,
    pub slos: Vec<Slo>,
    /// Print a live progress line on stderr.
    pub progress: bool,
    /// Becomes `true` to stop the run early.
    pub stop: watch::Receiver<bool>,
    /// Wall-clock instant of the run origin (t = 0), shared by the workers of a sharded
    /// schedule; `None` starts as soon as the connections are warm.
    pub start_at: Option<SystemTime>,
}

/// The result of a run.
pub struct RunOutcome {
    /// Every finished request, sorted by id.
    pub records: Vec<RequestRecord>,
    pub metrics: Metrics,
    pub summary: Summary,
    /// Wall-clock time of the run origin (t = 0 in the records).
    pub start_time: chrono::DateTime<chrono::Utc>,
    /// With a start instant: how long before it the run was ready to send (ms).
    pub ready_before_start_ms: Option<f64>,
}

struct SendContext {
    client: HttpClient,
    target: Target,
    prompts: Arc<PromptBuilder>,
    plan: Arc<Plan>,
    origin: Instant,
    stop: watch::Receiver<bool>,
    /// Fires with `stop`, or when a session run's drain limit passes.
    drain: watch::Receiver<bool>,
    stop_flag: Arc<AtomicBool>,
    slots: Option<Arc<Semaphore>>,
    progress: Arc<Progress>,
    records: mpsc::UnboundedSender<RequestRecord>,
    started: AtomicU64,
}

fn ms(origin: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(origin).as_secs_f64() * 1000.0
}

/// Runs request `index` of the plan as record `id`; sends its record unless stopped.
async fn one_request(
    ctx: Arc<SendContext>,
    id: u64,
    index: usize,
    scheduled: Instant,
    phase: Phase,
    body: Result<bytes::Bytes>,
) {
    let stop = ctx.stop.clone();
    if let Some((record, _)) = send_one(&ctx, id, index, scheduled, phase, body, false, stop).await
    {
        let _ = ctx.records.send(record);
    }
}

/// Sends request `index` of the plan as record `id` (after a concurrency slot, if capped)
/// and returns its record, with its answer when `keep_answer` (else an empty one); `None`
/// when the run stopped before it was sent.
#[allow(clippy::too_many_arguments)]
async fn send_one(
    ctx: &SendContext,
    id: u64,
    index: usize,
    scheduled: Instant,
    phase: Phase,
    body: Result<bytes::Bytes>,
    keep_answer: bool,
    stop: watch::Receiver<bool>,
) -> Option<(RequestRecord, Answer)> {
    let task_start = Instant::now();
    ctx.started.fetch_add(1, Ordering::Relaxed);
    ctx.progress.on_sent();
    let spec = &ctx.plan.requests[index].spec;
    // A request still waiting for a concurrency slot when the run stops was never sent and
    // leaves no record; one in flight is recorded with what arrived (`Phase::Interrupted`).
    let permit = async {
        match &ctx.slots {
            Some(sem) => sem.clone().acquire_owned().await.ok().map(Some),
            None => Some(None),
        }
    };
    let permit = tokio::select! {
        biased;
        _ = stopped(stop.clone()) => None,
        p = permit => p,
    };
    match permit {
        None => None,
        Some(_permit) => {
            let queue_ms = task_start.elapsed().as_secs_f64() * 1000.0;
            let stub = RequestStub {
                id,
                phase,
                scheduled_ms: ms(ctx.origin, scheduled),
                queue_ms,
                input_len: spec.input_len,
                output_len: spec.output_len,
                prefix_group: spec.prefix_group,
            };
            Some(match body {
                Ok(body) => {
                    let (mut record, answer) = client::exchange(
                        &ctx.client,
                        &ctx.target,
                        stub,
                        body,
                        ctx.origin,
                        stop,
                        keep_answer,
                    )
                    .await;
                    record.class = ctx.plan.class_by.of_spec(spec);
                    (record, answer.unwrap_or_default())
                }
                Err(e) => {
                    eprintln!("loadgen: request {id}: {e:#}");
                    let mut record =
                        client::unsent_record(stub, &ctx.target, ctx.origin, format!("{e:#}"));
                    record.class = ctx.plan.class_by.of_spec(spec);
                    (record, Answer::default())
                }
            })
        }
    }
}

/// Runs the session whose first turn is request `first` of the plan: each later turn is
/// sent its wait after the previous answer ended, with the whole history (every earlier
/// message and the server's answers: their text and tool calls, exactly as received). A
/// chat session's turn adds a user message; an agent session's turn (which offers its
/// agent's tools behind its system prompt) adds one result per tool call of the answer
/// before it, the wait being the tools' latency. The session ends after its last planned
/// turn (capped when more were drawn, or when an agent still calls tools), at an agent's
/// answer without tool calls (completed), when its next prompt would pass
/// `--max-history-tokens` (capped), when a turn fails or an agent's call cannot be run
/// (failed), or when the drain limit passes or the run stops before its next turn (cut);
/// its last record says which. A turn in flight at the drain limit is recorded as
/// interrupted.
async fn run_session(
    ctx: Arc<SendContext>,
    first: usize,
    start: Instant,
    drain: watch::Receiver<bool>,
) {
    let limits = ctx.plan.sessions.unwrap_or(SessionLimits {
        max_history_tokens: None,
        drain_s: None,
    });
    let phase = ctx.plan.phase_at((start - ctx.origin).as_secs_f64());
    let agentic = ctx.plan.agentic.as_ref();
    let agent = agentic.and_then(|a| {
        let group = ctx.plan.requests[first].spec.prefix_group?;
        a.agents.get(usize::try_from(group).ok()?)
    });
    let mut history: Vec<Message> = agent
        .map(|a| vec![Message::System(a.system.clone())])
        .unwrap_or_default();
    let tools = agent.map_or(&[][..], |a| &a.tools[..]);
    // The tool calls of the previous answer, which this turn answers (agent sessions).
    let mut calls: Vec<ToolCall> = Vec::new();
    // The previous turn's record, sent once this turn is (or ends the session as cut).
    let mut held: Option<RequestRecord> = None;
    let mut index = first;
    let mut due = start;
    // Each turn's body is built before its wait, so that the wait is the drawn one.
    let mut body = turn_body(&ctx, index, agent.is_some(), &calls, &mut history, tools);
    // The wait before this turn (0 before the first).
    let mut wait_ms = 0.0;
    loop {
        let req = &ctx.plan.requests[index];
        let Some(turn) = req.session else { return };
        let (turn_bytes, history_messages) = body;
        let Some((mut record, answer)) = send_one(
            &ctx,
            req.id,
            index,
            due,
            phase,
            turn_bytes,
            // A trace's turns send their recorded prompts: no answer to keep.
            !ctx.plan.recorded_sessions,
            drain.clone(),
        )
        .await
        else {
            // Stopped before this turn was sent (waiting for a concurrency slot): the
            // previous turn's record says the session was cut.
            if let Some(mut previous) = held.take() {
                if let Some(session) = previous.session.as_mut() {
                    session.end = Some(SessionEnd::Cut);
                }
                let _ = ctx.records.send(previous);
            }
            return;
        };
        // The session went on: the previous turn's record is final.
        if let Some(previous) = held.take() {
            let _ = ctx.records.send(previous);
        }
        let next = ctx.plan.requests.get(index + 1).filter(|r| {
            r.session
                .is_some_and(|t| t.session == turn.session && t.turn == turn.turn + 1)
        });
        if agent.is_some() && record.is_success() {
            if let Some(why) = unusable_call(&answer.calls) {
                record.error = Some(RequestError {
                    kind: ErrorKind::ToolCall,
                    message: why,
                });
            }
        }
        calls = answer.calls;
        // The answer goes back without its reasoning; an agent's next turn carries one
        // result per call.
        let next_prompt = record.prompt_tokens
            + record.answer_tokens()
            + next.map_or(0, |n| {
                u64::from(n.spec.input_len) * calls.len().max(1) as u64
            });
        let end = if !record.is_success() {
            Some(if record.phase == Phase::Interrupted {
                SessionEnd::Cut
            } else {
                SessionEnd::Failed
            })
        } else if agent.is_some() && calls.is_empty() {
            Some(SessionEnd::Completed)
        } else if turn.last || next.is_none() {
            Some(if turn.capped || agent.is_some() {
                SessionEnd::Capped
            } else {
                SessionEnd::Completed
            })
        } else if limits
            .max_history_tokens
            .is_some_and(|cap| next_prompt > cap)
        {
            Some(SessionEnd::Capped)
        } else if *drain.borrow() {
            Some(SessionEnd::Cut)
        } else {
            None
        };
        if ctx.plan.class_by == ClassBy::Turn {
            record.class = Some(
                // A failed later agent turn carried tool results: no answer says it was final.
                match (
                    turn.turn,
                    agent.is_some(),
                    calls.is_empty() && record.is_success(),
                ) {
                    (1, _, _) => "first",
                    (_, false, _) => "follow-up",
                    (_, true, true) => "final",
                    (_, true, false) => "tool-result",
                }
                .to_string(),
            );
        }
        record.session = Some(SessionTurn {
            session: turn.session,
            turn: turn.turn,
            history_messages,
            window: phase,
            end,
            wait_ms,
            tools_offered: tools.len() as u32,
            tool_calls: calls.len() as u32,
        });
        let (Some(next), None) = (next, end) else {
            let _ = ctx.records.send(record);
            return;
        };
        // The think or tool time after this answer; a trace's turn at its time, but not
        // before this answer.
        let now = Instant::now();
        due = match (ctx.plan.recorded_sessions, next.at_s) {
            (true, Some(at)) => (ctx.origin + Duration::from_secs_f64(at)).max(now),
            _ => now + Duration::from_secs_f64(next.session.map_or(0.0, |t| t.think_s)),
        };
        wait_ms = due.duration_since(now).as_secs_f64() * 1000.0;
        if !ctx.plan.recorded_sessions {
            history.push(Message::Assistant {
                text: answer.text,
                calls: calls.clone(),
            });
        }
        body = turn_body(
            &ctx,
            index + 1,
            agent.is_some(),
            &calls,
            &mut history,
            tools,
        );
        let mut stop = drain.clone();
        let cut = tokio::select! {
            biased;
            _ = stopped(stop.clone()) => true,
            () = tokio::time::sleep_until(due.into()) => *stop.borrow_and_update(),
        };
        // The record waits until the next turn is sent: a session cut before it says so on
        // its last record.
        if cut {
            if let Some(session) = record.session.as_mut() {
                session.end = Some(SessionEnd::Cut);
            }
            let _ = ctx.records.send(record);
            return;
        }
        held = Some(record);
        index += 1;
    }
}

/// The body of the session turn that is request `index` of the plan, and the messages
/// before its new ones: its new messages (a user message; in an agent session after the
/// first turn, one result per call of the answer before) join `history` first. A trace's
/// turn is its own recorded prompt, without history.
fn turn_body(
    ctx: &SendContext,
    index: usize,
    agent: bool,
    calls: &[ToolCall],
    history: &mut Vec<Message>,
    tools: &[agentic::FunctionTool],
) -> (Result<bytes::Bytes>, u32) {
    let req = &ctx.plan.requests[index];
    if ctx.plan.recorded_sessions {
        return (
            client::encoded_body(&ctx.target, &req.spec, &ctx.prompts),
            0,
        );
    }
    let first = req.session.is_none_or(|t| t.turn == 1);
    let new: Vec<Message> = if agent && !first {
        calls
            .iter()
            .enumerate()
            .map(|(j, call)| Message::ToolResult {
                call_id: call.id.clone(),
                output: agentic::tool_result(&req.spec.prompt, j, &ctx.prompts),
            })
            .collect()
    } else {
        vec![Message::User(req.spec.prompt.text(&ctx.prompts))]
    };
    let history_messages = history.len() as u32;
    history.extend(new);
    let conversation = Conversation {
        messages: history,
        tools,
        require_call: first
            && ctx
                .plan
                .agentic
                .as_ref()
                .is_some_and(|a| a.require_first_call),
    };
    (
        client::conversation_body(&ctx.target, &req.spec, conversation),
        history_messages,
    )
}

/// Why the client cannot run one of `calls`, if it cannot: a call without its id or name,
/// or whose arguments are not a JSON object.
fn unusable_call(calls: &[ToolCall]) -> Option<String> {
    calls.iter().find_map(|call| {
        if call.id.is_empty() || call.name.is_empty() {
            return Some(format!(
                "a tool call without its {} (name `{}`, arguments {})",
                if call.id.is_empty() { "id" } else { "name" },
                call.name,
                call.arguments
            ));
        }
        match serde_json::from_str::<serde_json::Value>(&call.arguments) {
            Ok(serde_json::Value::Object(_)) => None,
            Ok(_) => Some(format!(
                "tool call {} ({}): its arguments are not a JSON object: {}",
                call.id, call.name, call.arguments
            )),
            Err(e) => Some(format!(
                "tool call {} ({}): its arguments do not parse ({e}): {}",
                call.id, call.name, call.arguments
            )),
        }
    })
}

/// The open-loop sender: serialises each body ahead of its send time, sleeps to ~200 µs
/// before it, then spins.
fn sender_thread(ctx: Arc<SendContext>, handle: tokio::runtime::Handle) {
    const SPIN: Duration = Duration::from_micros(200);
    #[cfg(target_os = "linux")]
    // SAFETY: sets this thread's timer slack (1 ns instead of 50 µs) so that its sleeps end
    // on time; no memory is involved.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    for (index, req) in ctx.plan.requests.iter().enumerate() {
        // A session's later turns follow its earlier answers, not the clock.
        if req.session.is_some_and(|t| t.turn > 1) {
            continue;
        }
        let body = req
            .session
            .is_none()
            .then(|| client::encoded_body(&ctx.target, &req.spec, &ctx.prompts));
        let at = req.at_s.unwrap_or(0.0);
        let deadline = ctx.origin + Duration::from_secs_f64(at);
        loop {
            if ctx.stop_flag.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            if now + SPIN >= deadline {
                break;
            }
            std::thread::sleep((deadline - now - SPIN).min(Duration::from_millis(50)));
        }
        while Instant::now() < deadline {
            std::hint::spin_loop();
        }
        match body {
            Some(body) => {
                let phase = ctx.plan.phase_at(at);
                handle.spawn(one_request(
                    ctx.clone(),
                    req.id,
                    index,
                    deadline,
                    phase,
                    body,
                ));
            }
            None => {
                handle.spawn(run_session(ctx.clone(), index, deadline, ctx.drain.clone()));
            }
        }
    }
}

async fn closed_worker(ctx: Arc<SendContext>, next: Arc<AtomicU64>, end: Option<Instant>) {
    let n = ctx.plan.requests.len() as u64;
    loop {
        if *ctx.stop.borrow() || end.is_some_and(|e| Instant::now() >= e) {
            return;
        }
        let id = next.fetch_add(1, Ordering::Relaxed);
        if end.is_none() && id >= n {
            return;
        }
        let index = (id % n) as usize;
        let body = client::encoded_body(&ctx.target, &ctx.plan.requests[index].spec, &ctx.prompts);
        let now = Instant::now();
        let phase = ctx.plan.phase_at((now - ctx.origin).as_secs_f64());
        one_request(ctx.clone(), id, index, now, phase, body).await;
    }
}

/// Appends each record to `records.jsonl` (flushed per line) and collects them; runs on its
/// own thread so that serialisation and disk writes never delay a chunk's timestamp.
fn record_writer(
    mut rx: mpsc::UnboundedReceiver<RequestRecord>,
    path: Option<PathBuf>,
    progress: Arc<Progress>,
) -> Result<Vec<RequestRecord>> {
    let mut file = match &path {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {}", p.display()))?,
        )),
        None => None,
    };
    let mut records = Vec::new();
    while let Some(record) = rx.blocking_recv() {
        progress.on_done(&record);
        if let (Some(f), Some(p)) = (file.as_mut(), &path) {
            let line = serde_json::to_string(&record).context("serialising a record")?;
            writeln!(f, "{line}")
                .and_then(|_| f.flush())
                .with_context(|| format!("writing {}", p.display()))?;
        }
        records.push(record);
    }
    Ok(records)
}

/// Sends `plan` to `target`. The caller resolves the model and writes `meta.json`.
pub async fn send_plan(
    plan: Arc<Plan>,
    target: Target,
    prompts: Arc<PromptBuilder>,
    opts: SendOptions,
) -> Result<RunOutcome> {
    if plan.requests.is_empty() {
        anyhow::bail!("the plan has no requests");
    }
    let uri = target
        .base_url
        .parse::<http::Uri>()
        .ok()
        .filter(|uri| {
            matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.host().is_some()
                && !uri.authority().is_some_and(|a| a.as_str().contains('@'))
        })
        .with_context(|| {
            format!(
                "--url {}: not an http:// or https:// URL with a host and no credentials \
                 (pass credentials with --api-key or --header)",
                target.base_url
            )
        })?;
    preflight(&uri, target.tls.as_ref()).await?;
    if let Some(dir) = &opts.out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        plan.write_schedule(&dir.join("schedule.jsonl"))?;
        let records = dir.join("records.jsonl");
        std::fs::write(&records, "").with_context(|| format!("creating {}", records.display()))?;
    }
    let pool = match plan.mode {
        LoadMode::Closed { concurrency } => concurrency,
        LoadMode::Open => plan.max_concurrency.unwrap_or(1024),
    };
    let client = connections::http_client(pool, target.tls.as_ref());
    if let Some(at) = opts.start_at {
        wait_to_warm(at, opts.stop.clone()).await?;
    }
    client::warm_pool(&client, &target, plan.warm_connections(pool)).await;
    let (origin, start_time, ready_before_start_ms) = run_origin(opts.start_at)?;
    // The client's CPU share is over the run, not over the wait for its start.
    tokio::time::sleep_until(origin.checked_sub(SETTLE).unwrap_or(origin).into()).await;
    let cpu = CpuClock::start();
    let (tx, rx) = mpsc::unbounded_channel();
    let progress = Arc::new(Progress::new(
        plan.requests.len() as u64,
        plan.agentic.is_some(),
    ));
    let stop_flag = Arc::new(AtomicBool::new(false));
    let drain = drain_signal(&plan, origin, opts.stop.clone());
    let ctx = Arc::new(SendContext {
        client,
        target,
        prompts,
        plan: plan.clone(),
        origin,
        stop: opts.stop.clone(),
        drain,
        stop_flag: stop_flag.clone(),
        slots: plan
            .max_concurrency
            .map(|n| Arc::new(Semaphore::new(n.max(1)))),
        progress: progress.clone(),
        records: tx,
        started: AtomicU64::new(0),
    });
    let records_path = opts.out_dir.as_ref().map(|d| d.join("records.jsonl"));
    let writer = {
        let progress = progress.clone();
        std::thread::Builder::new()
            .name("loadgen-records".into())
            .spawn(move || record_writer(rx, records_path, progress))
            .context("starting the record writer")?
    };
    let flag_watch = {
        let stop = opts.stop.clone();
        let flag = stop_flag.clone();
        tokio::spawn(async move {
            stopped(stop).await;
            flag.store(true, Ordering::Relaxed);
        })
    };
    let printer = opts
        .progress
        .then(|| tokio::spawn(progress.clone().print_every(Duration::from_secs(1), origin)));

    match plan.mode {
        LoadMode::Open => {
            let (c, handle) = (ctx.clone(), tokio::runtime::Handle::current());
            let thread = std::thread::Builder::new()
                .name("loadgen-sender".into())
                .spawn(move || sender_thread(c, handle))
                .context("starting the sender thread")?;
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .context("joining the sender thread")?
                .map_err(|_| anyhow::anyhow!("the sender thread panicked"))?;
        }
        LoadMode::Closed { concurrency } => {
            let next = Arc::new(AtomicU64::new(0));
            let end = plan
                .duration_s
                .map(|d| origin + Duration::from_secs_f64(plan.warmup_s + d + plan.cooldown_s));
            tokio::time::sleep_until(origin.into()).await;
            let workers: Vec<_> = (0..concurrency.max(1))
                .map(|_| tokio::spawn(closed_worker(ctx.clone(), next.clone(), end)))
                .collect();
            for w in workers {
                w.await.context("closed-loop worker failed")?;
            }
        }
    }
    let started = ctx.started.load(Ordering::Relaxed);
    drop(ctx);
    let mut records = tokio::task::spawn_blocking(move || writer.join())
        .await
        .context("joining the record writer")?
        .map_err(|_| anyhow::anyhow!("the record writer panicked"))??;
    flag_watch.abort();
    if let Some(p) = printer {
        p.abort();
        progress.print_line(origin);
        eprintln!();
    }
    records.sort_by_key(|r| r.id);
    let incomplete = *opts.stop.borrow();
    let unfinished = match (plan.mode, plan.sessions) {
        // Sessions never started; a started one ends with a record that says how.
        (LoadMode::Open, Some(_)) => {
            let firsts = plan
                .requests
                .iter()
                .filter(|r| r.session.is_some_and(|t| t.turn == 1))
                .count();
            let started = records
                .iter()
                .filter(|r| r.session.is_some_and(|t| t.turn == 1))
                .count();
            firsts.saturating_sub(started) as u64
        }
        (LoadMode::Open, None) => (plan.requests.len() as u64).saturating_sub(records.len() as u64),
        (LoadMode::Closed { .. }, _) => started.saturating_sub(records.len() as u64),
    };
    let metrics_opts = MetricsOptions {
        slos: opts.slos.clone(),
        open_loop: plan.mode == LoadMode::Open,
        client_cpu: cpu.share(),
    };
    let metrics = metrics::compute(&records, &metrics_opts);
    let mut summary = Summary::new(&metrics, &opts.slos, incomplete, unfinished);
    summary.classes = reports::classes::of(&records, &metrics_opts, metrics.duration_s);
    if let Some(dir) = &opts.out_dir {
        summary.write(&dir.join("summary.json"))?;
        reports::histograms::write_for_records(
            dir,
            &records,
            start_time.into(),
            Duration::from_secs_f64(metrics.duration_s),
        )?;
    }
    Ok(RunOutcome {
        records,
        metrics,
        summary,
        start_time,
        ready_before_start_ms,
    })
}

/// Opens one connection to an `https://` server before anything else, so that a
/// certificate problem is one clear start-up error, not a failure per request.
async fn preflight(uri: &http::Uri, tls: Option<&TlsSettings>) -> Result<()> {
    if uri.scheme_str() != Some("https") {
        if tls.is_some_and(|t| t.options.ca_cert.is_some() || t.options.insecure) {
            anyhow::bail!("--ca-cert and --insecure are for https:// URLs; {uri} is plain HTTP");
        }
        return Ok(());
    }
    let tls = tls.context("an https:// URL needs TLS settings")?;
    let host = uri.host().unwrap_or_default();
    match tokio::time::timeout(
        Duration::from_secs(30),
        connections::connect(uri.clone(), Some(tls.config.clone())),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) => {
            anyhow::bail!("{}", tls.options.explain(host, &e))
        }
        Ok(Err(e)) => Err(anyhow::anyhow!("{uri}: cannot connect: {e}")),
        Err(_) => anyhow::bail!("{uri}: no TLS handshake within 30 s"),
    }
}

/// The stop signal of a session run's turns: `stop`, or the drain limit (the schedule's end
/// plus `drain_s`) passing, whichever comes first.
fn drain_signal(
    plan: &Plan,
    origin: Instant,
    stop: watch::Receiver<bool>,
) -> watch::Receiver<bool> {
    let Some(limit) = plan.sessions.and_then(|s| s.drain_s).zip(plan.duration_s) else {
        return stop;
    };
    let (drain_s, duration_s) = limit;
    let end =
        origin + Duration::from_secs_f64(plan.warmup_s + duration_s + plan.cooldown_s + drain_s);
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = stopped(stop) => {}
            () = tokio::time::sleep_until(end.into()) => {}
        }
        let _ = tx.send(true);
    });
    rx
}

/// How long before a shared start instant the connection pool is opened.
const WARM_AHEAD_OF_START: Duration = Duration::from_secs(3);
/// Without a start instant, the time left for the runtime to settle before the first send.
const SETTLE: Duration = Duration::from_millis(20);

/// Waits until [`WARM_AHEAD_OF_START`] before `at` (idle connections may be closed by the
/// server, so they are warmed shortly before the start), re-reading the wall clock every
/// second so that a clock step during a long wait moves the wake-up with it. Fails when
/// `at` has already passed or the run is stopped meanwhile.
async fn wait_to_warm(at: SystemTime, stop: watch::Receiver<bool>) -> Result<()> {
    let wait = async {
        loop {
            let Ok(ahead) = at.duration_since(SystemTime::now()) else {
                return;
            };
            let Some(left) = ahead
                .checked_sub(WARM_AHEAD_OF_START)
                .filter(|l| !l.is_zero())
            else {
                return;
            };
            tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        }
    };
    tokio::select! {
        biased;
        _ = stopped(stop) => anyhow::bail!("stopped before the start instant {}; nothing was sent", crate::run::clock::rfc3339(at)),
        () = wait => {}
    }
    if let Err(past) = at.duration_since(SystemTime::now()) {
        return Err(sent_late(at, past.duration()));
    }
    Ok(())
}

/// The error of a worker that is ready only `past` after its start instant `at`.
fn sent_late(at: SystemTime, past: Duration) -> anyhow::Error {
    anyhow::anyhow!(
        "--start-at {} was {:.3} s ago when this worker was ready to send: it would send its \
         share late, so it sends nothing; give a later --start-at",
        crate::run::clock::rfc3339(at),
        past.as_secs_f64()
    )
}

/// The run origin as a monotonic instant and in wall-clock time, and (with `start_at`) how
/// long before it the run was ready. A start instant already past (or within [`SETTLE`]) is
/// an error: a worker that would send its share late says so instead.
fn run_origin(
    start_at: Option<SystemTime>,
) -> Result<(Instant, chrono::DateTime<chrono::Utc>, Option<f64>)> {
    let (now, wall) = (Instant::now(), SystemTime::now());
    let Some(at) = start_at else {
        return Ok((now + SETTLE, (wall + SETTLE).into(), None));
    };
    match at.duration_since(wall) {
        Ok(ahead) if ahead >= SETTLE => {
            Ok((now + ahead, at.into(), Some(ahead.as_secs_f64() * 1000.0)))
        }
        Ok(ahead) => anyhow::bail!(
            "not ready to send before --start-at {}: only {:.1} ms were left (the first \
             requests would go late); give a later --start-at",
            crate::run::clock::rfc3339(at),
            ahead.as_secs_f64() * 1000.0
        ),
        Err(past) => Err(sent_late(at, past.duration())),
    }
}
