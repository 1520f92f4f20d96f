//! Online `loadgen compare --a-cmd … --b-cmd …`: the tool starts each side's server (the
//! `loadgen mock-server` binary) afresh for every round on a free port, waits for /health,
//! records its command line and version, runs the round and stops it. Then the offline
//! `loadgen compare DIR` on the same folder reproduces the verdicts.

use clap::Parser;
use loadgen::commands::compare::compare_command;
use loadgen::spec::compare::CompareArgs;
use reports::ab::Verdict;
use reports::folders::{round_dir, CompareFile, Side, COMPARE_FILE};
use reports::metrics::SloMetric;
use reports::records::read_meta;

#[derive(Parser)]
struct Compare {
    #[command(flatten)]
    args: CompareArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_starts_and_stops_each_server_per_round() {
    let bin = env!("CARGO_BIN_EXE_loadgen");
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("cmp");
    // A: `--port N` appended; B: `{port}` substituted, TTFT 50% longer.
    let a_cmd = format!("{bin} mock-server --ttft 20ms --itl 2ms");
    let b_cmd =
        format!("{bin} mock-server --port {{port}} --ttft 20ms --itl 2ms --ttft-factor 1.5");
    let args = Compare::try_parse_from([
        "compare",
        "--a-cmd",
        &a_cmd,
        "--b-cmd",
        &b_cmd,
        "--rounds",
        "2",
        "--server-timeout",
        "20s",
        "--workload",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        "8",
        "--rate",
        "50",
        "--warmup",
        "100ms",
        "--duration",
        "400ms",
        "--seed",
        "5",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    compare_command(args).await.unwrap();

    let file = CompareFile::read(&out.join(COMPARE_FILE)).unwrap();
    assert_eq!(file.a_rounds.len(), 2);
    assert_eq!(file.b_rounds.len(), 2);
    assert!(file.pair_by_id);
    let ttft = file
        .analysis
        .metrics
        .iter()
        .find(|m| m.metric == SloMetric::Ttft)
        .unwrap();
    assert_eq!(ttft.verdict, Verdict::BSlower, "{}", ttft.verdict_text());
    for (round, side) in [(0, Side::A), (0, Side::B), (1, Side::B), (1, Side::A)] {
        let dir = round_dir(&out, round, side);
        let meta = read_meta(&dir.join("meta.json")).unwrap();
        let command = meta.extra["server_command"].as_str().unwrap();
        assert!(command.starts_with(bin), "{command}");
        assert!(!command.contains("{port}"), "{command}");
        let port = meta.url.rsplit(':').next().unwrap();
        assert!(
            command.contains(&format!("--port {port}")),
            "{command} vs {}",
            meta.url
        );
        assert_eq!(
            meta.server_version.as_deref(),
            Some(concat!("loadgen-mock ", env!("CARGO_PKG_VERSION")))
        );
        assert_eq!(meta.extra["server_models"]["data"][0]["id"], "loadgen-mock");
        assert_eq!(meta.extra["ab_order"], "A B B A");
        assert!(dir.join("server.log").is_file());
    }
    // Each round ran on its own server start: the ports differ between a side's rounds or the
    // server was restarted on the same port; either way the server of round 0 is gone.
    let a0 = read_meta(&round_dir(&out, 0, Side::A).join("meta.json")).unwrap();
    assert!(
        reqwest::get(format!("{}/health", a0.url)).await.is_err(),
        "server A of round 0 still up"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("mock-server --ttft 20ms --itl 2ms --port"));

    // Offline re-analysis of the same folder gives the same verdicts.
    let again = temp.path().join("again");
    let args = Compare::try_parse_from([
        "compare",
        out.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    compare_command(args).await.unwrap();
    let offline = CompareFile::read(&again.join(COMPARE_FILE)).unwrap();
    assert_eq!(offline.analysis, file.analysis);

    // A side whose requests carried another --extra-body did not send the same requests:
    // its rounds are not paired with A's by id.
    let b1 = round_dir(&out, 1, Side::B).join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&b1).unwrap()).unwrap();
    meta["extra_body"] = serde_json::json!({"chat_template_kwargs": {"enable_thinking": false}});
    std::fs::write(&b1, meta.to_string()).unwrap();
    let unpaired = temp.path().join("unpaired");
    let args = Compare::try_parse_from([
        "compare",
        out.to_str().unwrap(),
        "--out",
        unpaired.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    compare_command(args).await.unwrap();
    assert!(
        !CompareFile::read(&unpaired.join(COMPARE_FILE))
            .unwrap()
            .pair_by_id
    );
}

/// A/A between two `loadgen mock-server` processes with the same timing: no metric is
/// called slower or faster, and the terminal words are the four verdict words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_server_processes_are_never_slower_or_faster() {
    let bin = env!("CARGO_BIN_EXE_loadgen");
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("aa");
    let cmd = format!("{bin} mock-server --ttft 20ms --itl 2ms");
    let args = Compare::try_parse_from([
        "compare",
        "--a-cmd",
        &cmd,
        "--b-cmd",
        &cmd,
        "--rounds",
        "2",
        "--server-timeout",
        "20s",
        "--workload",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        "8",
        "--rate",
        "50",
        "--warmup",
        "100ms",
        "--duration",
        "600ms",
        "--seed",
        "9",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    compare_command(args).await.unwrap();
    let file = CompareFile::read(&out.join(COMPARE_FILE)).unwrap();
    for m in &file.analysis.metrics {
        assert!(
            matches!(m.verdict, Verdict::Equivalent | Verdict::Inconclusive),
            "{:?}: {}",
            m.metric,
            m.verdict_text()
        );
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(!html.contains("no significant difference"));
    assert!(html.contains("margin ±"));
}
