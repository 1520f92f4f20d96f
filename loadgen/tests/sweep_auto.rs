//! `loadgen sweep --rates auto` against a mock with K = 4 slots and a fixed 100 ms service time
//! (saturation K / S = 40 req/s): the closed-loop probe estimates the saturation rate, the
//! levels are spread below (and here one above) it, and the max sustainable QPS under a loose
//! SLO lands within 20% below the saturation rate, never above.

mod capacity;

use capacity::{four_slot_mock, Plan, Sweep, SATURATION};
use clap::Parser;
use loadgen::commands::plan::plan_command;
use loadgen::commands::sweep::sweep_command;
use loadgen::mock;
use reports::capacity::CapacityPlan;
use reports::folders::PLAN_FILE;
use reports::folders::{SweepFile, SWEEP_FILE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_rates_find_the_saturation_rate() {
    let (addr, handle) = mock::spawn(four_slot_mock()).await.unwrap();
    let saturation = SATURATION;
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("sweep");
    let sweep = Sweep::try_parse_from([
        "sweep",
        "--url",
        &format!("http://{addr}"),
        "--model",
        "loadgen-mock",
        "--workload",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "17",
        "--rates",
        "auto",
        "--probe-duration",
        "800ms",
        "--auto-fractions",
        "0.6,0.85,1.0,1.2",
        "--warmup",
        "500ms",
        "--duration",
        "2s",
        "--seed",
        "4",
        "--scrape-interval",
        "500ms",
        "--slo",
        "ttft:p90:5s",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    sweep_command(sweep.args).await.unwrap();
    handle.shutdown().await;

    let file = SweepFile::read(&out.join(SWEEP_FILE)).unwrap();
    let probe = file.probe.as_ref().expect("--rates auto records its probe");
    assert!(
        (0.9 * saturation..=1.1 * saturation).contains(&probe.saturation_rate),
        "{probe:?}"
    );
    assert!((4..=8).contains(&probe.knee_concurrency), "{probe:?}");
    assert_eq!(file.rates.len(), 4);
    assert!((file.rates[0] - 0.6 * probe.saturation_rate).abs() < 0.01);
    let above = file
        .levels
        .iter()
        .find(|l| l.offered_rate > 1.1 * saturation);
    assert!(above.is_none_or(|l| l.saturated), "{file:?}");

    let plan = Plan::try_parse_from(["plan", out.to_str().unwrap(), "--target-qps", "10"]).unwrap();
    plan_command(plan.args).unwrap();
    let plan: CapacityPlan =
        serde_json::from_str(&std::fs::read_to_string(out.join(PLAN_FILE)).unwrap()).unwrap();
    let max = plan
        .max_sustainable
        .expect("a loose SLO is met")
        .offered_rate;
    assert!(
        (0.8 * saturation..=saturation).contains(&max),
        "max {max} vs {saturation}"
    );
    // The interpolated crossing lies within 15% of the capacity, with an interval of
    // non-zero width inside ±30% of it.
    let crossing = plan
        .crossing
        .unwrap_or_else(|| panic!("a level above the knee bounds the crossing: {file:#?}"));
    assert!(
        (crossing.estimate / saturation - 1.0).abs() <= 0.15,
        "{crossing:?} vs {saturation}"
    );
    assert!(crossing.upper > crossing.lower, "{crossing:?}");
    assert!(
        crossing.lower >= 0.7 * saturation && crossing.upper <= 1.3 * saturation,
        "{crossing:?} vs {saturation}"
    );
}
