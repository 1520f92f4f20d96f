//! A/A: the same mock config on both sides, 5 short online comparisons (fixed seeds, two
//! rounds per side in the order A B B A so that drift over time cancels, about 55 paired
//! requests) → "equivalent" or "inconclusive" on every metric in every one: a verdict of
//! "slower" or "faster" needs both significance and a ratio CI beyond the 2% (≥ 1 ms) margin.
//! The statistical rates are tested on 20 seeded simulations in `reports/tests/ab.rs`.

mod common;

use common::{base_mock, compare_mocks, metric, summary};
use reports::ab::Verdict;
use reports::metrics::SloMetric;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_a_comparisons_are_never_slower_or_faster() {
    let temp = tempfile::tempdir().unwrap();
    for rep in 0..5u64 {
        let out = temp.path().join(format!("aa-{rep:02}"));
        let file = compare_mocks(base_mock(), base_mock(), 2, 100 + rep, &out).await;
        assert!(file.pair_by_id, "identical schedules are paired");
        assert!(
            metric(&file, SloMetric::Ttft).n_a >= 15,
            "{}",
            summary(&file)
        );
        eprintln!("A/A {rep}: {}", summary(&file));
        assert!(
            file.analysis
                .metrics
                .iter()
                .all(|m| matches!(m.verdict, Verdict::Equivalent | Verdict::Inconclusive)),
            "A/A {rep}: {}",
            summary(&file)
        );
    }
}
