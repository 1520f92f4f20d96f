//! Session traces replayed against the built-in mock, results by class, and a model mix:
//! a Bailian trace's linked turns go out as sessions (each turn at its recorded time, never
//! before the previous answer), classed by the trace's `type`; `--model-mix` asks for each
//! request's model and gives one class per model.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgen::load::plan::{ClassBy, Plan};
use loadgen::load::workload::prompt::PromptBuilder;
use loadgen::mock::{self, MockConfig};
use loadgen::run::send::{send_plan, RunOutcome, SendOptions};
use loadgen::wire::backend::Backend;
use loadgen::wire::target::Target;

fn planned(argv: &[&str]) -> Plan {
    let mut full = vec!["loadgen", "run"];
    full.extend_from_slice(argv);
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from(full).unwrap();
    let loadgen::cli::Command::Run(args) = cli.command else {
        unreachable!()
    };
    let spec = loadgen::spec::RunSpec::from_args(&args).unwrap();
    loadgen::run::prepare::prepare_run(&spec)
        .unwrap()
        .plan
        .as_ref()
        .clone()
}

fn refused(argv: &[&str]) -> String {
    let mut full = vec!["loadgen", "run"];
    full.extend_from_slice(argv);
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from(full).unwrap();
    let loadgen::cli::Command::Run(args) = cli.command else {
        unreachable!()
    };
    match loadgen::spec::RunSpec::from_args(&args) {
        Err(e) => format!("{e:#}"),
        Ok(spec) => format!(
            "{:#}",
            loadgen::run::prepare::prepare_run(&spec)
                .err()
                .expect("refused")
        ),
    }
}

async fn against_mock(cfg: MockConfig, plan: Plan, backend: Backend) -> RunOutcome {
    let (addr, handle) = mock::spawn(cfg).await.unwrap();
    let outcome = send_plan(
        Arc::new(plan),
        Target {
            base_url: format!("http://{addr}"),
            backend,
            model: "loadgen-mock".into(),
            headers: Vec::new(),
            api_key: None,
            timeout: Duration::from_secs(30),
            ignore_eos: true,
            min_tokens: false,
            prompt_ids: false,
            continuous_usage: true,
            extra_body: None,
            tls: None,
        },
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

fn sample(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces")
        .join(name)
        .display()
        .to_string()
}

/// The Bailian sample at 10× its pace against a mock whose answers take 50 ms + 30 ms a
/// token: each
/// later turn goes at its recorded time or, when the answer before it is still streaming,
/// right after it; 4 sessions (2 of several turns) complete, classed by `type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bailian_trace_replays_its_sessions_at_their_times() {
    let plan = planned(&[
        "--workload",
        "trace",
        "--trace",
        &sample("bailian-sample.jsonl"),
        "--time-scale",
        "10",
    ]);
    assert!(plan.recorded_sessions);
    assert_eq!(plan.class_by, ClassBy::Trace);
    let at: HashMap<u64, f64> = plan
        .requests
        .iter()
        .map(|r| (r.id, r.at_s.unwrap() * 1000.0))
        .collect();
    let cfg = MockConfig {
        ttft: Duration::from_millis(50),
        itl: Duration::from_millis(30),
        ..MockConfig::default()
    };
    let out = against_mock(cfg, plan, Backend::Completions).await;
    assert_eq!(out.records.len(), 7);
    assert!(out.records.iter().all(|r| r.is_success()));
    let by_id: HashMap<u64, &reports::records::RequestRecord> =
        out.records.iter().map(|r| (r.id, r)).collect();
    let mut waited_for_an_answer = 0;
    for r in &out.records {
        let s = r.session.unwrap();
        if s.turn == 1 {
            continue;
        }
        let prev = by_id[&(r.id - 1)];
        // Never before the previous answer ended, nor before its recorded time.
        assert!(r.sent_ms >= prev.end_ms - 0.5, "request {}", r.id);
        assert!(r.sent_ms >= at[&r.id] - 0.5, "request {}", r.id);
        let due = at[&r.id].max(prev.end_ms);
        assert!(
            r.sent_ms - due < 25.0,
            "request {}: {:.1} ms late",
            r.id,
            r.sent_ms - due
        );
        waited_for_an_answer += usize::from(prev.end_ms > at[&r.id]);
    }
    // Chat 200's second turn is due 100 ms after its first (1.0 → 2.0 s at 10×), before its
    // answer of 5 tokens ends (170 ms): it waited for the answer.
    assert!(waited_for_an_answer >= 1);
    let sessions = out.summary.sessions.as_ref().unwrap();
    assert_eq!(sessions.sessions, 4);
    assert_eq!(sessions.ended.get("completed"), Some(&4));
    let classes: Vec<(&str, u64)> = out
        .summary
        .classes
        .iter()
        .map(|c| (c.class.as_str(), c.requests))
        .collect();
    assert_eq!(
        classes,
        [("file", 1), ("image", 1), ("search", 2), ("text", 3)]
    );
}

/// `--model-mix` sends each request's model, drawn by weight from the seed, and the summary
/// has one class per model with its own numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_mix_reports_one_class_per_model() {
    let plan = planned(&[
        "--backend",
        "chat",
        "--workload",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--rate",
        "40",
        "--num-prompts",
        "200",
        "--model-mix",
        "base=0.7,lora-sql=0.3",
        "--seed",
        "4",
    ]);
    assert_eq!(plan.class_by, ClassBy::Model);
    let drawn = plan
        .requests
        .iter()
        .filter(|r| r.spec.model.as_deref() == Some("lora-sql"))
        .count();
    // Binomial(200, 0.3): 60 ± 6.5 (1 σ).
    assert!(
        (40..=80).contains(&drawn),
        "{drawn} of 200 ask for lora-sql"
    );
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let cfg = MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        bodies: Some(bodies.clone()),
        ..MockConfig::default()
    };
    let models: HashMap<u64, String> = plan
        .requests
        .iter()
        .map(|r| (r.id, r.spec.model.clone().unwrap()))
        .collect();
    let out = against_mock(cfg, plan, Backend::Chat).await;
    for (id, body) in bodies.lock().unwrap().iter() {
        assert_eq!(body["model"], models[&id.unwrap()].as_str());
    }
    let classes: Vec<(&str, u64)> = out
        .summary
        .classes
        .iter()
        .map(|c| (c.class.as_str(), c.requests))
        .collect();
    assert_eq!(
        classes,
        [("base", 200 - drawn as u64), ("lora-sql", drawn as u64)]
    );
    for c in &out.summary.classes {
        assert!(c.median_ttft_ms > 4.0 && c.metrics["ttft"].count == c.completed);
    }
}

