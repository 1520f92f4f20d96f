//! `loadgen matrix` against the built-in mock of known timing (TTFT 40 ms, 5 ms per token):
//! true expectations are confirmed, false ones refuted, and one the sample cannot bound is
//! inconclusive; the bandwidth bound given on the matrix's command line reaches every row;
//! cost follows each row's sustained output rate; the methodology preset writes six rows
//! that parse and run; a bad file is refused before anything runs.

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use loadgen::cli::{main, Cli};
use loadgen::mock::{self, MockConfig};
use reports::matrix::{MatrixFile, Verdict, MATRIX_FILE};
use reports::summary::Summary;

async fn matrix(argv: &[&str]) -> anyhow::Result<()> {
    let mut full = vec!["loadgen", "matrix"];
    full.extend_from_slice(argv);
    main(Cli::try_parse_from(full)?).await
}

/// `loadgen matrix ARGV --no-progress --out OUT`, then its `matrix.json`.
async fn matrix_into(out: &Path, argv: &[&str]) -> MatrixFile {
    let mut full = argv.to_vec();
    full.extend(["--no-progress", "--out", out.to_str().unwrap()]);
    matrix(&full).await.unwrap();
    MatrixFile::read(&out.join(MATRIX_FILE)).unwrap()
}

fn mock_config() -> MockConfig {
    MockConfig {
        ttft: Duration::from_millis(40),
        itl: Duration::from_millis(5),
        ..MockConfig::default()
    }
}

const KNOWN: &str = r#"
[[row]]
name = "known"
question = "Does the mock answer as configured?"
hypothesis = "TTFT 40 ms and TPOT 5 ms: under 100 ms, over 2 bounds of 2 ms, under 3."
workload = "random"
random-input-len = 16
random-output-len = 16
rate = 40
warmup = "200ms"
duration = "1500ms"
expect = [
  "ttft:p50 < 100ms",       # true
  "ttft:p50 > 100ms",       # false
  "ttft:p99 < 1s",          # ~60 requests cannot bound a p99 from above
  "tpot:p50 < 3 * bound",   # 5 ms < 6 ms
  "tpot:p50 < 2 * bound",   # 5 ms > 4 ms
]

[[row]]
name = "closed"
workload = "random"
random-input-len = 8
random-output-len = 32
concurrency = 2
num-prompts = 20
seed = 9
expect = "e2e:p50 < 1s"
"#;

