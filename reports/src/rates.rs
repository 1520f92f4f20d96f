//! The rates of a run or a sweep level, in requests/s: one word for each, defined here once
//! and computed by one function each. Every file (`summary.json`, `sweep.json`,
//! `plan.json`), table and plot uses these words:
//! - **offered**: the nominal rate asked for (`--rate`, a sweep level's rate); not measured.
//! - **scheduled**: what the seeded schedule actually holds over the measured requests,
//!   (n − 1) / span of their scheduled sends ([`scheduled`]).
//! - **sent**: (n − 1) / span of the same requests' actual sends, a wait for a concurrency
//!   slot left out since that is the server's doing ([`sent`]).
//! - **completed**: (k − 1) / span of the ends of the k measured requests that succeeded
//!   ([`completed`]).
//! - **sustained**: what a capacity plan sizes from: the scheduled rate (offered where
//!   unknown) of a level that kept up; for a saturated one, completed, or scheduled where
//!   lower ([`sustained`]).

use crate::records::RequestRecord;

/// The definitions, for reports and the sweep's printout.
pub const DEFINITIONS: &str = "Rates (req/s): offered = the nominal rate asked for; scheduled = \
(n − 1) / span of the n measured requests' scheduled sends (what the seeded schedule actually \
holds); sent = the same over their actual sends; completed = (k − 1) / span of the k successful \
ones' ends, over the same requests; sustained = what a plan sizes from: scheduled for a level that \
kept up, completed (or scheduled where lower) for a saturated one.";

/// (n − 1) / span of `n` instants in milliseconds; `None` with fewer than two or no span.
fn over_span(times_ms: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, first, last) = times_ms.fold(
        (0usize, f64::INFINITY, f64::NEG_INFINITY),
        |(n, lo, hi), t| (n + 1, lo.min(t), hi.max(t)),
    );
    (n >= 2 && last > first).then(|| (n - 1) as f64 / ((last - first) / 1000.0))
}

/// The scheduled rate of `measured` (the measured-phase requests).
pub fn scheduled(measured: &[&RequestRecord]) -> Option<f64> {
    over_span(measured.iter().map(|r| r.scheduled_ms))
}

/// The sent rate of `measured`.
pub fn sent(measured: &[&RequestRecord]) -> Option<f64> {
    over_span(measured.iter().map(|r| r.sent_ms - r.queue_ms))
}

/// The completed rate of `measured`.
pub fn completed(measured: &[&RequestRecord]) -> Option<f64> {
    over_span(measured.iter().filter(|r| r.is_success()).map(|r| r.end_ms))
}

/// The sustained rate of a level: what the schedule held (`scheduled`, else `offered`) when
/// it kept up; when `saturated`, `completed`, or the held rate where lower (the held rate
/// when nothing completed). A level that kept up completes what it was sent: its
/// completed rate, the span of its ends, differs from the held rate only by the latencies of
/// the requests at the window's edges (the longest of the last ones stretches the span by
/// up to a tail latency, 2–5% of a 25-s window near capacity), which would make every level
/// that kept up look as if it carried less than it did.
pub fn sustained(offered: f64, scheduled: Option<f64>, completed: f64, saturated: bool) -> f64 {
    let held = scheduled.unwrap_or(offered);
    if !saturated {
        return held;
    }
    if completed > 0.0 {
        completed.min(held)
    } else {
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{ChunkTokensSource, CountSource, ErrorKind, Phase, RequestError};

    /// A measured request scheduled at `scheduled_ms`, sent after a 5 ms wait for a slot,
    /// ending at `end_ms`, failed unless `ok`.
    fn record(id: u64, scheduled_ms: f64, end_ms: f64, ok: bool) -> RequestRecord {
        RequestRecord {
            id,
            phase: Phase::Measured,
            scheduled_ms,
            queue_ms: 5.0,
            sent_ms: scheduled_ms + 5.0,
            first_token_ms: Some(scheduled_ms + 6.0),
            first_answer_ms: Some(scheduled_ms + 6.0),
            end_ms,
            chunk_ms: vec![scheduled_ms + 6.0, end_ms],
            chunk_tokens: vec![1, 1],
            chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
            prompt_tokens: 4,
            prompt_tokens_source: CountSource::Usage,
            output_tokens: 2,
            output_tokens_source: CountSource::Usage,
            reasoning_tokens: 0,
            reasoning_tokens_source: CountSource::Counted,
            requested_output_tokens: 2,
            short_output: false,
            prefix_group: None,
            cached_tokens: None,
            server_timing: None,
            session: None,
            class: None,
            connect_ms: None,
            http_status: Some(if ok { 200 } else { 500 }),
            error: (!ok).then(|| RequestError {
                kind: ErrorKind::Http5xx,
                message: "500".into(),
            }),
        }
    }

    #[test]
    fn each_rate_counts_its_own_instants_over_the_same_requests() {
        // 11 requests scheduled 100 ms apart (10 req/s); sends wait 5 ms for a slot, which
        // does not count; ends 200 ms apart, every other one failed.
        let records: Vec<RequestRecord> = (0..11)
            .map(|i| record(i, 100.0 * i as f64, 1000.0 + 200.0 * i as f64, i % 2 == 0))
            .collect();
        let measured: Vec<&RequestRecord> = records.iter().collect();
        assert_eq!(scheduled(&measured), Some(10.0));
        assert_eq!(sent(&measured), Some(10.0));
        // Six successes over 2,000 ms: 5 / 2 s.
        assert_eq!(completed(&measured), Some(2.5));
        assert_eq!(scheduled(&measured[..1]), None);
        assert_eq!(sustained(12.0, Some(10.0), 2.5, true), 2.5);
        assert_eq!(sustained(12.0, Some(10.0), 11.0, true), 10.0);
        assert_eq!(sustained(12.0, None, 13.0, true), 12.0);
        assert_eq!(sustained(12.0, Some(10.0), 0.0, true), 10.0);
        // A level that kept up sustained its schedule, whatever the span of its ends.
        assert_eq!(sustained(12.0, Some(10.0), 9.6, false), 10.0);
        assert_eq!(sustained(12.0, None, 11.5, false), 12.0);
    }
}
