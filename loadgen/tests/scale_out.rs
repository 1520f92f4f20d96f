//! One seeded schedule sent by K = 3 `loadgen` processes (`--shard I/3 --start-at T`) against
//! a `loadgen mock-server` process that logs each request's arrival, then `loadgen merge`:
//! every scheduled id once, arrivals on time, the merged schedule Poisson at the full rate,
//! and the merged latencies those of one process sending the same schedule. The tests of
//! this file run one at a time (they share two cores and measure timing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reports::records::{read_meta, read_records};
use reports::summary::Summary;
use statrs::distribution::{ContinuousCDF, Exp};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const RATE: f64 = 150.0;

fn loadgen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `loadgen mock-server` on a free port, logging arrivals to `log`; killed on drop.
struct MockProcess {
    child: Child,
    url: String,
}

impl MockProcess {
    fn start(log: &Path) -> MockProcess {
        let port = free_port();
        let child = loadgen()
            .args(["mock-server", "--port", &port.to_string()])
            .args(["--ttft", "50ms", "--itl", "10ms", "--arrival-log"])
            .arg(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the mock did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        MockProcess {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The same schedule for every worker: Poisson at [`RATE`], 1 s warm-up + 8 s measured.
fn schedule_args(url: &str) -> Vec<String> {
    [
        "run",
        "--url",
        url,
        "--rate",
        &RATE.to_string(),
        "--warmup",
        "1s",
        "--duration",
        "8s",
        "--workload",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--seed",
        "11",
        "--no-progress",
        "--scrape-interval",
        "0s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts K workers (`loadgen ARGS --shard i/K --start-at start --out dir/shard-i`) and
/// waits for them.
fn run_shards(args: &[String], k: u64, start: f64, dir: &Path) -> Vec<PathBuf> {
    let workers: Vec<(PathBuf, Child)> = (0..k)
        .map(|i| {
            let out = dir.join(format!("shard-{i}"));
            let child = loadgen()
                .args(args)
                .args(["--shard", &format!("{i}/{k}"), "--start-at"])
                .arg(format!("{start:.6}"))
                .arg("--out")
                .arg(&out)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (out, child)
        })
        .collect();
    workers
        .into_iter()
        .enumerate()
        .map(|(i, (out, child))| {
            ok(
                child.wait_with_output().unwrap(),
                &format!("{} shard {i}", args[0]),
            );
            out
        })
        .collect()
}

fn merge(dirs: &[PathBuf], out: &Path) -> Output {
    loadgen()
        .arg("merge")
        .args(dirs)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[test]
fn three_shards_send_one_schedule_and_merge_into_one_run() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("arrivals.jsonl");
    let mock = MockProcess::start(&log);
    let args = schedule_args(&mock.url);
    let start = unix_s(SystemTime::now()) + 5.0;
    let shards = run_shards(&args, 3, start, dir.path());
    let merged = dir.path().join("merged");
    let out = ok(merge(&shards, &merged), "loadgen merge");
    assert!(String::from_utf8_lossy(&out.stdout).contains("report"));

    // Every scheduled id exactly once, in the schedule and in the records.
    let schedule: BTreeMap<u64, f64> = std::fs::read_to_string(merged.join("schedule.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["id"].as_u64().unwrap(), v["at_ms"].as_f64().unwrap())
        })
        .collect();
    let n = schedule.len() as u64;
    assert!(n > 1000, "{n} requests for 9 s at 150 req/s");
    assert_eq!(
        schedule.keys().copied().collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    let records = read_records(&merged.join("records.jsonl")).unwrap();
    assert_eq!(
        records.iter().map(|r| r.id).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    assert!(records.iter().all(|r| r.is_success()));
    let meta = read_meta(&merged.join("meta.json")).unwrap();
    assert_eq!(meta.planned_requests, n);
    assert_eq!(meta.merged_from.len(), 3);
    // The merged timeline is the one a single process would build from the same records,
    // in the shards' slices; its counts add up phase by phase.
    let timeline = reports::timeline::Timeline::read(&merged).unwrap().unwrap();
    let origin = chrono::DateTime::parse_from_rfc3339(&meta.start_time).unwrap();
    let rebuilt = reports::timeline::build(
        &records,
        timeline.phases,
        Some(timeline.slice_s),
        &[],
        origin.timestamp_micros() as f64 / 1000.0,
    );
    assert_eq!(timeline, rebuilt);
    for phase in ["warmup", "measured"] {
        let in_slices: u64 = timeline
            .slices
            .iter()
            .filter_map(|s| s.finished_by_phase.get(phase))
            .sum();
        let in_run = records
            .iter()
            .filter(|r| serde_json::to_value(r.phase).unwrap() == phase)
            .count() as u64;
        assert_eq!(in_slices, in_run, "{phase}");
    }
    assert!(meta.merged_from.iter().all(|s| s.shard.count == 3));

    // The shards keep one timetable: 90% of the requests reached the mock within 2 ms of
    // their scheduled instant. A shard off the timetable by more puts a third of them beyond
    // (p90 fails); the last percent is the scheduling noise of four processes sharing two
    // cores (p99 read 0.3–3 ms, before and after the kernel's arrival stamps), printed only.
    let mut late_ms: Vec<f64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = v["id"].as_u64().unwrap();
            let arrival = v["arrival_unix_us"].as_f64().unwrap() / 1e6;
            (arrival - start) * 1000.0 - schedule[&id]
        })
        .collect();
    assert_eq!(late_ms.len() as u64, n, "the mock saw every request once");
    late_ms.sort_by(f64::total_cmp);
    let p90 = quantile(&late_ms, 0.9);
    eprintln!(
        "arrival after the scheduled instant: p50 {:.3} ms, p90 {p90:.3} ms, p99 {:.3} ms, \
         max {:.3} ms",
        quantile(&late_ms, 0.5),
        quantile(&late_ms, 0.99),
        late_ms[late_ms.len() - 1]
    );
    assert!(
        late_ms[0] > -0.5,
        "a request arrived before its time: {}",
        late_ms[0]
    );
    assert!(
        p90 <= 2.0,
        "arrival p90 {p90:.3} ms after the scheduled instant"
    );

    // The merged schedule's gaps are exponential at the full rate (KS, α = 0.01).
    let times: Vec<f64> = schedule.values().map(|t| t / 1000.0).collect();
    let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_by(f64::total_cmp);
    let exp = Exp::new(RATE).unwrap();
    let m = gaps.len() as f64;
    let d = gaps
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            let f = exp.cdf(g);
            (f - i as f64 / m).abs().max((f - (i + 1) as f64 / m).abs())
        })
        .fold(0.0, f64::max);
    assert!(d < 1.628 / m.sqrt(), "KS D = {d:.4} for {m} gaps");

    // One process sending the same schedule measures the same latencies.
    let single = dir.path().join("single");
    ok(
        loadgen()
            .args(&args)
            .arg("--out")
            .arg(&single)
            .output()
            .unwrap(),
        "single-process run",
    );
    let a = Summary::read(&single.join("summary.json")).unwrap();
    let b = Summary::read(&merged.join("summary.json")).unwrap();
    assert_eq!(a.completed, b.completed);
    let (ta, tb) = (&a.metrics["ttft"], &b.metrics["ttft"]);
    eprintln!(
        "TTFT p50 {:.3} / {:.3} ms, p99 {:.3} / {:.3} ms (one process / merged)",
        ta.p50, tb.p50, ta.p99, tb.p99
    );
    assert!((ta.p50 - tb.p50).abs() <= 1.0);
    // The two runs are separate processes at different moments: on 2 busy cores one p99 of
    // 1,374 requests met a 4.2 ms scheduling spike the other did not (56.9 / 52.7 ms in a CI
    // run; 52.4 / 52.4 ms on a quiet machine). A merge that lost or double-counted records
    // moves it by far more.
    assert!((ta.p99 - tb.p99).abs() <= 10.0);
}

#[test]
fn merge_refuses_what_is_not_one_schedule_and_late_workers_refuse_to_send() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mock = MockProcess::start(&dir.path().join("arrivals.jsonl"));
    let mut args = schedule_args(&mock.url);
    // 40 requests at 150 req/s, those of the first 100 ms as warm-up.
    args.extend(["--num-prompts".to_string(), "40".to_string()]);
    let i = args.iter().position(|a| a == "--duration").unwrap();
    args.drain(i..i + 2);
    let w = args.iter().position(|a| a == "--warmup").unwrap();
    args[w + 1] = "100ms".into();
    let start = unix_s(SystemTime::now()) + 4.0;
    let shards = run_shards(&args, 3, start, dir.path());
    let err = |out: Output| {
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = err(merge(&shards[..2], &dir.path().join("m1")));
    assert!(e.contains("shard 2/3 is missing"), "{e}");
    let twice = [shards[0].clone(), shards[0].clone(), shards[1].clone()];
    let e = err(merge(&twice, &dir.path().join("m2")));
    assert!(e.contains("are both shard 0/3"), "{e}");
    // A worker of another seed is not a shard of this schedule.
    let other = dir.path().join("other");
    let mut other_args = args.clone();
    let s = other_args.iter().position(|a| a == "--seed").unwrap();
    other_args[s + 1] = "12".into();
    let later = unix_s(SystemTime::now()) + 4.0;
    let other_shards = run_shards(&other_args, 3, later, &other);
    let mixed = [
        shards[0].clone(),
        shards[1].clone(),
        other_shards[2].clone(),
    ];
    let e = err(merge(&mixed, &dir.path().join("m3")));
    assert!(e.contains("not shards of one schedule"), "{e}");
    // A shard sent with another --extra-body, or with other request options, is not one
    // of them either.
    let meta_path = shards[2].join("meta.json");
    let original = std::fs::read_to_string(&meta_path).unwrap();
    let mut meta: serde_json::Value = serde_json::from_str(&original).unwrap();
    meta["extra_body"] = serde_json::json!({"temperature": 0});
    std::fs::write(&meta_path, meta.to_string()).unwrap();
    let e = err(merge(&shards, &dir.path().join("m3")));
    assert!(
        e.contains("their extra request body (--extra-body) differ"),
        "{e}"
    );
    meta.as_object_mut().unwrap().remove("extra_body");
    meta["shard"]["schedule_digest"] = "0123456789abcdef".into();
    std::fs::write(&meta_path, meta.to_string()).unwrap();
    let e = err(merge(&shards, &dir.path().join("m3")));
    assert!(e.contains("their request options"), "{e}");
    std::fs::write(&meta_path, original).unwrap();
    // A warm-up record removed from a shard: the merge names the request without a record.
    let lines = std::fs::read_to_string(shards[1].join("records.jsonl")).unwrap();
    let all: Vec<&str> = lines.lines().collect();
    std::fs::write(shards[1].join("records.jsonl"), all[1..].join("\n")).unwrap();
    let e = err(merge(&shards, &dir.path().join("m4")));
    assert!(
        e.contains("shard-1: scheduled request 1 has no record"),
        "{e}"
    );
    // A measured record removed: the shard's histograms no longer match its records.
    std::fs::write(
        shards[1].join("records.jsonl"),
        all[..all.len() - 1].join("\n"),
    )
    .unwrap();
    let e = err(merge(&shards, &dir.path().join("m4")));
    assert!(
        e.contains("shard-1/histograms.hlog") && e.contains("differ"),
        "{e}"
    );
    std::fs::write(shards[1].join("records.jsonl"), lines).unwrap();
    // The output folder must be new.
    let e = err(merge(&shards, &shards[0]));
    assert!(e.contains("not empty"), "{e}");
    assert!(merge(&shards, &dir.path().join("m5")).status.success());
    // A worker started after the start instant sends nothing and says so.
    let out = loadgen()
        .args(&args)
        .args(["--shard", "0/3", "--start-at"])
        .arg(format!("{:.3}", unix_s(SystemTime::now()) - 1.0))
        .arg("--out")
        .arg(dir.path().join("late"))
        .output()
        .unwrap();
    let e = err(out);
    assert!(e.contains("ago") && e.contains("sends nothing"), "{e}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("late/records.jsonl")).unwrap_or_default(),
        ""
    );
}

#[test]
fn sharded_sweep_levels_follow_one_timetable_and_merge_level_by_level() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mock = MockProcess::start(&dir.path().join("arrivals.jsonl"));
    let start = unix_s(SystemTime::now()) + 4.0;
    let sweep: Vec<String> = [
        "sweep",
        "--rates",
        "20,40",
        "--level-period",
        "4s",
        "--url",
        &mock.url,
        "--duration",
        "2s",
        "--seed",
        "5",
        "--workload",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "4",
        "--no-progress",
        "--scrape-interval",
        "0s",
        "--slo",
        "ttft:p50:1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let dirs = run_shards(&sweep, 2, start, &dir.path().join("sweeps"));
    let merged = dir.path().join("merged");
    ok(merge(&dirs, &merged), "loadgen merge (sweeps)");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(merged.join("sweep.json")).unwrap()).unwrap();
    let levels = file["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (level, rate) in levels.iter().zip([20.0, 40.0]) {
        assert_eq!(level["offered_rate"], rate);
        assert_eq!(level["slo_met"], true);
        let run = merged.join(level["dir"].as_str().unwrap());
        let meta = read_meta(&run.join("meta.json")).unwrap();
        let records = read_records(&run.join("records.jsonl")).unwrap();
        let ids: Vec<u64> = records.iter().map(|r| r.id).collect();
        assert_eq!(ids, (0..meta.planned_requests).collect::<Vec<_>>());
        // Level i started at the start instant + i × the period, on both workers.
        let starts: Vec<&str> = meta
            .merged_from
            .iter()
            .map(|s| s.shard.start_at.as_str())
            .collect();
        assert_eq!(starts[0], starts[1]);
        let at = chrono::DateTime::parse_from_rfc3339(starts[0]).unwrap();
        let offset = at.timestamp_micros() as f64 / 1e6 - start;
        let expected = if rate == 20.0 { 0.0 } else { 4.0 };
        assert!(
            (offset - expected).abs() < 1e-3,
            "level at {rate}: {offset}"
        );
    }
    assert!(merged.join("report.html").is_file());
}

/// Two workers deal whole sessions between them (a session's turns follow its first turn's
/// worker), and `merge` keeps them whole: every session once, its turns in one shard,
/// capped sessions' unsent turns not missed.
#[test]
fn sharded_sessions_merge_whole() {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mock = MockProcess::start(&dir.path().join("arrivals.jsonl"));
    // 12 sessions of 3 turns: the mock counts words, 8 per user turn and 4 per answer, so
    // turn 3's prompt would be 32 > 25 and every session is capped after turn 2.
    let args: Vec<String> = [
        "run",
        "--url",
        &mock.url,
        "--backend",
        "chat",
        "--turns",
        "constant:3",
        "--think-time",
        "constant:20ms",
        "--max-history-tokens",
        "25",
        "--rate",
        "20",
        "--num-prompts",
        "12",
        "--workload",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--seed",
        "5",
        "--no-progress",
        "--scrape-interval",
        "0s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let start = unix_s(SystemTime::now()) + 4.0;
    let shards = run_shards(&args, 2, start, dir.path());
    let mut owner = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        for r in read_records(&shard.join("records.jsonl")).unwrap() {
            let s = r.session.unwrap();
            assert_eq!(
                s.session % 2,
                i as u64,
                "session {} on shard {i}",
                s.session
            );
            owner.insert((s.session, s.turn), i);
        }
    }
    let merged = dir.path().join("merged");
    ok(merge(&shards, &merged), "merge of sessions");
    let records = read_records(&merged.join("records.jsonl")).unwrap();
    assert_eq!(records.len(), 24, "12 sessions, 2 turns each");
    let mut turns: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for r in &records {
        let s = r.session.unwrap();
        turns.entry(s.session).or_default().push(s.turn);
        if s.turn == 2 {
            assert_eq!(s.end, Some(reports::records::SessionEnd::Capped));
        }
    }
    assert_eq!(turns.len(), 12);
    assert!(turns.values().all(|t| t == &[1, 2]), "{turns:?}");
    let summary = Summary::read(&merged.join("summary.json")).unwrap();
    assert_eq!(summary.sessions.unwrap().ended.get("capped"), Some(&12));
}
