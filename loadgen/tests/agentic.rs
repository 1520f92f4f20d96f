//! Agent sessions and the Responses API against the built-in mock: each later turn carries
//! exactly the previous answer's tool calls and one result per call, sent the tool latency
//! after the answer; the Responses backend times the mock as chat does; and the edge cases
//! (no calls at all, a call that cannot be run) end sessions as documented.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgen::load::plan::Plan;
use loadgen::load::workload::prompt::PromptBuilder;
use loadgen::mock::{self, MockConfig};
use loadgen::run::send::{send_plan, RunOutcome, SendOptions};
use loadgen::wire::backend::Backend;
use loadgen::wire::target::Target;
use reports::records::{ErrorKind, RequestRecord, SessionEnd};
use serde_json::{json, Value};

/// Timing-sensitive tests run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The plan of `loadgen run ARGS` (parsed as the command line would be).
fn planned(argv: &[&str]) -> Plan {
    let mut full = vec!["loadgen", "run"];
    full.extend_from_slice(argv);
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from(full).unwrap();
    let loadgen::cli::Command::Run(args) = cli.command else {
        unreachable!()
    };
    let spec = loadgen::spec::RunSpec::from_args(&args).unwrap();
    loadgen::run::prepare::build_plan(&spec, &PromptBuilder::approximate())
        .unwrap()
        .0
}

/// Why `loadgen run ARGS` is refused.
fn refused(argv: &[&str]) -> String {
    let mut full = vec!["loadgen", "run"];
    full.extend_from_slice(argv);
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from(full).unwrap();
    let loadgen::cli::Command::Run(args) = cli.command else {
        unreachable!()
    };
    format!(
        "{:#}",
        loadgen::spec::RunSpec::from_args(&args).unwrap_err()
    )
}

fn target(base_url: String, backend: Backend) -> Target {
    Target {
        base_url,
        backend,
        model: "loadgen-mock".into(),
        headers: Vec::new(),
        api_key: None,
        timeout: Duration::from_secs(30),
        ignore_eos: false,
        min_tokens: false,
        prompt_ids: false,
        continuous_usage: true,
        extra_body: None,
        tls: None,
    }
}

async fn against_mock(cfg: MockConfig, plan: Plan, backend: Backend) -> RunOutcome {
    let (addr, handle) = mock::spawn(cfg).await.unwrap();
    let outcome = send_plan(
        Arc::new(plan),
        target(format!("http://{addr}"), backend),
        Arc::new(PromptBuilder::approximate()),
        SendOptions {
            out_dir: None,
            slos: Vec::new(),
            progress: false,
            stop: loadgen::run::stop::never_stop(),
            start_at: None,
        },
    )
    .await
    .unwrap();
    handle.shutdown().await;
    outcome
}

/// An agentic run of `sessions` sessions with a constant tool latency of `latency_ms`.
fn agentic_plan(backend: &str, sessions: usize, latency_ms: u32) -> Plan {
    planned(&[
        "--backend",
        backend,
        "--workload",
        "agentic",
        "--prefix-len",
        "40",
        "--prefix-groups",
        "2",
        "--max-input-len",
        "30",
        "--max-output-len",
        "24",
        "--tool-latency",
        &format!("constant:{latency_ms}ms"),
        "--max-session-turns",
        "5",
        "--rate",
        "20",
        "--num-prompts",
        &sessions.to_string(),
        "--seed",
        "3",
    ])
}

fn bodies_by_id(bodies: &Mutex<Vec<(Option<u64>, Value)>>) -> HashMap<u64, Value> {
    bodies
        .lock()
        .unwrap()
        .iter()
        .map(|(id, body)| (id.unwrap(), body.clone()))
        .collect()
}

