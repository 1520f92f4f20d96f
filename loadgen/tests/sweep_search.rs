//! `loadgen sweep --rates search` against the built-in mock with K = 4 slots and a fixed
//! 100 ms service time (saturation 40 req/s): the search brackets the SLO's crossing and
//! bisects it within `--precision` in at most 8 levels, and its bracket holds the crossing
//! that a dense grid of levels finds on the same seeded mock; an unknown level is re-run once
//! with twice the requests and never ends the bracket; a server that meets the SLO up to
//! `--max-rate` ends the search there, and one that misses it unloaded ends it at once.

mod capacity;

use std::path::Path;
use std::time::Duration;

use capacity::{four_slot_mock, Plan, Sweep, SATURATION};
use clap::Parser;
use loadgen::commands::plan::plan_command;
use loadgen::commands::sweep::sweep_command;
use loadgen::mock::{self, MockConfig};
use reports::capacity::CapacityPlan;
use reports::folders::{SweepFile, PLAN_FILE, SWEEP_FILE};
use reports::records::{read_records, Phase};
use reports::search::{SearchEnd, SearchVerdict, StepReason};

/// The sweep options of every test: 32 input and 17 output tokens, seed 4, 300 ms warm-up,
/// levels of at least 1 s lengthened to the requests a p90 needs.
fn sweep_args(url: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> = [
        "sweep",
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
        "--warmup",
        "300ms",
        "--duration",
        "1s",
        "--seed",
        "4",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv
}

async fn sweep(argv: Vec<String>) -> SweepFile {
    let out = argv[argv.iter().position(|a| a == "--out").unwrap() + 1].clone();
    sweep_command(Sweep::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    SweepFile::read(&Path::new(&out).join(SWEEP_FILE)).unwrap()
}

fn plan(dir: &Path) -> CapacityPlan {
    let args = Plan::try_parse_from(["plan", dir.to_str().unwrap(), "--target-qps", "100"])
        .unwrap()
        .args;
    plan_command(args).unwrap();
    serde_json::from_str(&std::fs::read_to_string(dir.join(PLAN_FILE)).unwrap()).unwrap()
}

/// TTFT p90 ≤ 60 ms (20 ms unqueued): it breaks at about 34 req/s on this mock.
const SLO: &str = "ttft:p90:60ms";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_brackets_the_crossing_a_dense_grid_finds() {
    let (addr, handle) = mock::spawn(four_slot_mock()).await.unwrap();
    let url = format!("http://{addr}");
    let temp = tempfile::tempdir().unwrap();
    let (grid_dir, search_dir) = (temp.path().join("grid"), temp.path().join("search"));
    let grid = sweep(sweep_args(
        &url,
        &grid_dir,
        &["--rates", "20,24,27,30,32,34,36,38,40", "--slo", SLO],
    ))
    .await;
    let search = sweep(sweep_args(
        &url,
        &search_dir,
        &[
            "--rates",
            "search",
            "--probe-duration",
            "800ms",
            "--slo",
            SLO,
        ],
    ))
    .await;
    handle.shutdown().await;

    let path = search.search.as_ref().expect("sweep.json keeps the search");
    assert_eq!(path.end, Some(SearchEnd::Converged), "{path:#?}");
    assert!(path.steps.len() <= 8, "{path:#?}");
    assert_eq!(path.steps.len(), search.levels.len());
    assert_eq!(path.steps[0].reason, StepReason::Start);
    assert!(path.steps.iter().any(|s| s.reason == StepReason::Bisecting));
    let bracket = path.bracket();
    let (lower, upper) = (
        bracket.lower.as_ref().unwrap().rate,
        bracket.upper.as_ref().unwrap().rate,
    );
    assert!(upper <= lower * (1.0 + path.precision), "{bracket}");
    assert!(
        upper <= 1.05 * SATURATION,
        "the SLO breaks below capacity: {bracket}"
    );
    // Every level in the order run, each with its folder and the bracket after it.
    for (step, level) in path.steps.iter().zip(&search.levels) {
        assert_eq!(step.dir, level.dir);
        assert_eq!(step.offered_rate, level.offered_rate);
        assert!(search_dir.join(&step.dir).join("records.jsonl").is_file());
    }

    // The grid's crossing, interpolated between its last passing and first failing level,
    // with its 95% interval (the two levels' requests resampled): the search's bracket holds
    // a point of it.
    let grid_crossing = plan(&grid_dir).crossing.expect("the grid crosses the SLO");
    assert!(
        grid_crossing.lower <= upper && grid_crossing.upper >= lower,
        "grid crossing {grid_crossing:?} outside the search's bracket {bracket} ({:?})",
        grid.levels
            .iter()
            .map(|l| (l.offered_rate, l.slo_verdict, l.saturated))
            .collect::<Vec<_>>()
    );
    // The plan of the search sizes from the bracket's lower end and interpolates inside it.
    let search_plan = plan(&search_dir);
    let max = search_plan.max_sustainable.unwrap();
    assert!(
        (max.sustained_rate - lower).abs() < 1e-9,
        "{max:?} vs {bracket}"
    );
    let crossing = search_plan.crossing.unwrap();
    assert!((lower..=upper).contains(&crossing.estimate), "{crossing:?}");
    let report = std::fs::read_to_string(search_dir.join("report.md")).unwrap();
    assert!(report.contains("## Knee search") && report.contains("converged: the bracket"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_level_is_rerun_once_with_twice_the_requests() {
    let (addr, handle) = mock::spawn(four_slot_mock()).await.unwrap();
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("search");
    // 24 requests a level cannot bound a p90 (35 needed); 48 can.
    let mut argv = sweep_args(
        &format!("http://{addr}"),
        &out,
        &[
            "--rates",
            "search",
            "--probe-duration",
            "800ms",
            "--slo",
            SLO,
            "--min-requests",
            "0",
            "--num-prompts",
            "24",
            "--max-levels",
            "5",
        ],
    );
    for flag in ["--duration", "--warmup"] {
        let i = argv.iter().position(|a| a == flag).unwrap();
        argv.drain(i..i + 2);
    }
    let file = sweep(argv).await;
    handle.shutdown().await;

    let path = file.search.unwrap();
    let measured = |dir: &str| {
        read_records(&out.join(dir).join("records.jsonl"))
            .unwrap()
            .iter()
            .filter(|r| r.phase == Phase::Measured)
            .count()
    };
    let unknown: Vec<usize> = (0..path.steps.len())
        .filter(|&i| path.steps[i].verdict == SearchVerdict::Unknown)
        .collect();
    assert!(!unknown.is_empty(), "{path:#?}");
    for &i in &unknown {
        let step = &path.steps[i];
        assert_eq!(measured(&step.dir), 24, "{step:?}");
        assert_ne!(step.reason, StepReason::Rerun, "a re-run held 48: {step:?}");
        if let Some(rerun) = path.steps.get(i + 1) {
            assert_eq!(rerun.reason, StepReason::Rerun, "{path:#?}");
            assert_eq!(rerun.offered_rate, step.offered_rate);
            assert_eq!(measured(&rerun.dir), 48, "{rerun:?}");
        }
        for later in &path.steps[i..] {
            for end in [&later.bracket.lower, &later.bracket.upper]
                .into_iter()
                .flatten()
            {
                assert_ne!(
                    end.dir, step.dir,
                    "an unknown level ends a bracket: {path:#?}"
                );
            }
        }
    }
    assert!(path.steps.len() <= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn met_up_to_the_highest_rate_ends_the_search_there() {
    // Unlimited slots: 100 ms a request at any rate. The probe stops at concurrency 4
    // (about 40 req/s), so --max-rate defaults to about 160 req/s.
    let (addr, handle) = mock::spawn(MockConfig {
        slots: 0,
        ..four_slot_mock()
    })
    .await
    .unwrap();
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("search");
    let file = sweep(sweep_args(
        &format!("http://{addr}"),
        &out,
        &[
            "--rates",
            "search",
            "--probe-duration",
            "800ms",
            "--probe-max-concurrency",
            "4",
            "--slo",
            "ttft:p90:1s",
        ],
    ))
    .await;
    handle.shutdown().await;
    let path = file.search.unwrap();
    assert_eq!(path.end, Some(SearchEnd::MetAtMaxRate), "{path:#?}");
    let reasons: Vec<StepReason> = path.steps.iter().map(|s| s.reason).collect();
    assert_eq!(
        reasons,
        [
            StepReason::Start,
            StepReason::Doubling,
            StepReason::Doubling
        ]
    );
    assert_eq!(path.steps.last().unwrap().offered_rate, path.max_rate);
    assert!(path
        .end_reason
        .unwrap()
        .starts_with("met at the highest rate tried"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_unloaded_ends_the_search_at_once() {
    // 30 ms to the first token with nothing queued, against a 20 ms limit; 46 ms a request,
    // so a 2.5 s probe step holds the 35 requests that bound a p90.
    let (addr, handle) = mock::spawn(MockConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(1),
        slots: 0,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("search");
    let file = sweep(sweep_args(
        &format!("http://{addr}"),
        &out,
        &[
            "--rates",
            "search",
            "--probe-duration",
            "2500ms",
            "--slo",
            "ttft:p90:20ms",
        ],
    ))
    .await;
    handle.shutdown().await;
    let path = file.search.unwrap();
    assert_eq!(path.end, Some(SearchEnd::NotMetUnloaded), "{path:#?}");
    assert!(path.steps.is_empty() && file.levels.is_empty());
    let probe = file.probe.unwrap();
    assert_eq!(probe.steps.len(), 1, "the probe ends at concurrency 1");
    assert!(file
        .stop_reason
        .unwrap()
        .starts_with("not met even unloaded"));
    assert!(!out.join("level-00").exists());
}

/// `loadgen sweep` on the 4-slot mock with `extra`, stopped by SIGTERM inside its second
/// level: its `sweep.json` and folder.
async fn stopped_in_the_second_level(extra: &[&str]) -> (SweepFile, tempfile::TempDir) {
    let (addr, handle) = mock::spawn(four_slot_mock()).await.unwrap();
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("sweep");
    let argv = sweep_args(&format!("http://{addr}"), &out, extra);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(&argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !out.join("level-01").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the second level never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Inside the second level's warm-up or window.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    handle.shutdown().await;
    assert!(status.success(), "{status:?}");
    assert!(out.join("level-01").join("records.jsonl").exists());
    (SweepFile::read(&out.join(SWEEP_FILE)).unwrap(), temp)
}

/// A stop (SIGTERM) during a level ends the search as interrupted: the cut level keeps its
/// folder and the requests that finished, but is neither judged nor an end of the bracket
/// (the stop, not the server, cut its requests in flight; a GPU run once had such a level
/// judged saturated, which ended its search "cannot be narrowed"). A list of rates keeps
/// its cut level out of `sweep.json` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_level_ends_the_sweep_without_judging_it() {
    let (file, _temp) = stopped_in_the_second_level(&[
        "--rates",
        "search",
        "--probe-duration",
        "800ms",
        "--slo",
        SLO,
    ])
    .await;
    let path = file.search.unwrap();
    assert_eq!(path.end, Some(SearchEnd::Interrupted), "{path:#?}");
    assert_eq!(path.steps.len(), 1, "{path:#?}");
    let dirs: Vec<&str> = file.levels.iter().map(|l| l.dir.as_str()).collect();
    assert_eq!(dirs, ["level-00"]);
    let reason = file.stop_reason.unwrap();
    assert!(
        reason.starts_with("interrupted during the level at")
            && reason.contains("its folder level-01 keeps the requests that finished"),
        "{reason}"
    );

    let (file, _temp) = stopped_in_the_second_level(&["--rates", "10,20,30", "--slo", SLO]).await;
    let dirs: Vec<&str> = file.levels.iter().map(|l| l.dir.as_str()).collect();
    assert_eq!(dirs, ["level-00"]);
    let reason = file.stop_reason.unwrap();
    assert!(
        reason.starts_with("interrupted during the level at 20 req/s: its folder level-01"),
        "{reason}"
    );
}
