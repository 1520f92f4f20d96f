//! `loadgen tune` over the built-in mock started from a command template (`loadgen
//! mock-server … --slots {slots}`; K slots of a fixed 100 ms service time saturate at
//! K / 0.1 s): it picks the configuration with the most capacity, and each configuration's
//! crossing interval holds the crossing a dense grid of levels finds on the same seeded mock;
//! two configurations that differ only in a value the mock ignores (its fault-injection
//! seed) are indistinguishable, and the one listed first wins; a configuration whose command
//! fails to start is recorded with its log and skipped; no configuration meeting the SLO
//! exits 3; SIGTERM mid-tune stops the server and leaves a readable report.

mod capacity;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use capacity::{four_slot_mock, Plan, Sweep, SATURATION};
use clap::Parser;
use loadgen::commands::plan::plan_command;
use loadgen::commands::sweep::sweep_command;
use loadgen::commands::tune::tune_command;
use loadgen::mock::{self, MockConfig};
use loadgen::spec::tune::TuneArgs;
use reports::capacity::CapacityPlan;
use reports::folders::PLAN_FILE;
use reports::tune::{ConfigStatus, Separation, TuneFile, TUNE_FILE};

#[derive(Parser)]
struct Tune {
    #[command(flatten)]
    args: TuneArgs,
}

const BIN: &str = env!("CARGO_BIN_EXE_loadgen");

/// TTFT p90 ≤ 60 ms (20 ms unqueued).
const SLO: &str = "ttft:p90:60ms";