/// The mock's call `c` in its answer to request `id` whose conversation held `results`
/// results.
fn mock_call(id: u64, results: u32, c: u32) -> (String, String) {
    (
        format!("call_{id}_{results}_{c}"),
        format!(r#"{{"query": "r{id} t{results} c{c}"}}"#),
    )
}

/// Each turn after the first carries the previous turn's conversation, then the answer with
/// exactly the mock's calls (ids, names, arguments as streamed in pieces), then one result
/// per call; it is sent the tool latency after the answer ended. The mock makes 2 calls per
/// answer while fewer than 2 answers' results are in the conversation, so every session runs
/// 3 turns and completes at the text answer. Chat and Responses alike, each in its own
/// format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_turns_carry_exactly_the_calls_and_their_results() {
    let _guard = SERIAL.lock().await;
    for backend in [Backend::Chat, Backend::Responses] {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let cfg = MockConfig {
            ttft: Duration::from_millis(5),
            itl: Duration::from_millis(1),
            bodies: Some(bodies.clone()),
            tool_turns: 3,
            calls_per_answer: 2,
            ..MockConfig::default()
        };
        let plan = agentic_plan(backend.name(), 8, 40);
        let agents = plan.agentic.clone().unwrap().agents;
        let drawn: HashMap<u64, u32> = plan
            .requests
            .iter()
            .map(|r| (r.id, r.spec.input_len))
            .collect();
        let out = against_mock(cfg, plan, backend).await;
        assert_eq!(out.records.len(), 24, "{backend:?}: 8 sessions of 3 turns");
        assert!(out.records.iter().all(RequestRecord::is_success));
        let bodies = bodies_by_id(&bodies);
        let by_id: HashMap<u64, &RequestRecord> = out.records.iter().map(|r| (r.id, r)).collect();
        let mut excesses = Vec::new();
        for r in &out.records {
            let s = r.session.unwrap();
            let body = &bodies[&r.id];
            let agent = &agents[r.prefix_group.unwrap() as usize];
            assert_eq!(s.tools_offered, 8);
            assert_eq!(
                s.tool_calls,
                if s.turn < 3 { 2 } else { 0 },
                "request {}",
                r.id
            );
            assert_eq!(s.end.is_some(), s.turn == 3);
            assert_eq!(body["tool_choice"], "auto");
            assert_eq!(body["tools"].as_array().unwrap().len(), 8);
            assert!(body.get("ignore_eos").is_none());
            // The system prompt (chat: a message; responses: the instructions), the task,
            // then per earlier turn its calls and their results.
            let (messages, tool_name) = match backend {
                Backend::Chat => {
                    assert_eq!(body["messages"][0]["content"], agent.system.as_str());
                    // The system prompt; then the task, and per answer its message and 2 results.
                    let before = if s.turn == 1 { 1 } else { 3 * (s.turn - 1) };
                    assert_eq!(s.history_messages, before);
                    (
                        body["messages"].as_array().unwrap().clone(),
                        body["tools"][0]["function"]["name"].clone(),
                    )
                }
                _ => {
                    assert_eq!(body["instructions"], agent.system.as_str());
                    assert_eq!(body["tools"][0]["type"], "function");
                    assert_eq!(body["store"], false);
                    (
                        body["input"].as_array().unwrap().clone(),
                        body["tools"][0]["name"].clone(),
                    )
                }
            };
            assert_eq!(tool_name, agent.tools[0].name.as_str());
            if s.turn == 1 {
                assert_eq!(messages.len(), if backend == Backend::Chat { 2 } else { 1 });
                continue;
            }
            let prev = by_id[&(r.id - 1)];
            assert_eq!(prev.session.unwrap().session, s.session);
            let prev_messages = match backend {
                Backend::Chat => bodies[&prev.id]["messages"].as_array().unwrap().clone(),
                _ => bodies[&prev.id]["input"].as_array().unwrap().clone(),
            };
            let calls: Vec<(String, String)> = (0..2)
                .map(|c| mock_call(prev.id, 2 * (s.turn - 2), c))
                .collect();
            let mut expected = prev_messages.clone();
            let results = &messages[messages.len() - 2..];
            match backend {
                Backend::Chat => {
                    let tool_calls: Vec<Value> = calls
                        .iter()
                        .map(|(id, arguments)| {
                            json!({"id": id, "type": "function",
                            "function": {"name": tool_name, "arguments": arguments}})
                        })
                        .collect();
                    expected.push(
                        json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
                    );
                    for (result, (id, _)) in results.iter().zip(&calls) {
                        assert_eq!(result["role"], "tool");
                        assert_eq!(result["tool_call_id"], id.as_str());
                        let words = result["content"]
                            .as_str()
                            .unwrap()
                            .split_whitespace()
                            .count();
                        assert_eq!(
                            words as u32, drawn[&r.id],
                            "a result of the turn's drawn length"
                        );
                    }
                }
                _ => {
                    for (id, arguments) in &calls {
                        expected.push(json!({"type": "function_call", "call_id": id,
                            "name": tool_name, "arguments": arguments}));
                    }
                    for (result, (id, _)) in results.iter().zip(&calls) {
                        assert_eq!(result["type"], "function_call_output");
                        assert_eq!(result["call_id"], id.as_str());
                        let words = result["output"]
                            .as_str()
                            .unwrap()
                            .split_whitespace()
                            .count();
                        assert_eq!(
                            words as u32, drawn[&r.id],
                            "a result of the turn's drawn length"
                        );
                    }
                }
            }
            assert_ne!(results[0], results[1], "each call gets its own result");
            assert_eq!(
                &messages[..messages.len() - 2],
                &expected[..],
                "{backend:?} request {}",
                r.id
            );
            excesses.push(r.sent_ms - prev.end_ms - s.wait_ms);
            assert_eq!(s.wait_ms, 40.0);
        }
        // Sent the tool latency after the answer's last chunk, plus the client's own delay:
        // the stream's last events (about 1 ms after the last chunk here) and the timer's
        // wake, which tokio's wheel rounds up to its next 1 ms tick. Within 2 ms at the
        // median; the p90 of 16 (its second largest) within 3 ms. A wait counted from the
        // send, not the answer's end, would be the whole answer late.
        excesses.sort_by(f64::total_cmp);
        let (median, p90) = (
            excesses[excesses.len() / 2],
            excesses[excesses.len() * 9 / 10],
        );
        assert!(
            excesses[0] > -0.5 && (0.0..2.0).contains(&median) && p90 < 3.0,
            "{backend:?}: sent after the tool latency by {excesses:?} ms"
        );
        let sessions = out.summary.sessions.as_ref().unwrap();
        assert_eq!(sessions.ended.get("completed"), Some(&8));
        let tools = sessions.tools.as_ref().unwrap();
        assert_eq!(
            (tools.turns, tools.turns_with_calls, tools.calls),
            (24, 16, 32)
        );
        let per = sessions.per_session.as_ref().unwrap();
        assert_eq!(per.sessions, 8);
        assert!(
            (per.waiting.mean - 80.0).abs() < 1e-9,
            "two tool waits of 40 ms"
        );
    }
}

