//! A/B with a known difference (fixed seeds, 5 repetitions of 2 rounds per side, A B B A):
//! - B's TTFT 15% longer → "A faster" on TTFT in every repetition;
//! - B's ITL 15% longer, TTFT identical → "A faster" on TPOT in every repetition, and TTFT
//!   not different (false positives bounded, see the test).
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

/// TTFT is identical on both sides, so a TTFT verdict is a false positive. With TPOT and E2E
/// strongly significant, Holm tests TTFT at the full α, so it is flagged in about 5% of
/// repetitions or a little more (seen: 2 of 10, with p_holm 0.035 and 0.047); "never in 5"
/// would fail about a quarter of the time by design. The test bounds the count (at most 2 of
/// 5: fails with probability < 1% at a 10% per-repetition rate) and checks that the ITL change
/// does not leak into TTFT: every TTFT median-ratio estimate within 2% of 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longer_itl_on_b_shows_in_tpot_not_ttft() {
    let temp = tempfile::tempdir().unwrap();
    let mut ttft_flagged = 0;
    for rep in 0..5u64 {
        let slower = MockConfig {
            itl: Duration::from_micros(5750),
            ..base_mock()
        };
        let out = temp.path().join(format!("itl-{rep}"));
        let file = compare_mocks(base_mock(), slower, 2, 300 + rep, &out).await;
        eprintln!("ITL ×1.15 {rep}: {}", summary(&file));
        let tpot = metric(&file, SloMetric::Tpot);
        assert_eq!(tpot.verdict, Verdict::AFaster, "{}", summary(&file));
        let ratio = tpot.median_ratio.unwrap();
        assert!(
            ratio.lower > 1.1 && ratio.upper < 1.2,
            "TPOT ratio {ratio:?}"
        );
        let ttft = metric(&file, SloMetric::Ttft);
        let estimate = ttft.median_ratio.unwrap().estimate;
        assert!((0.98..=1.02).contains(&estimate), "TTFT ratio {estimate}");
        ttft_flagged += usize::from(ttft.verdict != Verdict::NoSignificantDifference);
    }
    assert!(ttft_flagged <= 2, "TTFT flagged in {ttft_flagged} of 5");
}