/// The matrix file `file` of [`KNOWN`] against the mock at `url`, with the defaults both
/// its tests give every row: the model, seed 5 and the bound's inputs (2 MB a step at
/// 1 GB/s, the KV cache's bytes negligible: 2 ms a token).
fn known_defaults<'a>(file: &'a Path, url: &'a str) -> Vec<&'a str> {
    vec![
        file.to_str().unwrap(),
        "--url",
        url,
        "--model",
        "loadgen-mock",
        "--seed",
        "5",
        "--weight-bytes",
        "2e6",
        "--kv-bytes-per-token",
        "1",
        "--bandwidth",
        "1e9",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expectations_are_decided_by_intervals_on_a_mock_of_known_timing() {
    let (addr, handle) = mock::spawn(mock_config()).await.unwrap();
    let url = format!("http://{addr}");
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("m.toml");
    std::fs::write(&file, KNOWN).unwrap();
    let out = temp.path().join("out");
    // The bound and the seed are defaults of every row; the second row's own seed wins.
    let mut argv = known_defaults(&file, &url);
    argv.extend(["--gpu-hour-usd", "3", "--gpus-per-instance", "2"]);
    let file = matrix_into(&out, &argv).await;
    handle.shutdown().await;
    assert_eq!(file.rows.len(), 2);
    let known = &file.rows[0];
    let verdicts: Vec<Verdict> = known.expectations.iter().map(|e| e.verdict).collect();
    use Verdict::*;
    assert_eq!(
        verdicts,
        [Confirmed, Refuted, Inconclusive, Confirmed, Refuted],
        "{:#?}",
        known.expectations
    );
    assert_eq!(
        known.verdict, Refuted,
        "one refuted statement refutes the row"
    );
    assert!((known.bound_tpot_ms.unwrap() - 2.0).abs() < 1e-3);
    let [lower, upper] = known.expectations[0].interval.unwrap();
    let (lower, upper) = (lower.unwrap(), upper.unwrap());
    assert!(
        (40.0..=upper).contains(&lower) && upper < 100.0,
        "the mock waits 40 ms: [{lower}, {upper}]"
    );
    assert_eq!(
        known.expectations[2].interval.unwrap()[1],
        None,
        "beyond the sample"
    );
    assert_eq!(known.load, "rate 40 req/s");
    assert_eq!(known.folder, "row-01-known/run");
    let closed = &file.rows[1];
    assert!(
        (closed.bound_tpot_ms.unwrap() - 2.0).abs() < 1e-3,
        "the matrix's bound reaches every row"
    );
    assert_eq!(
        (closed.verdict, closed.load.as_str()),
        (Confirmed, "concurrency 2")
    );
    for row in &file.rows {
        let dir = out.join(&row.folder);
        let summary = Summary::read(&dir.join("summary.json")).unwrap();
        // $3 × 2 GPUs an hour over the tokens per hour the row sustained.
        let expected = 6.0 / 3600.0 / summary.output_throughput * 1e6;
        let cost = row.usd_per_million_output_tokens.unwrap();
        assert!(
            (cost - expected).abs() < 1e-9 * expected,
            "{cost} vs {expected}"
        );
        assert_eq!(row.output_tok_per_s, Some(summary.output_throughput));
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let salt = &meta["workload"]["prompt_salt"];
        assert!(salt.as_u64().unwrap() != 0, "a cold row's words are fresh");
        assert_eq!(meta["seed"], if row.name == "known" { 5 } else { 9 });
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for text in [
        "## Matrix",
        "## Expectations",
        "## Row known",
        "## known: Run summary",
    ] {
        assert!(report.contains(text), "report lacks {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_methodology_preset_writes_six_rows_that_run() {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("methodology.toml");
    let path = file.to_str().unwrap();
    matrix(&["--preset", "methodology", "--write", path])
        .await
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.matches("[[row]]").count(), 6);
    let again = matrix(&["--preset", "methodology", "--write", path]).await;
    assert!(format!("{:#}", again.unwrap_err()).contains("exists"));

    let (addr, handle) = mock::spawn(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let out = temp.path().join("out");
    let url = format!("http://{addr}");
    let file = matrix_into(&out, &[path, "--scale", "0.01", "--url", &url]).await;
    handle.shutdown().await;
    assert_eq!(file.rows.len(), 6);
    assert_eq!(file.scale, 0.01);
    let decided: Vec<usize> = file.rows.iter().map(|r| r.expectations.len()).collect();
    assert_eq!(
        decided,
        [2, 2, 2, 2, 2, 3],
        "every statement of the preset decided"
    );
    for row in &file.rows {
        assert_eq!(row.error, None, "{}", row.name);
        assert!(out.join(&row.folder).join("summary.json").is_file());
    }
    // E: its one shared prefix sent alone before its window, 36 of its 41 tokens.
    let warmup =
        Summary::read(&out.join("row-05-E-warm-prefix/prefix-warmup/summary.json")).unwrap();
    assert_eq!((warmup.completed, warmup.total_input_tokens), (1, 36));
    // Scaled: A's 256 / 128 tokens are 3 / 1 at 0.01, its 120 s window 1.2 s.
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("row-01-A-short-chat/run/meta.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["workload"]["length_scale"], 0.01);
    assert_eq!(meta["schedule"]["duration_s"], 1.2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_is_refused_before_anything_runs() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("out");
    let good = "[[row]]\nname = \"ok\"\nrate = 1\nduration = \"1s\"\n";
    for (bad, says) in [
        (
            "[[row]]\nname = \"neg\"\nrate = 1\nduration = \"1s\"\nrandom-input-len = -3\n",
            "row `neg`, key `random-input-len`",
        ),
        (
            "[[row]]\nrate = 1\nduration = \"1s\"\nexpect = [\"ttft:p95 ≈ 1s\"]\n",
            "row 2, key `expect`",
        ),
        (
            "[[row]]\nname = \"typo\"\nrate = 1\nduration = \"1s\"\nrandom-inptu-len = 3\n",
            "row `typo`, key `random-inptu-len`: unknown key",
        ),
        (
            "[[row]]\nname = \"short\"\nrate = 1\n",
            "row `short`: give `duration` or `num-prompts`",
        ),
        (
            "[[row]]\nname = \"kv\"\nrate = 1\nduration = \"1s\"\nkv-bytes-per-token = 0\n",
            "row `kv`: the bound's inputs",
        ),
        (
            "[[row]]\nname = \"w\"\nconcurrency = 1\nduration = \"1s\"\nprefix = \"warm\"\n",
            "row `w`, key `prefix`: `warm` sends the row's shared prefixes",
        ),
    ] {
        let file = temp.path().join("bad.toml");
        std::fs::write(&file, format!("{good}{bad}")).unwrap();
        // No server listens there: a refusal must come before any request.
        let err = matrix(&[
            file.to_str().unwrap(),
            "--url",
            "http://127.0.0.1:9",
            "--out",
            out.to_str().unwrap(),
        ])
        .await
        .unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(
            !Path::new(&out).exists(),
            "nothing ran, nothing was written"
        );
    }
}

/// `--repeats 3`: every row runs three times, interleaved across rows, each run with its own
/// seed and prompt words in its own folder; each statement is decided across the runs (a
/// t-interval over the runs' percentiles) as well as within each, and each run's own entry
/// is kept under `runs`. `--repeats 0` is refused by the parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_decide_each_statement_across_interleaved_runs() {
    let (addr, handle) = mock::spawn(mock_config()).await.unwrap();
    let url = format!("http://{addr}");
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("m.toml");
    std::fs::write(&file, KNOWN).unwrap();
    let refused = Cli::try_parse_from([
        "loadgen",
        "matrix",
        file.to_str().unwrap(),
        "--url",
        &url,
        "--repeats",
        "0",
        "--out",
        "unused",
    ]);
    assert!(refused.unwrap_err().to_string().contains("--repeats"));
    let out = temp.path().join("out");
    let mut argv = known_defaults(&file, &url);
    argv.extend(["--repeats", "3"]);
    let matrix = matrix_into(&out, &argv).await;
    handle.shutdown().await;
    assert_eq!(matrix.rows.len(), 2);
    let known = &matrix.rows[0];
    let folders: Vec<&str> = known.runs.iter().map(|r| r.folder.as_str()).collect();
    assert_eq!(
        folders,
        [
            "row-01-known/run",
            "row-01-known/repeat-1/run",
            "row-01-known/repeat-2/run"
        ]
    );
    use Verdict::*;
    let verdicts: Vec<Verdict> = known.expectations.iter().map(|e| e.verdict).collect();
    assert_eq!(
        verdicts,
        [Confirmed, Refuted, Inconclusive, Confirmed, Refuted],
        "{:#?}",
        known.expectations
    );
    // The first statement's interval is the t-interval over the three runs' medians (one
    // limit, 100 ms, for all three): mean ± t(0.975, 2 df) · sd / √3.
    let medians: Vec<f64> = known
        .runs
        .iter()
        .map(|r| r.expectations[0].observed.unwrap())
        .collect();
    let mean = medians.iter().sum::<f64>() / 3.0;
    let sd = (medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
    let half = 4.302_652_7 * sd / 3f64.sqrt();
    assert!((known.expectations[0].observed.unwrap() - mean).abs() < 1e-9);
    let [lower, upper] = known.expectations[0].interval.unwrap();
    assert!(
        (lower.unwrap() - (mean - half)).abs() < 1e-6,
        "{lower:?} vs {}",
        mean - half
    );
    assert!(
        (upper.unwrap() - (mean + half)).abs() < 1e-6,
        "{upper:?} vs {}",
        mean + half
    );
    assert!(known.expectations[0]
        .reason
        .starts_with("3 runs: confirmed"));
    // Interleaved: each run of row 1 started before the next run of row 2, and after the
    // previous one's; each with its own seed and words.
    let started = |folder: &str| -> String {
        let meta: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(folder).join("meta.json")).unwrap(),
        )
        .unwrap();
        meta["start_time"].as_str().unwrap().to_string()
    };
    let closed = &matrix.rows[1];
    assert_eq!(closed.runs.len(), 3);
    let mut order: Vec<(String, &str)> = known
        .runs
        .iter()
        .chain(&closed.runs)
        .map(|r| (started(&r.folder), r.folder.as_str()))
        .collect();
    order.sort();
    let order: Vec<&str> = order.into_iter().map(|(_, f)| f).collect();
    assert_eq!(
        order,
        [
            "row-01-known/run",
            "row-02-closed/run",
            "row-01-known/repeat-1/run",
            "row-02-closed/repeat-1/run",
            "row-01-known/repeat-2/run",
            "row-02-closed/repeat-2/run"
        ]
    );
    let words = |folder: &str| -> (u64, u64) {
        let meta: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(folder).join("meta.json")).unwrap(),
        )
        .unwrap();
        (
            meta["seed"].as_u64().unwrap(),
            meta["workload"]["prompt_salt"].as_u64().unwrap(),
        )
    };
    let known_words: Vec<(u64, u64)> = folders.iter().map(|f| words(f)).collect();
    assert_eq!(known_words[0].0, 5);
    assert!(known_words[1] != known_words[0] && known_words[2] != known_words[1]);
    assert!(known_words[1].0 != 5 && known_words[2].0 != known_words[1].0);
}
