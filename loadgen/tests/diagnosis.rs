//! Every run folder's `summary.json` says what limited the run (`regime`, `regime_evidence`)
//! with the bandwidth bound beside the measurement, from the bound's inputs on the command
//! line; without them the diagnosis names what was missing.

use clap::Parser;
use loadgen::mock::{self, MockConfig};
use reports::diagnosis::Regime;
use reports::summary::Summary;
use std::time::Duration;

/// The mock of these tests: 5 ms between tokens, 20 ms to the first, so decode dominates.
async fn decode_heavy_mock() -> (std::net::SocketAddr, mock::MockHandle) {
    mock::spawn(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        ..MockConfig::default()
    })
    .await
    .unwrap()
}

/// `loadgen run` against `url` at 20 req/s for `duration` into `out`, then `extra`.
fn run_argv(url: &str, duration: &str, out: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> = [
        "loadgen",
        "run",
        "--url",
        url,
        "--model",
        "loadgen-mock",
        "--workload",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "17",
        "--rate",
        "20",
        "--duration",
        duration,
        "--seed",
        "3",
        "--scrape-interval",
        "0s",
        "--no-progress",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.push(out.to_str().unwrap().to_string());
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv
}

async fn run(extra: &[&str]) -> Summary {
    let (addr, handle) = decode_heavy_mock().await;
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("run");
    let argv = run_argv(&format!("http://{addr}"), "2s", &out, extra);
    loadgen::cli::main(loadgen::cli::Cli::try_parse_from(argv).unwrap())
        .await
        .unwrap();
    handle.shutdown().await;
    Summary::read(&out.join("summary.json")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_near_its_bound_is_memory_bound_and_the_bound_is_beside_it() {
    // 4 GB a step at 1 TB/s: 4 ms plus the KV (a few hundred sequences' worth of 1 kB a
    // token, negligible); the mock's TPOT is 5 ms, 1.25× the bound.
    let summary = run(&[
        "--weight-bytes",
        "4e9",
        "--kv-bytes-per-token",
        "1000",
        "--bandwidth",
        "1e12",
    ])
    .await;
    assert_eq!(
        summary.regime,
        Some(Regime::DecodeMemoryBound),
        "{:?}",
        summary.diagnosis
    );
    let d = summary.diagnosis.unwrap();
    let bound = d.bound.unwrap();
    assert!((bound.tpot_ms - 4.0).abs() < 0.01, "{bound:?}");
    let ratio = d.tpot_over_bound.unwrap();
    assert!((1.2..1.35).contains(&ratio), "{ratio}");
    assert!(summary
        .regime_evidence
        .unwrap()
        .contains("the bandwidth bound of 4.00 ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_bounds_inputs_the_regime_is_undetermined_and_says_why() {
    let summary = run(&[]).await;
    assert_eq!(summary.regime, Some(Regime::Undetermined));
    let d = summary.diagnosis.unwrap();
    assert!(
        d.missing.iter().any(|m| m.contains("memory bandwidth")),
        "{:?}",
        d.missing
    );
    assert!(
        d.missing.iter().any(|m| m.contains("gauges")),
        "{:?}",
        d.missing
    );
}

/// A server that goes away a second into a 3-s run reads as server-errors (not as queueing,
/// which its refusals would otherwise suggest), and the printed summary ends with the failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_gone_mid_run_reads_as_server_errors() {
    let (addr, handle) = decode_heavy_mock().await;
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("run");
    let argv = run_argv(&format!("http://{addr}"), "3s", &out, &[]);
    let run = tokio::spawn(async move {
        loadgen::cli::main(loadgen::cli::Cli::try_parse_from(argv).unwrap()).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.shutdown().await;
    run.await.unwrap().unwrap();
    let summary = Summary::read(&out.join("summary.json")).unwrap();
    assert_eq!(
        summary.regime,
        Some(Regime::ServerErrors),
        "{:?}",
        summary.regime_evidence
    );
    assert!(
        summary.failed as f64 >= 0.05 * (summary.failed + summary.completed) as f64,
        "{} failed, {} completed",
        summary.failed,
        summary.completed
    );
    let table = reports::table::render(&summary);
    let last = table.lines().rev().nth(1).unwrap();
    assert!(
        last.starts_with("FAILED:") && last.contains(&format!("{} of ", summary.failed)),
        "{table}"
    );
}

/// The mock answers with its own timing (its slot wait as `queue_ms`): every success carries
/// it in `records.jsonl`, a one-slot mock at twice its capacity makes requests wait, and the
/// client–server gap (E2E less the mock's queue, first chunk and decode) stays small and
/// positive on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_timing_reaches_the_records_and_the_gap() {
    let (addr, handle) = mock::spawn(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        slots: 1,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("run");
    let argv = run_argv(&format!("http://{addr}"), "1s", &out, &[]);
    loadgen::cli::main(loadgen::cli::Cli::try_parse_from(argv).unwrap())
        .await
        .unwrap();
    handle.shutdown().await;
    let records = reports::records::read_records(&out.join("records.jsonl")).unwrap();
    let timed: Vec<_> = records
        .iter()
        .filter(|r| r.is_success())
        .map(|r| r.server_timing.expect("the mock says its timing"))
        .collect();
    assert!(!timed.is_empty());
    // 16 chunks after the first, 5 ms apart.
    assert!(timed
        .iter()
        .all(|t| (t.decode_ms - 80.0).abs() < 1e-6 && (t.prefill_ms - 20.0).abs() < 1e-6));
    assert!(
        timed.iter().filter(|t| t.queue_ms.unwrap() > 50.0).count() > timed.len() / 2,
        "one slot of 100 ms at 20 req/s: most wait"
    );
    let summary = Summary::read(&out.join("summary.json")).unwrap();
    let gap = summary.metrics["client_server_gap"];
    assert_eq!(gap.count, summary.completed);
    assert!(gap.p50 >= 0.0 && gap.p50 < 20.0, "{gap:?}");
}
