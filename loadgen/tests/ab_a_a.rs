//! A/A: the same mock config on both sides, 20 short online comparisons (fixed seeds, two
//! rounds per side in the order A B B A so that drift over time cancels, about 55 paired
//! requests) → "no significant difference" on every metric in at least 18 (the
//! false-positive rate is at most about α).

mod common;

use common::{base_mock, compare_mocks, metric, summary};
use reports::ab::Verdict;
use reports::metrics::SloMetric;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_a_comparisons_find_no_difference() {
    let temp = tempfile::tempdir().unwrap();
    let mut clean = 0;
    for rep in 0..20u64 {
        let out = temp.path().join(format!("aa-{rep:02}"));
        let file = compare_mocks(base_mock(), base_mock(), 2, 100 + rep, &out).await;
        assert!(file.pair_by_id, "identical schedules are paired");
        assert!(
            metric(&file, SloMetric::Ttft).n_a >= 15,
            "{}",
            summary(&file)
        );
        eprintln!("A/A {rep}: {}", summary(&file));
        clean += usize::from(
            file.analysis
                .metrics
                .iter()
                .all(|m| m.verdict == Verdict::NoSignificantDifference),
        );
    }
    assert!(clean >= 18, "A/A: only {clean} of 20 found no difference");
}