/// The workload and timing options every search here shares (seed 4).
fn workload(out: &Path) -> Vec<String> {
    [
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
    .collect()
}

fn tune_argv(template: &str, knobs: &[&str], extra: &[&str], out: &Path) -> Vec<String> {
    let mut argv = vec!["tune".to_string(), "--server-cmd".into(), template.into()];
    for knob in knobs {
        argv.push("--knob".into());
        argv.push(knob.to_string());
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv.extend(workload(out));
    argv
}

/// The crossing that a grid of `rates` on a mock with `slots` slots finds (its plan's
/// interpolated crossing, with its 95% interval).
async fn grid_crossing(
    slots: usize,
    rates: &str,
    out: &Path,
) -> reports::stats::ConfidenceInterval {
    let (addr, handle) = mock::spawn(MockConfig {
        slots,
        ..four_slot_mock()
    })
    .await
    .unwrap();
    let mut argv = vec![
        "sweep".to_string(),
        "--url".into(),
        format!("http://{addr}"),
        "--rates".into(),
        rates.into(),
        "--slo".into(),
        SLO.into(),
    ];
    argv.extend(workload(out));
    sweep_command(Sweep::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    handle.shutdown().await;
    let plan = Plan::try_parse_from(["plan", out.to_str().unwrap(), "--target-qps", "1"]).unwrap();
    plan_command(plan.args).unwrap();
    let plan: CapacityPlan =
        serde_json::from_str(&std::fs::read_to_string(out.join(PLAN_FILE)).unwrap()).unwrap();
    plan.crossing.expect("the grid crosses the SLO")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_picks_the_largest_capacity_and_brackets_each_crossing() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("tune");
    let template =
        format!("{BIN} mock-server --ttft 20ms --itl 5ms --slots {{slots}} --port {{port}}");
    let argv = tune_argv(
        &template,
        &["slots=4,8"],
        &[
            "--slo",
            SLO,
            "--probe-duration",
            "800ms",
            "--rounds",
            "2",
            "--target-qps",
            "100",
        ],
        &out,
    );
    tune_command(Tune::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    let file = TuneFile::read(&out.join(TUNE_FILE)).unwrap();
    assert_eq!(file.configurations.len(), 2);
    let winner = file.winner.as_ref().expect("both meet the SLO somewhere");
    assert_eq!(winner.knobs["slots"], "8", "{file:#?}");
    assert_eq!(
        file.winner_vs_runner_up,
        Separation::Better,
        "{:#?}",
        file.duel
    );
    assert!(winner.command.contains("--slots 8 --port {port}"));
    assert!(file.plan.as_ref().unwrap().sizing.is_some());

    // Each configuration's bracket and the grid's crossing (interpolated between its last
    // passing and first failing level, with its 95% interval) share a point.
    for (config, (slots, rates)) in file.configurations.iter().zip([
        (4, "24,26,28,30,32,34,36,38,40"),
        (8, "60,64,68,72,76,80,84"),
    ]) {
        assert_eq!(config.status, ConfigStatus::Ok);
        assert_eq!(config.knobs["slots"], slots.to_string());
        let grid = grid_crossing(slots, rates, &temp.path().join(format!("grid-{slots}"))).await;
        let (low, high) = (config.capacity_low.unwrap(), config.capacity_high.unwrap());
        assert!(
            grid.lower <= high && grid.upper >= low,
            "slots {slots}: grid crossing {grid:?} outside {low}–{high}"
        );
        assert!(config.capacity.unwrap() <= SATURATION * slots as f64 / 4.0);
        assert!(config.ttft_ms.unwrap() <= 60.0, "{config:?}");
        assert!(!config.levels.is_empty() && config.search.is_some());
        assert!(out.join(&config.dir).join("server.log").is_file());
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Winner") && report.contains("--slots 8 --port {port}"));
    assert!(report.contains("Capacity plan (the winner)"));
}

/// `--strategy guided` over `--slots 1,2,4,8` (the mock's `--slots` is a concurrency knob by
/// the server table): the first step reads queueing at the failing end of the one-slot
/// search (the mock's own timing puts the wait for its slot in the TTFT), raises `slots`,
/// and the walk ends on 4 or more, every step in `tune.json` and the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guided_tune_raises_the_slots_queueing_asks_for() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("tune");
    let template =
        format!("{BIN} mock-server --ttft 20ms --itl 5ms --slots {{slots}} --port {{port}}");
    let argv = tune_argv(
        &template,
        &["slots=1,2,4,8"],
        &[
            "--strategy",
            "guided",
            "--slo",
            SLO,
            "--probe-duration",
            "800ms",
            "--rounds",
            "2",
        ],
        &out,
    );
    tune_command(Tune::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    let file = TuneFile::read(&out.join(TUNE_FILE)).unwrap();
    assert_eq!(file.strategy, "guided");
    let first = &file.steps[0];
    assert_eq!(first.base, "config-00", "{file:#?}");
    assert_eq!(
        first.regime,
        Some(reports::diagnosis::Regime::Queueing),
        "{:#?}",
        file.steps
    );
    assert_eq!(
        (
            first.knob.as_deref(),
            first.from.as_deref(),
            first.to.as_deref()
        ),
        (Some("slots"), Some("1"), Some("2"))
    );
    assert_eq!(first.kept, Some(true), "{}", first.why);
    // Every move but the last was kept; the walk stopped with a reason.
    let last = file.steps.last().unwrap();
    assert!(!last.why.is_empty(), "{:#?}", file.steps);
    assert_eq!(
        file.configurations.len(),
        file.steps.iter().filter(|s| s.to.is_some()).count() + 1
    );
    // The last step stands on the walk's end.
    let slots: u32 = last.knobs["slots"].parse().unwrap();
    assert!(slots >= 4, "ended on {slots} slots: {:#?}", file.steps);
    assert!(file.winner.is_some(), "the walk met the SLO");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("The guided walk"), "{report}");
}

/// `--repeats 3`: each configuration's search repeats its bracket's ends, so its capacity
/// carries the between-run interval of three runs' crossings; twice the slots is better
/// beyond that spread as well as in the duel. `--repeats 0` is refused by the parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_give_each_capacity_its_between_run_interval() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("tune");
    let template =
        format!("{BIN} mock-server --ttft 20ms --itl 5ms --slots {{slots}} --port {{port}}");
    let zero = tune_argv(
        &template,
        &["slots=4,8"],
        &["--slo", SLO, "--repeats", "0"],
        &out,
    );
    assert!(Tune::try_parse_from(zero)
        .err()
        .unwrap()
        .to_string()
        .contains("--repeats"));
    let mut argv = tune_argv(
        &template,
        &["slots=4,8"],
        &[
            "--slo",
            SLO,
            "--probe-duration",
            "800ms",
            "--rounds",
            "2",
            "--repeats",
            "3",
            "--precision",
            "0.2",
        ],
        &out,
    );
    // 3-s windows and a 20% precision, whose outward steps (× or ÷ 1.2, twice) reach far
    // enough: in 1-s windows (50 requests) one schedule draw's burst moved a repeat's
    // crossing below every rate it tried (÷ 1.1 twice), so it bracketed none.
    let i = argv.iter().position(|a| a == "1s").unwrap();
    argv[i] = "3s".into();
    tune_command(Tune::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    let file = TuneFile::read(&out.join(TUNE_FILE)).unwrap();
    for config in &file.configurations {
        assert_eq!(config.run_crossings.len(), 3, "{config:#?}");
        let ci = config
            .crossing_between_runs
            .unwrap_or_else(|| panic!("{:?} {:?}", config.run_crossings, config.search_end));
        // mean ± t(0.975, 2 df) · sd / √3 over the three runs' crossings.
        let runs: Vec<f64> = config.run_crossings.iter().flatten().copied().collect();
        let mean = runs.iter().sum::<f64>() / 3.0;
        let sd = (runs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
        let half = 4.302_652_7 * sd / 3f64.sqrt();
        assert!((ci.estimate - mean).abs() < 1e-9);
        assert!((ci.upper - ci.lower - 2.0 * half).abs() < 1e-6, "{ci:?}");
    }
    assert_eq!(file.winner.as_ref().unwrap().knobs["slots"], "8");
    assert_eq!(file.winner_vs_runner_up, Separation::Better, "{file:#?}");
    let why = file.between_runs.as_deref().unwrap();
    assert!(why.contains("Welch t") && why.contains("< α"), "{why}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("crossing between runs") && report.contains("Between runs"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_knob_is_indistinguishable_and_a_bad_value_fails_to_start() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("tune");
    // `--seed` only seeds the mock's fault injection, off here; `--slots x` is refused.
    let template = format!(
        "{BIN} mock-server --ttft 20ms --itl 5ms --seed {{seed}} --slots {{slots}} --port {{port}}"
    );
    let argv = tune_argv(
        &template,
        &["seed=1,2", "slots=4,x"],
        &[
            "--slo",
            SLO,
            "--probe-duration",
            "800ms",
            "--rounds",
            "2",
            "--min-effect",
            "20%",
            "--server-timeout",
            "20s",
        ],
        &out,
    );
    tune_command(Tune::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    let file = TuneFile::read(&out.join(TUNE_FILE)).unwrap();
    let statuses: Vec<(String, String, ConfigStatus)> = file
        .configurations
        .iter()
        .map(|c| (c.knobs["seed"].clone(), c.knobs["slots"].clone(), c.status))
        .collect();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    assert_eq!(
        statuses[..2],
        [
            ("1".into(), "4".into(), ConfigStatus::Ok),
            ("2".into(), "4".into(), ConfigStatus::Ok)
        ]
    );
    assert_eq!(statuses[2].1, "x");
    assert_eq!(statuses[2].2, ConfigStatus::FailedToStart);
    let tail = file.configurations[2].log_tail.as_deref().unwrap();
    assert!(tail.contains("--slots"), "{tail}");
    assert_eq!(
        file.winner_vs_runner_up,
        Separation::Indistinguishable,
        "{:#?}",
        file.duel
    );
    assert_eq!(
        file.winner.unwrap().knobs["seed"],
        "1",
        "the first listed is kept"
    );
    assert_eq!(file.runner_up.unwrap().knobs["seed"], "2");
}

#[test]
fn no_configuration_meeting_the_slo_exits_3() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("tune");
    // 20 ms to the first token against a 5 ms limit: missed unloaded, so no level runs; with
    // every request answered 500 the search itself fails while the server stays up.
    let template = format!(
        "{BIN} mock-server --ttft 20ms --itl 1ms --slots 2 --error-rate {{err}} --port {{port}}"
    );
    let mut argv = tune_argv(
        &template,
        &["err=0,1"],
        &["--slo", "ttft:p90:5ms", "--probe-duration", "1s"],
        &out,
    );
    let i = argv.iter().position(|a| a == "17").unwrap();
    argv[i] = "2".into();
    let status = Command::new(BIN).args(&argv[..]).output().unwrap();
    assert_eq!(
        status.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let file = TuneFile::read(&out.join(TUNE_FILE)).unwrap();
    assert!(file.winner.is_none() && file.configurations.len() == 2);
    let (missed, failed) = (&file.configurations[0], &file.configurations[1]);
    assert_eq!((missed.status, missed.capacity), (ConfigStatus::Ok, None));
    assert!(missed
        .search_end
        .as_deref()
        .unwrap()
        .starts_with("not met even unloaded"));
    assert_eq!(failed.status, ConfigStatus::SearchFailed);
    let tail = failed.log_tail.as_deref().unwrap();
    assert!(tail.contains("no request completed"), "{tail}");
    assert!(out.join("report.html").is_file());
}

#[test]
fn sigterm_stops_the_server_and_keeps_what_finished() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("tune");
    // A TTFT no other test uses marks this tune's servers among the processes.
    let template =
        format!("{BIN} mock-server --ttft 21ms --itl 5ms --slots {{slots}} --port {{port}}");
    let argv = tune_argv(
        &template,
        &["slots=4,8,16"],
        &["--slo", SLO, "--probe-duration", "800ms"],
        &out,
    );
    let mut child = Command::new(BIN).args(&argv[..]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = TuneFile::read(&out.join(TUNE_FILE)).is_ok_and(|f| !f.configurations.is_empty());
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no configuration finished in 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let the second configuration's server start and its search begin.
    std::thread::sleep(Duration::from_secs(3));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let file = TuneFile::read(&out.join(TUNE_FILE)).unwrap();
    assert_eq!(file.configurations[0].status, ConfigStatus::Ok);
    assert!(file.configurations.len() < 3);
    if let Some(second) = file.configurations.get(1) {
        assert_eq!(second.status, ConfigStatus::Interrupted, "{second:?}");
    }
    assert!(file.stop_reason.as_deref().unwrap().contains("interrupted"));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Configurations") && report.contains("slots=4"));
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let running = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !running
            .lines()
            .any(|l| l.contains("mock-server --ttft 21ms")),
        "a server outlived the tune:\n{running}"
    );
}
