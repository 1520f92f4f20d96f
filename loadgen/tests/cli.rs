//! The `loadgen` binary end to end against the in-process mock: run folder contents,
//! trace replay timing, and SIGTERM mid-run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loadgen::mock::{self, MockConfig};
use reports::records::{read_meta, read_records, ErrorKind, Phase};
use reports::summary::Summary;

fn loadgen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_writes_folder_and_replays_trace_times() {
    let (addr, handle) = mock::spawn(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/example.jsonl");
    let status = loadgen()
        .args([
            "run",
            "--url",
            &format!("http://{addr}"),
            "--workload",
            "trace",
            "--arrival",
            "trace",
        ])
        .arg("--trace")
        .arg(&trace)
        .args(["--time-scale", "2", "--seed", "3", "--no-progress", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    handle.shutdown().await;
    assert!(status.success());
    // Trace times 0, 250, 250, 1000.5, 1800 ms replayed twice as fast, exactly.
    let schedule = std::fs::read_to_string(out.join("schedule.jsonl")).unwrap();
    let at: Vec<f64> = schedule
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["at_ms"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(at, vec![0.0, 125.0, 125.0, 500.25, 900.0]);
    let records = read_records(&out.join("records.jsonl")).unwrap();
    assert_eq!(records.len(), 5);
    assert_eq!(records[1].prefix_group, Some(1));
    assert_eq!(
        records.iter().map(|r| r.output_tokens).sum::<u64>(),
        64 + 32 + 16 + 128 + 8
    );
    let meta = read_meta(&out.join("meta.json")).unwrap();
    assert_eq!(meta.model, "loadgen-mock");
    assert!(meta.approximate_lengths);
    assert!(meta.host.cores > 0);
    assert_eq!(meta.seed, 3);
    let summary = Summary::read(&out.join("summary.json")).unwrap();
    assert!(!summary.incomplete);
    assert_eq!(summary.completed, 5);
    // The run over time: every request once, in the slice where it finished.
    let timeline = reports::timeline::Timeline::read(&out).unwrap().unwrap();
    assert_eq!(timeline.slices.iter().map(|s| s.finished).sum::<u64>(), 5);
    assert_eq!(timeline.slices.iter().map(|s| s.started).sum::<u64>(), 5);
    let measured: u64 = timeline
        .slices
        .iter()
        .filter_map(|s| s.finished_by_phase.get("measured"))
        .sum();
    assert_eq!(measured, 5);
    assert_eq!(
        timeline.slices.iter().map(|s| s.output_tokens).sum::<u64>(),
        records.iter().map(|r| r.output_tokens).sum::<u64>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_finished_records_and_marks_summary_incomplete() {
    let (addr, handle) = mock::spawn(MockConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut child = loadgen()
        .args([
            "run",
            "--url",
            &format!("http://{addr}"),
            "--model",
            "loadgen-mock",
        ])
        .args([
            "--workload",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            "32",
        ])
        .args([
            "--rate",
            "20",
            "--duration",
            "60s",
            "--no-progress",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let meta = read_meta(&out.join("meta.json")).expect("meta.json is written when the run starts");
    assert!(
        !meta.complete,
        "the start copy of meta.json says the run is not over"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "loadgen did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    handle.shutdown().await;
    assert!(status.success(), "{status:?}");
    let records = read_records(&out.join("records.jsonl")).unwrap();
    let summary = Summary::read(&out.join("summary.json")).unwrap();
    assert!(summary.incomplete);
    assert!(records.len() >= 10, "only {} records", records.len());
    assert_eq!(
        records.len() as u64,
        summary.completed + summary.failed + summary.excluded_outside_window + summary.interrupted
    );
    assert_eq!(summary.failed, 0);
    assert!(
        summary.unfinished > 1000,
        "the rest of the 60 s schedule was not sent"
    );
    assert!(read_meta(&out.join("meta.json")).unwrap().complete);
    // Requests in flight at SIGTERM are records too, with what had arrived.
    let interrupted: Vec<_> = records
        .iter()
        .filter(|r| r.phase == Phase::Interrupted)
        .collect();
    assert!(!interrupted.is_empty(), "no in-flight request was recorded");
    assert_eq!(summary.interrupted, interrupted.len() as u64);
    for r in &interrupted {
        assert_eq!(
            r.error.as_ref().map(|e| e.kind),
            Some(ErrorKind::Interrupted)
        );
        assert!(r.output_tokens < 32);
    }
    assert!(
        interrupted.iter().any(|r| !r.chunk_ms.is_empty()),
        "partial timings kept"
    );
}

/// `--extra-body` is sent with every request and recorded in `meta.json`; a field loadgen
/// sets itself is refused with its reason before anything is sent or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_body_is_sent_and_recorded_and_a_refused_field_sends_nothing() {
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (addr, handle) = mock::spawn(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        reasoning_tokens: 2,
        bodies: Some(bodies.clone()),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &str, out: &Path| {
        loadgen()
            .args([
                "run",
                "--url",
                &format!("http://{addr}"),
                "--backend",
                "chat",
            ])
            .args([
                "--workload",
                "random",
                "--random-input-len",
                "8",
                "--random-output-len",
                "4",
            ])
            .args([
                "--num-prompts",
                "3",
                "--rate",
                "50",
                "--no-progress",
                "--extra-body",
                extra,
            ])
            .arg("--out")
            .arg(out)
            .stdout(Stdio::null())
            .output()
            .unwrap()
    };
    let out = dir.path().join("run");
    let thinking_off = r#"{"chat_template_kwargs": {"enable_thinking": false}}"#;
    let done = run(thinking_off, &out);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    {
        let bodies = bodies.lock().unwrap();
        assert_eq!(bodies.len(), 3);
        assert!(bodies
            .iter()
            .all(|(_, b)| b["chat_template_kwargs"]["enable_thinking"] == false));
    }
    let meta = read_meta(&out.join("meta.json")).unwrap();
    assert_eq!(
        meta.extra_body,
        Some(serde_json::from_str(thinking_off).unwrap())
    );
    // The mock, a reasoning model, honours the thinking switch: no reasoning, and the answer
    // starts at the first token. With thinking on it reasons for 2 of the 4 tokens.
    let summary = Summary::read(&out.join("summary.json")).unwrap();
    assert_eq!(summary.total_reasoning_tokens, 0);
    assert_eq!(
        summary.metrics["time_to_first_answer"],
        summary.metrics["ttft"]
    );
    let thinking = dir.path().join("thinking");
    let done = run(
        r#"{"chat_template_kwargs": {"enable_thinking": true}}"#,
        &thinking,
    );
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let summary = Summary::read(&thinking.join("summary.json")).unwrap();
    assert_eq!(summary.total_reasoning_tokens, 6);
    assert!(summary.median_time_to_first_answer_ms > summary.median_ttft_ms);

    let refused = dir.path().join("refused");
    let failed = run(r#"{"max_tokens": 7}"#, &refused);
    handle.shutdown().await;
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("field `max_tokens` is refused") && stderr.contains("--max-output-len"),
        "{stderr}"
    );
    assert_eq!(bodies.lock().unwrap().len(), 6, "nothing more was sent");
    assert!(!refused.exists(), "nothing was written");
}

/// Exit codes to gate on: 3 when the run's SLO is not met, 5 when its percentile is
/// unbounded by the sample, 0 when met; 4 when `compare --fail-on-regression` calls B
/// slower, 0 for an A/A comparison.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_gate_on_slos_and_regressions() {
    let fast = |ttft_ms: u64| MockConfig {
        ttft: Duration::from_millis(ttft_ms),
        itl: Duration::from_millis(1),
        ..MockConfig::default()
    };
    let (a_addr, a) = mock::spawn(fast(20)).await.unwrap();
    let (b_addr, b) = mock::spawn(fast(40)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = |addr: std::net::SocketAddr, out: &Path, extra: &[&str]| {
        loadgen()
            .args([
                "run",
                "--url",
                &format!("http://{addr}"),
                "--workload",
                "random",
            ])
            .args([
                "--random-input-len",
                "8",
                "--random-output-len",
                "4",
                "--rate",
                "100",
            ])
            .args([
                "--num-prompts",
                "60",
                "--seed",
                "1",
                "--no-progress",
                "--out",
            ])
            .arg(out)
            .args(extra)
            .stdout(Stdio::null())
            .output()
            .unwrap()
    };
    let code = |o: &std::process::Output| o.status.code().unwrap();
    let slo = |spec: &str, out: &str| {
        run(
            a_addr,
            &dir.path().join(out),
            &["--slo", spec, "--fail-on-slo"],
        )
    };
    // TTFT is about 20 ms: a 10 ms p50 is not met, 1 s is; 60 requests cannot bound a p99.
    let not_met = slo("ttft:p50:10ms", "not-met");
    assert_eq!(
        code(&not_met),
        3,
        "{}",
        String::from_utf8_lossy(&not_met.stderr)
    );
    assert!(String::from_utf8_lossy(&not_met.stderr).contains("SLO not met"));
    let unknown = slo("ttft:p99:1s", "unknown");
    assert_eq!(
        code(&unknown),
        5,
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("too few"));
    assert_eq!(code(&slo("ttft:p50:1s", "met")), 0);
    // The run's folder is written whatever the verdict.
    assert!(dir.path().join("not-met/summary.json").is_file());
    // A (20 ms) against B (40 ms) on the same schedule: B slower on TTFT.
    for (addr, name) in [(a_addr, "a1"), (a_addr, "a2"), (b_addr, "b")] {
        assert_eq!(code(&run(addr, &dir.path().join(name), &[])), 0);
    }
    let compare = |x: &str, y: &str, out: &str| {
        loadgen()
            .arg("compare")
            .arg(dir.path().join(x))
            .arg(dir.path().join(y))
            .args(["--fail-on-regression", "--metrics", "ttft", "--out"])
            .arg(dir.path().join(out))
            .stdout(Stdio::null())
            .output()
            .unwrap()
    };
    let regression = compare("a1", "b", "ab");
    assert_eq!(
        code(&regression),
        4,
        "{}",
        String::from_utf8_lossy(&regression.stderr)
    );
    assert!(String::from_utf8_lossy(&regression.stderr).contains("TTFT: B slower"));
    let same = compare("a1", "a2", "aa");
    assert_eq!(code(&same), 0, "{}", String::from_utf8_lossy(&same.stderr));
    a.shutdown().await;
    b.shutdown().await;
}

/// `sweep` sets each level's `--rate` (and `--target-rate` for a replayed trace) itself:
/// given by hand they are refused as usage errors naming the flag, not silently replaced.
#[test]
fn sweep_refuses_the_rates_its_levels_set() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value) in [("--rate", "5"), ("--target-rate", "3")] {
        let out = loadgen()
            .args(["sweep", flag, value, "--rates", "1,2", "--out"])
            .arg(dir.path().join("sweep"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{flag}: {stderr}");
        assert!(!dir.path().join("sweep").exists(), "{flag}: nothing ran");
    }
}

/// Options that the chosen `--rates` would not use are refused naming each, before anything
/// runs; a knee search needs an SLO to search for.
#[test]
fn sweep_refuses_options_its_rates_would_not_use() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &[
                "--rates",
                "1,2",
                "--precision",
                "0.05",
                "--probe-duration",
                "5s",
            ],
            &[
                "--precision is for --rates search",
                "--probe-duration is for --rates auto or search",
            ],
        ),
        (
            &["--rates", "auto", "--max-levels", "4", "--min-rate", "1"],
            &[
                "--max-levels is for --rates search",
                "--min-rate is for --rates search",
            ],
        ),
        (
            &[
                "--rates",
                "search",
                "--auto-fractions",
                "0.5,1",
                "--slo",
                "ttft:p90:1s",
            ],
            &["--auto-fractions is for --rates auto"],
        ),
        (&["--rates", "search"], &["--rates search", "give --slo"]),
    ];
    for (args, needles) in cases {
        let out = loadgen()
            .args(["sweep", "--url", "http://127.0.0.1:9"])
            .args(args)
            .arg("--out")
            .arg(dir.path().join("sweep"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {stderr}");
        }
        assert!(!dir.path().join("sweep").exists(), "{args:?}: nothing ran");
    }
}

/// `--repeats 0` is a usage error (exit 2) before anything runs; `--exact-rate` is refused
/// by flag where no factor can fix a rate: a trace replayed at its own timestamps, a closed
/// loop, sessions.
#[test]
fn repeats_and_exact_rate_refuse_what_they_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = loadgen()
        .args(["sweep", "--rates", "1,2", "--repeats", "0", "--out"])
        .arg(dir.path().join("sweep"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--repeats"));
    assert!(!dir.path().join("sweep").exists(), "nothing ran");
    let trace = dir.path().join("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 4, \"hash_ids\": [1]}\n\
         {\"timestamp\": 500, \"input_length\": 8, \"output_length\": 4, \"hash_ids\": [2]}\n",
    )
    .unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--workload", "trace", "--trace", trace.to_str().unwrap()],
            "--exact-rate with --arrival trace needs --target-rate",
        ),
        (
            &["--concurrency", "2"],
            "--exact-rate scales an open-loop schedule",
        ),
        (
            &["--turns", "3", "--backend", "chat"],
            "--exact-rate with --turns",
        ),
    ];
    for (args, message) in cases {
        let out = loadgen()
            .args(["run", "--url", "http://127.0.0.1:9", "--exact-rate"])
            .args(args)
            .arg("--out")
            .arg(dir.path().join("run"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// `loadgen report --csv`: a run's `records.csv` has one row per request and a sweep's
/// `levels.csv` one row per level, read back with Python's `csv` module (as pandas reads
/// them); two runs of a model mix compared offline give each class's table per side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_csv_has_one_row_per_request_and_per_level() {
    let (addr, handle) = mock::spawn(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let sweep = dir.path().join("sweep");
    let url = format!("http://{addr}");
    let common = [
        "--url",
        &url,
        "--backend",
        "chat",
        "--workload",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--model-mix",
        "a=1,b=1",
        "--seed",
        "2",
        "--no-progress",
    ];
    let status = loadgen()
        .arg("run")
        .args(common)
        .args(["--rate", "50", "--num-prompts", "12", "--out"])
        .arg(&run)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    // A second run of the same workload, for an offline comparison by class.
    let run_b = dir.path().join("run-b");
    let status = loadgen()
        .arg("run")
        .args(common)
        .args(["--rate", "50", "--num-prompts", "12", "--out"])
        .arg(&run_b)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let status = loadgen()
        .arg("sweep")
        .args(common)
        .args(["--rates", "20,40", "--duration", "1s", "--out"])
        .arg(&sweep)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    handle.shutdown().await;
    assert!(status.success());
    for folder in [&run, &sweep] {
        let status = loadgen()
            .args(["report", "--csv"])
            .arg(folder)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    }
    const READ: &str = r#"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
print(json.dumps({"rows": len(rows), "columns": list(rows[0].keys()), "first": rows[0]}))
"#;
    let read = |path: &Path| -> serde_json::Value {
        let out = Command::new("python3")
            .args(["-c", READ])
            .arg(path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let records = read(&run.join("records.csv"));
    assert_eq!(records["rows"], 12);
    let columns: Vec<&str> = records["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(
        &columns[..6],
        ["id", "phase", "class", "ttft_ms", "tpot_ms", "e2el_ms"]
    );
    for field in [
        "chunk_ms",
        "prompt_tokens",
        "server_timing.prefill_ms",
        "http_status",
    ] {
        assert!(columns.contains(&field), "{field} in {columns:?}");
    }
    let first = &records["first"];
    assert!(["a", "b"].contains(&first["class"].as_str().unwrap()));
    assert!(first["ttft_ms"].as_str().unwrap().parse::<f64>().unwrap() > 4.0);
    // Chunk times as space-separated numbers, as many as the output's chunks.
    assert_eq!(first["chunk_ms"].as_str().unwrap().split(' ').count(), 4);
    let levels = read(&sweep.join("levels.csv"));
    assert_eq!(levels["rows"], 2);
    let first = &levels["first"];
    assert_eq!(
        first["offered_rate"]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap(),
        20.0
    );
    assert!(
        first["ttft_p50_ms"]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 4.0
    );
    let level_dirs = std::fs::read_dir(&sweep)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("records.csv").is_file())
        .count();
    assert_eq!(level_dirs, 2, "each level's records.csv");
    // The comparison of the two runs gives each class's table on each side.
    let compared = dir.path().join("ab");
    let status = loadgen()
        .arg("compare")
        .arg(&run)
        .arg(&run_b)
        .arg("--out")
        .arg(&compared)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report = std::fs::read_to_string(compared.join("report.md")).unwrap();
    let section = &report[report.find("## By class").expect("a By class section")..];
    for row in [
        "| all | A | 12 |",
        "| all | B | 12 |",
        "| a | A |",
        "| b | B |",
    ] {
        assert!(section.contains(row), "{row} in {section}");
    }
}