/// The Responses backend measures the mock's timing as chat does: TTFT and TPOT agree
/// within 2 ms on the same plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_chat_time_the_same_mock_alike() {
    let _guard = SERIAL.lock().await;
    let plan = planned(&[
        "--backend",
        "chat",
        "--workload",
        "random",
        "--random-input-len",
        "20",
        "--random-output-len",
        "12",
        "--rate",
        "30",
        "--num-prompts",
        "60",
        "--seed",
        "5",
    ]);
    let cfg = MockConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(4),
        ..MockConfig::default()
    };
    let chat = against_mock(cfg.clone(), plan.clone(), Backend::Chat).await;
    let responses = against_mock(cfg, plan, Backend::Responses).await;
    for out in [&chat, &responses] {
        assert_eq!(out.metrics.completed, 60);
        assert!(out.records.iter().all(|r| r.output_tokens == 12));
    }
    let (a, b) = (&chat.metrics, &responses.metrics);
    assert!(
        (a.ttft.mean - b.ttft.mean).abs() < 2.0 && (a.ttft.p50 - b.ttft.p50).abs() < 2.0,
        "TTFT chat {:.2} / responses {:.2} ms",
        a.ttft.mean,
        b.ttft.mean
    );
    assert!(
        (a.tpot.mean - b.tpot.mean).abs() < 2.0,
        "TPOT chat {:.2} / responses {:.2} ms",
        a.tpot.mean,
        b.tpot.mean
    );
    // Both near the mock's own timing: TTFT 30 ms, 4 ms per token after the first.
    assert!((30.0..34.0).contains(&b.ttft.p50), "{}", b.ttft.p50);
    assert!((3.8..4.6).contains(&b.tpot.mean), "{}", b.tpot.mean);
}

