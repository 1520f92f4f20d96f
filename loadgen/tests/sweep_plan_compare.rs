//! `loadgen sweep`, `plan`, `compare` and `report` against the built-in mock.
//!
//! Capacity: a mock with K slots and a fixed service time S saturates at K / S requests/s; the
//! sweep's max sustainable QPS under a loose SLO must land within 20% below it, never above.

mod capacity;

use std::path::Path;

use capacity::{four_slot_mock, Plan, Sweep, SATURATION};
use clap::Parser;
use loadgen::commands::compare::compare_command;
use loadgen::commands::plan::plan_command;
use loadgen::commands::report::{report_command, ReportArgs};
use loadgen::commands::sweep::sweep_command;
use loadgen::mock;
use loadgen::spec::compare::CompareArgs;
use reports::ab::Verdict;
use reports::capacity::CapacityPlan;
use reports::folders::PLAN_FILE;
use reports::folders::{CompareFile, COMPARE_FILE};
use reports::folders::{SweepFile, SWEEP_FILE};

#[derive(Parser)]
struct Compare {
    #[command(flatten)]
    args: CompareArgs,
}

fn check_report(dir: &Path) {
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
    assert!(
        html.matches("<svg").count() >= 4,
        "plots in {}",
        dir.display()
    );
    assert!(dir.join("report.md").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_plan_compare_and_report_on_the_mock() {
    let (addr, handle) = mock::spawn(four_slot_mock()).await.unwrap();
    let saturation = SATURATION;
    let temp = tempfile::tempdir().unwrap();
    let sweep_dir = temp.path().join("sweep");
    let url = format!("http://{addr}");
    let out = sweep_dir.to_str().unwrap();
    let sweep = Sweep::try_parse_from([
        "sweep",
        "--url",
        &url,
        "--model",
        "loadgen-mock",
        "--workload",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "17",
        "--random-range-ratio",
        "0",
        "--rates",
        "24,34,38,46,60",
        "--warmup",
        "500ms",
        "--duration",
        "4s",
        "--seed",
        "3",
        "--scrape-interval",
        "500ms",
        "--slo",
        "ttft:p90:5s",
        "--no-progress",
        "--out",
        out,
    ])
    .unwrap();
    sweep_command(sweep.args).await.unwrap();
    handle.shutdown().await;

    let file = SweepFile::read(&sweep_dir.join(SWEEP_FILE)).unwrap();
    assert!(file.levels.len() >= 3, "{file:?}");
    assert!(
        file.levels.len() < 5,
        "the sweep stops after saturating: {file:?}"
    );
    assert!(file.stop_reason.is_some());
    check_report(&sweep_dir);

    let plan = Plan::try_parse_from([
        "plan",
        out,
        "--target-qps",
        "100",
        "--gpus-per-instance",
        "1",
        "--gpu-hour-usd",
        "2",
    ])
    .unwrap();
    plan_command(plan.args).unwrap();
    let text = std::fs::read_to_string(sweep_dir.join(PLAN_FILE)).unwrap();
    let plan: CapacityPlan = serde_json::from_str(&text).unwrap();
    let max = plan
        .max_sustainable
        .expect("a loose SLO is met at low rates")
        .offered_rate;
    assert!(
        (0.8 * saturation..=saturation).contains(&max),
        "max sustainable {max} req/s vs saturation {saturation}"
    );
    reads_the_earlier_rate_names(&sweep_dir);
    let sizing = plan.sizing.unwrap();
    assert_eq!(sizing.instances, (100.0 * 1.2 / max - 1e-9).ceil() as u64);
    assert!(std::fs::read_to_string(sweep_dir.join("report.html"))
        .unwrap()
        .contains("Capacity plan"));

    // The same run on both sides: paired, every difference zero → no difference.
    let level = sweep_dir.join(&file.levels[0].dir);
    let compare_dir = temp.path().join("compare");
    let compare = Compare::try_parse_from([
        "compare",
        level.to_str().unwrap(),
        level.to_str().unwrap(),
        "--out",
        compare_dir.to_str().unwrap(),
    ])
    .unwrap();
    compare_command(compare.args).await.unwrap();
    let result = CompareFile::read(&compare_dir.join(COMPARE_FILE)).unwrap();
    assert!(result.pair_by_id);
    assert!(result
        .analysis
        .metrics
        .iter()
        .all(|m| m.verdict == Verdict::Equivalent));
    check_report(&compare_dir);

    // `loadgen report` on a single run folder.
    report_command(ReportArgs {
        dir: level.clone(),
        out: None,
        csv: false,
    })
    .unwrap();
    check_report(&level);
}

/// Folders written before the rates were renamed (`summary.json`'s `offered_rate` /
/// `achieved_rate` for scheduled / sent, `sweep.json`'s and `plan.json`'s `achieved_rate` for
/// completed) load as the new ones do: the sweep folder, its levels' run folders and the plan.
fn reads_the_earlier_rate_names(sweep_dir: &Path) {
    let old = tempfile::tempdir().unwrap();
    let copy = old.path().join("sweep");
    let rename = |from: &Path, to: &Path, pairs: &[(&str, &str)]| {
        let mut text = std::fs::read_to_string(from).unwrap();
        for (new, earlier) in pairs {
            assert!(
                text.contains(&format!("\"{new}\"")),
                "{} has no {new}",
                from.display()
            );
            text = text.replace(&format!("\"{new}\""), &format!("\"{earlier}\""));
        }
        std::fs::write(to, text).unwrap();
    };
    std::fs::create_dir_all(&copy).unwrap();
    rename(
        &sweep_dir.join(SWEEP_FILE),
        &copy.join(SWEEP_FILE),
        &[("completed_rate", "achieved_rate")],
    );
    rename(
        &sweep_dir.join(PLAN_FILE),
        &copy.join(PLAN_FILE),
        &[("completed_rate", "achieved_rate")],
    );
    let file = SweepFile::read(&sweep_dir.join(SWEEP_FILE)).unwrap();
    for level in &file.levels {
        let (from, to) = (sweep_dir.join(&level.dir), copy.join(&level.dir));
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
            }
        }
        rename(
            &from.join("summary.json"),
            &to.join("summary.json"),
            &[
                ("scheduled_rate", "offered_rate"),
                ("sent_rate", "achieved_rate"),
            ],
        );
        let summary = reports::summary::Summary::read(&to.join("summary.json")).unwrap();
        assert_eq!(
            summary,
            reports::summary::Summary::read(&from.join("summary.json")).unwrap()
        );
        assert!(summary.scheduled_rate.is_some() && summary.sent_rate.is_some());
    }
    assert_eq!(SweepFile::read(&copy.join(SWEEP_FILE)).unwrap(), file);
    let (new, earlier) = (
        reports::folders::load_sweep(sweep_dir).unwrap(),
        reports::folders::load_sweep(&copy).unwrap(),
    );
    assert_eq!(earlier.levels, new.levels);
    let plan = |dir: &Path| -> CapacityPlan {
        serde_json::from_str(&std::fs::read_to_string(dir.join(PLAN_FILE)).unwrap()).unwrap()
    };
    assert_eq!(plan(&copy), plan(sweep_dir));
}