#[test]
fn class_and_trace_options_are_checked() {
    for (argv, reason) in [
        (vec!["--class-by", "model"], "give --model-mix".to_string()),
        (
            vec!["--class-by", "turn"],
            "give --turns or --workload agentic".to_string(),
        ),
        (
            vec!["--class-by", "trace"],
            "no model or service column".to_string(),
        ),
        (
            vec!["--class-by", "prefix-group"],
            "no prefix groups".to_string(),
        ),
        (
            vec!["--model-mix", "a=1,a=2"],
            "names `a` twice".to_string(),
        ),
        (
            vec!["--model-mix", "a=0"],
            "a weight is positive".to_string(),
        ),
        (vec!["--model-mix", "a"], "expected NAME=WEIGHT".to_string()),
        (
            vec!["--backend", "tgi", "--model-mix", "a=1"],
            "TGI".to_string(),
        ),
        (
            vec![
                "--workload",
                "trace",
                "--trace",
                &sample("bailian-sample.jsonl"),
                "--concurrency",
                "2",
            ],
            "a closed loop sends single requests".to_string(),
        ),
        (
            vec![
                "--backend",
                "chat",
                "--workload",
                "trace",
                "--trace",
                &sample("bailian-sample.jsonl"),
                "--turns",
                "all",
            ],
            "links its own turns".to_string(),
        ),
        (
            vec![
                "--workload",
                "trace",
                "--trace",
                &sample("bailian-sample.jsonl"),
                "--num-prompts",
                "3",
            ],
            "replay whole".to_string(),
        ),
    ] {
        let e = refused(&argv);
        assert!(e.contains(&reason), "{argv:?}: {e}");
    }
}

/// The session plan of a trace: `--arrival poisson` starts sessions on the process with
/// each turn at its recorded offset; `--trace-window` keeps whole sessions, those whose
/// first turn is in it; sweeps and tune refuse the closed-loop probe.
#[test]
fn session_starts_windows_and_probes() {
    let trace = sample("bailian-sample.jsonl");
    let plan = planned(&[
        "--workload",
        "trace",
        "--trace",
        &trace,
        "--arrival",
        "poisson",
        "--rate",
        "2",
        "--seed",
        "5",
    ]);
    let turns: Vec<(u64, u32, f64)> = plan
        .requests
        .iter()
        .map(|r| {
            let t = r.session.unwrap();
            (t.session, t.turn, r.at_s.unwrap())
        })
        .collect();
    assert_eq!(turns.len(), 7);
    // Chat 100's turns keep their offsets, 3.5 s and 9.25 s after its first.
    let (s100, _, start) = turns[0];
    let offsets: Vec<f64> = turns
        .iter()
        .filter(|t| t.0 == s100)
        .map(|t| t.2 - start)
        .collect();
    assert!(
        (offsets[1] - 3.5).abs() < 1e-9 && (offsets[2] - 9.25).abs() < 1e-9,
        "{offsets:?}"
    );
    // Sessions start on the process, in the trace's order: 4 increasing starts.
    let starts: Vec<f64> = turns.iter().filter(|t| t.1 == 1).map(|t| t.2).collect();
    assert_eq!(starts.len(), 4);
    assert!(starts.windows(2).all(|w| w[0] < w[1]) && starts[0] > 0.0);

    let plan = planned(&[
        "--workload",
        "trace",
        "--trace",
        &trace,
        "--trace-window",
        "0.5:5",
    ]);
    let kept: Vec<(u32, f64)> = plan
        .requests
        .iter()
        .map(|r| (r.session.unwrap().turn, r.at_s.unwrap()))
        .collect();
    // Chats 200 (1 s, two turns) and 300 (4 s); not 100 (0 s) nor 401 (5 s); from 200's start.
    assert_eq!(kept, [(1, 0.0), (2, 1.0), (1, 3.0)]);

    for argv in [["sweep", "--rates", "auto"], ["sweep", "--rates", "search"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(argv)
            .args([
                "--workload",
                "trace",
                "--trace",
                &trace,
                "--slo",
                "ttft:p90:1s",
                "--out",
                "/nonexistent/x",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("closed loop of single requests"),
            "{argv:?}: {err}"
        );
    }
}