/// A server that never calls a tool still gives sessions (one turn each, completed), and the
/// report says no turn called one; a call whose arguments do not parse ends its session as
/// failed, the turn recorded with a `tool_call` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_calls_and_unusable_calls_end_sessions() {
    let _guard = SERIAL.lock().await;
    let quiet = MockConfig {
        ttft: Duration::from_millis(3),
        itl: Duration::from_millis(1),
        tool_turns: 0,
        ..MockConfig::default()
    };
    let out = against_mock(quiet, agentic_plan("chat", 6, 10), Backend::Chat).await;
    assert_eq!(out.records.len(), 6);
    let sessions = out.summary.sessions.as_ref().unwrap();
    assert_eq!(sessions.ended.get("completed"), Some(&6));
    let tools = sessions.tools.as_ref().unwrap();
    assert_eq!((tools.turns, tools.turns_with_calls), (6, 0));

    let broken = MockConfig {
        ttft: Duration::from_millis(3),
        itl: Duration::from_millis(1),
        tool_arguments: Some(r#"{"query": "unfinished"#.into()),
        ..MockConfig::default()
    };
    for backend in [Backend::Chat, Backend::Responses] {
        let out = against_mock(broken.clone(), agentic_plan(backend.name(), 6, 10), backend).await;
        assert_eq!(
            out.records.len(),
            6,
            "{backend:?}: each session ends at turn 1"
        );
        for r in &out.records {
            let error = r.error.as_ref().unwrap();
            assert_eq!(error.kind, ErrorKind::ToolCall);
            assert!(error.message.contains("do not parse"), "{}", error.message);
            assert_eq!(r.session.unwrap().end, Some(SessionEnd::Failed));
        }
        let tools = out
            .summary
            .sessions
            .as_ref()
            .unwrap()
            .tools
            .clone()
            .unwrap();
        assert_eq!(tools.unusable_calls, 6);
    }
}

/// With `--tool-choice required` each session's first turn requires a call; later turns
/// are `auto`. A session still calling at --max-session-turns ends capped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_first_call_and_the_turn_cap() {
    let _guard = SERIAL.lock().await;
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let cfg = MockConfig {
        ttft: Duration::from_millis(3),
        itl: Duration::from_millis(1),
        tool_turns: 10,
        bodies: Some(bodies.clone()),
        ..MockConfig::default()
    };
    let plan = planned(&[
        "--backend",
        "chat",
        "--workload",
        "agentic",
        "--tool-choice",
        "required",
        "--max-session-turns",
        "3",
        "--tool-latency",
        "constant:5ms",
        "--max-input-len",
        "20",
        "--max-output-len",
        "20",
        "--prefix-len",
        "20",
        "--rate",
        "20",
        "--num-prompts",
        "4",
    ]);
    let out = against_mock(cfg, plan, Backend::Chat).await;
    assert_eq!(out.records.len(), 12);
    let bodies = bodies_by_id(&bodies);
    for r in &out.records {
        let s = r.session.unwrap();
        let choice = if s.turn == 1 { "required" } else { "auto" };
        assert_eq!(bodies[&r.id]["tool_choice"], choice);
        assert!(bodies[&r.id].get("ignore_eos").is_none());
        assert_eq!(s.end.is_some(), s.turn == 3);
    }
    let sessions = out.summary.sessions.as_ref().unwrap();
    assert_eq!(sessions.ended.get("capped"), Some(&4));
}

#[test]
fn agentic_options_are_checked_before_the_run() {
    for (argv, reason) in [
        (
            &["--workload", "agentic"][..],
            "needs --backend chat or responses",
        ),
        (
            &["--workload", "agentic", "--backend", "tgi"][..],
            "needs --backend chat or responses",
        ),
        (
            &["--workload", "agentic", "--backend", "chat", "--turns", "3"][..],
            "--turns shapes chat sessions",
        ),
        (
            &[
                "--workload",
                "agentic",
                "--backend",
                "chat",
                "--think-time",
                "1s",
            ][..],
            "--think-time shapes chat sessions",
        ),
        (
            &["--backend", "chat", "--tool-latency", "1s"][..],
            "give --workload agentic",
        ),
        (
            &[
                "--workload",
                "agentic",
                "--backend",
                "chat",
                "--tool-latency",
                "soon",
            ][..],
            "--tool-latency `soon`",
        ),
        (
            &[
                "--workload",
                "agentic",
                "--backend",
                "responses",
                "--min-tokens",
            ][..],
            "--min-tokens",
        ),
        (
            &[
                "--workload",
                "agentic",
                "--backend",
                "chat",
                "--concurrency",
                "2",
            ][..],
            "closed loop of sessions",
        ),
    ] {
        let e = refused(argv);
        assert!(e.contains(reason), "{argv:?}: {e}");
    }
    // Sessions of chat turns run on the Responses API too.
    let plan = planned(&[
        "--backend",
        "responses",
        "--turns",
        "constant:2",
        "--num-prompts",
        "3",
    ]);
    assert_eq!(plan.requests.len(), 6);
}
