//! A/B with a known difference (fixed seeds, 5 repetitions of 2 rounds per side, A B B A):
//! - B's TTFT 15% longer → "B slower" on TTFT in every repetition;
//! - B's ITL 15% longer, TTFT identical → "B slower" on TPOT in every repetition, and TTFT
//!   never called slower or faster (equivalent or inconclusive).
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
        assert_eq!(ttft.verdict, Verdict::BSlower, "{}", summary(&file));
        let ratio = ttft.median_ratio.unwrap();
        assert!(
            ratio.lower > 1.0 && ratio.lower <= 1.15 && ratio.upper >= 1.1,
            "{ratio:?}"
        );
        assert_eq!(file.a_rounds.len(), 2);
        assert_eq!(file.b_rounds.len(), 2);
    }
}

/// TTFT is identical on both sides: a significant p-value alone happens in about 5% of
/// repetitions (Holm tests TTFT at the full α once TPOT and E2E are strongly significant),
/// but a verdict also needs the ratio's CI beyond the margin (2% of A's median, at least
/// 1 ms), which identical servers do not give.
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
        let tpot = metric(&file, SloMetric::Tpot);
        assert_eq!(tpot.verdict, Verdict::BSlower, "{}", summary(&file));
        let ratio = tpot.median_ratio.unwrap();
        assert!(
            ratio.lower > 1.1 && ratio.upper < 1.2,
            "TPOT ratio {ratio:?}"
        );
        let ttft = metric(&file, SloMetric::Ttft);
        let estimate = ttft.median_ratio.unwrap().estimate;
        assert!((0.98..=1.02).contains(&estimate), "TTFT ratio {estimate}");
        assert!(
            matches!(ttft.verdict, Verdict::Equivalent | Verdict::Inconclusive),
            "{}",
            summary(&file)
        );
    }
}
