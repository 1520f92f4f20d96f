//! A/B with a known difference (fixed seeds, 5 repetitions of 2 rounds per side, A B B A):
//! - B's TTFT 15% longer → "A faster" on TTFT in every repetition;
//! - B's ITL 15% longer, TTFT identical → "A faster" on TPOT, and TTFT not different.
//!
//! Five repetitions (not 20) keep the suite fast; each is a full A B B A comparison.

mod common;

use std::time::Duration;

use common::{base_mock, compare_mocks, metric, summary};
use loadgen::mock::MockConfig;
use reports::ab::Verdict;
use reports::metrics::SloMetric;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longer_ttft_on_b_is_detected() {
    let temp = tempfile::tempdir().unwrap();
    for rep in 0..5u64 {
        let slower = MockConfig {
            ttft_factor: 1.15,
            ..base_mock()
        };
        let out = temp.path().join(format!("ttft-{rep}"));
        let file = compare_mocks(base_mock(), slower, 2, 200 + rep, &out).await;
        eprintln!("TTFT ×1.15 {rep}: {}", summary(&file));
        let ttft = metric(&file, SloMetric::Ttft);
        assert_eq!(ttft.verdict, Verdict::AFaster, "{}", summary(&file));
        let ratio = ttft.median_ratio.unwrap();
        assert!(
            ratio.lower > 1.0 && ratio.lower <= 1.15 && ratio.upper >= 1.1,
            "{ratio:?}"
        );
        assert_eq!(file.a_rounds.len(), 2);
        assert_eq!(file.b_rounds.len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longer_itl_on_b_shows_in_tpot_not_ttft() {
    let temp = tempfile::tempdir().unwrap();
    for rep in 0..5u64 {
        let slower = MockConfig {
            itl: Duration::from_micros(5750),
            ..base_mock()
        };
        let out = temp.path().join(format!("itl-{rep}"));
        let file = compare_mocks(base_mock(), slower, 2, 300 + rep, &out).await;
        eprintln!("ITL ×1.15 {rep}: {}", summary(&file));
        assert_eq!(
            metric(&file, SloMetric::Tpot).verdict,
            Verdict::AFaster,
            "{}",
            summary(&file)
        );
        assert_eq!(
            metric(&file, SloMetric::Ttft).verdict,
            Verdict::NoSignificantDifference,
            "{}",
            summary(&file)
        );
    }
}
