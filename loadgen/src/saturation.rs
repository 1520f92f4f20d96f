//! Whether a sweep level kept up with the rate its schedule held.
//!
//! A level saturates when it completes fewer than 95% of the requests/s its schedule held, or
//! when its waiting requests keep growing. The scheduled and completed rates
//! (`reports::rates`) are compared over the same requests, so short levels are not misjudged
//! by the Poisson noise of their request count (a server that keeps up ends them as fast as
//! they were sent; one that does not spreads the ends out). Growing
//! waiting requests: the number of requests in flight (sent, not yet ended),
//! sampled evenly over the measured sends, is higher in the last third than in the first by
//! more than the noise of a stable queue (see [`backlog_trend`]). At exactly the capacity a
//! queue grows only like √t, which the backlog test can miss; the TTFT trend catches it: the
//! median TTFT of the requests sent in the last third of the window is more than twice that
//! of the first third (and at least 100 ms above it). [`judge`] combines the three into
//! saturated, unsaturated or unclear (too few requests to tell), and says which rule decided.

use reports::records::{Phase, RequestRecord};
use reports::stats::median;
use serde::{Deserialize, Serialize};

/// A level saturates when its completed rate is below this fraction of its scheduled rate.
pub const SATURATION_FRACTION: f64 = 0.95;

/// Fewer successful measured requests than this: too few to call a level either way.
pub const MIN_REQUESTS_TO_JUDGE: usize = 10;

/// Whether a level kept up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaturationState {
    Saturated,
    Unsaturated,
    Unclear,
}

/// The saturation verdict of a level and the rule that decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saturation {
    pub state: SaturationState,
    pub rule: String,
    pub rates: Option<LevelRates>,
    pub backlog: Option<Backlog>,
    /// Median TTFT (ms) of the requests sent in the first and the last third of the window.
    pub ttft_thirds: Option<(f64, f64)>,
}

/// Median TTFT of the measured successful requests sent in the first and last third.
fn ttft_thirds(records: &[RequestRecord]) -> Option<(f64, f64)> {
    let ok: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured && r.is_success())
        .collect();
    let start = ok.iter().map(|r| r.sent_ms).reduce(f64::min)?;
    let end = ok.iter().map(|r| r.sent_ms).reduce(f64::max)?;
    let third = (end - start) / 3.0;
    let ttft_in = |lo: f64, hi: f64| {
        let values: Vec<f64> = ok
            .iter()
            .filter(|r| r.sent_ms >= lo && r.sent_ms <= hi)
            .filter_map(|r| Some(r.first_token_ms? - r.sent_ms))
            .collect();
        median(&values)
    };
    Some((ttft_in(start, start + third)?, ttft_in(end - third, end)?))
}

/// The saturation verdict of a level's records (see the module doc).
pub fn judge(records: &[RequestRecord]) -> Saturation {
    let rates = level_rates(records);
    let backlog = backlog_trend(records);
    let thirds = ttft_thirds(records);
    let successes = records
        .iter()
        .filter(|r| r.phase == Phase::Measured && r.is_success())
        .count();
    let verdict = |state, rule: String| Saturation {
        state,
        rule,
        rates,
        backlog,
        ttft_thirds: thirds,
    };
    if let Some(r) = rates.filter(|r| r.completed < SATURATION_FRACTION * r.scheduled) {
        return verdict(
            SaturationState::Saturated,
            format!(
                "completed {:.3} req/s < {:.0}% of the {:.3} req/s scheduled over the same requests",
                r.completed,
                SATURATION_FRACTION * 100.0,
                r.scheduled
            ),
        );
    }
    if let Some(b) = backlog.filter(|b| b.growing) {
        return verdict(
            SaturationState::Saturated,
            format!(
                "requests in flight kept growing ({:.1} → {:.1} from the first to the last third)",
                b.first_third, b.last_third
            ),
        );
    }
    if let Some((first, last)) = thirds.filter(|(f, l)| *l > 2.0 * f && l - f >= 100.0) {
        return verdict(
            SaturationState::Saturated,
            format!("TTFT kept rising (median {first:.0} → {last:.0} ms from the first to the last third)"),
        );
    }
    if successes < MIN_REQUESTS_TO_JUDGE || rates.is_none() {
        return verdict(
            SaturationState::Unclear,
            format!("{successes} successful requests: too few to tell"),
        );
    }
    let completed = rates.map_or(0.0, |r| r.completed / r.scheduled * 100.0);
    verdict(
        SaturationState::Unsaturated,
        format!(
            "completed {completed:.0}% of the scheduled rate over the same requests; requests \
             in flight and TTFT steady"
        ),
    )
}

/// The scheduled and completed rates of a level's measured requests (`reports::rates`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelRates {
    pub scheduled: f64,
    pub completed: f64,
}

/// The rates of [`LevelRates`]; `None` with fewer than two measured or successful requests.
pub fn level_rates(records: &[RequestRecord]) -> Option<LevelRates> {
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    Some(LevelRates {
        scheduled: reports::rates::scheduled(&measured)?,
        completed: reports::rates::completed(&measured)?,
    })
}

/// Requests in flight over a level's measured sends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backlog {
    /// Mean number of requests in flight over the first and the last third of the window.
    pub first_third: f64,
    pub last_third: f64,
    /// The last third exceeds the first by more than a stable queue's noise.
    pub growing: bool,
}

/// Samples taken over the measured sends.
const BACKLOG_SAMPLES: usize = 30;

/// The in-flight trend of a level: the number of requests sent and not yet ended (any phase),
/// sampled at evenly spaced instants from the first to the last measured send. It keeps
/// growing when the means of the three thirds rise (first < middle < last), the count at the
/// end (mean of the last 3 samples) is still at least the last third's mean, and the rise
/// from the first third to the last exceeds max(3·√(first + 1), first / 2): a stable queue's
/// count fluctuates by about its square root, and a burst near the end of the window has
/// drained (or is draining) by the end, while an overloaded queue is still climbing.
pub fn backlog_trend(records: &[RequestRecord]) -> Option<Backlog> {
    let sends: Vec<f64> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .map(|r| r.sent_ms)
        .collect();
    let start = sends.iter().copied().reduce(f64::min)?;
    let end = sends.iter().copied().reduce(f64::max)?;
    if end <= start {
        return None;
    }
    let in_flight = |t: f64| {
        records
            .iter()
            .filter(|r| r.sent_ms <= t && r.end_ms > t)
            .count() as f64
    };
    let samples: Vec<f64> = (0..BACKLOG_SAMPLES)
        .map(|i| in_flight(start + (end - start) * i as f64 / (BACKLOG_SAMPLES - 1) as f64))
        .collect();
    let third = BACKLOG_SAMPLES / 3;
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let first_third = mean(&samples[..third]);
    let middle_third = mean(&samples[third..BACKLOG_SAMPLES - third]);
    let last_third = mean(&samples[BACKLOG_SAMPLES - third..]);
    let at_end = mean(&samples[BACKLOG_SAMPLES - 3..]);
    let noise = (3.0 * (first_third + 1.0).sqrt()).max(first_third / 2.0);
    let rising = first_third < middle_third && middle_third < last_third && at_end >= last_third;
    Some(Backlog {
        first_third,
        last_third,
        growing: rising && last_third - first_third > noise,
    })
}

#[cfg(test)]
mod tests {
    use reports::records::{ChunkTokensSource, CountSource};

    use super::*;

    /// A measured request scheduled and sent at `sent_ms`, ending at `end_ms`.
    fn record(id: u64, sent_ms: f64, end_ms: f64) -> RequestRecord {
        RequestRecord {
            id,
            phase: Phase::Measured,
            scheduled_ms: sent_ms,
            queue_ms: 0.0,
            sent_ms,
            first_token_ms: Some(sent_ms + 1.0),
            first_answer_ms: Some(sent_ms + 1.0),
            end_ms,
            chunk_ms: vec![sent_ms + 1.0, end_ms],
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
            session: None,
            connect_ms: None,
            http_status: Some(200),
            error: None,
        }
    }

    /// 40 req/s for 5 s to a server that serves `capacity` req/s FIFO with 100 ms service.
    fn level(capacity: f64) -> Vec<RequestRecord> {
        let mut free_at: f64 = 0.0;
        (0..200)
            .map(|i| {
                let sent = i as f64 * 25.0;
                let start = free_at.max(sent);
                free_at = start + 1000.0 / capacity;
                record(i, sent, start + 100.0)
            })
            .collect()
    }

    #[test]
    fn backlog_grows_only_past_capacity() {
        let stable = backlog_trend(&level(50.0)).unwrap();
        assert!(!stable.growing, "{stable:?}");
        assert!((stable.first_third - 4.0).abs() <= 1.0, "{stable:?}");
        // 40 req/s offered, 30 served: 10 more waiting every second, about 33 over 5 s.
        let overloaded = backlog_trend(&level(30.0)).unwrap();
        assert!(overloaded.growing, "{overloaded:?}");
        assert!(
            overloaded.last_third - overloaded.first_third > 20.0,
            "{overloaded:?}"
        );
        assert_eq!(backlog_trend(&[]), None);
        // A stable level with a slow spell near the end (requests sent from 3.25 s to 4.4 s
        // take 500 ms) that has drained by the end of the window.
        let mut burst = level(50.0);
        for r in burst.iter_mut().filter(|r| (130..176).contains(&r.id)) {
            r.end_ms = r.sent_ms + 500.0;
        }
        let burst = backlog_trend(&burst).unwrap();
        let noise = 3.0 * (burst.first_third + 1.0).sqrt();
        assert!(burst.last_third - burst.first_third > noise, "{burst:?}");
        assert!(!burst.growing, "{burst:?}");
    }

    #[test]
    fn judge_names_the_rule_that_decided() {
        let fine = judge(&level(50.0));
        assert_eq!(fine.state, SaturationState::Unsaturated, "{fine:?}");
        let over = judge(&level(30.0));
        assert_eq!(over.state, SaturationState::Saturated);
        assert!(over.rule.starts_with("completed "), "{}", over.rule);
        assert_eq!(judge(&level(50.0)[..5]).state, SaturationState::Unclear);
        // At capacity: every request completes (no rate deficit) but TTFT climbs.
        let mut creeping = level(50.0);
        for r in &mut creeping {
            let delay = r.sent_ms / 10.0;
            r.first_token_ms = Some(r.sent_ms + 1.0 + delay);
        }
        let creeping = judge(&creeping);
        assert_eq!(creeping.state, SaturationState::Saturated, "{creeping:?}");
        assert!(
            creeping.rule.starts_with("TTFT kept rising"),
            "{}",
            creeping.rule
        );
    }

    #[test]
    fn level_rates_compare_the_same_requests() {
        let rates = level_rates(&level(50.0)).unwrap();
        assert!((rates.scheduled - 40.0).abs() < 1e-9);
        assert!((rates.completed - 40.0).abs() < 1e-9);
        let rates = level_rates(&level(30.0)).unwrap();
        assert!((rates.completed - 30.0).abs() < 1e-9, "{rates:?}");
        let mut failed = level(50.0);
        for r in failed.iter_mut().skip(1).step_by(2) {
            r.error = Some(reports::records::RequestError {
                kind: reports::records::ErrorKind::Http5xx,
                message: "500".into(),
            });
        }
        let rates = level_rates(&failed).unwrap();
        assert!((rates.completed - 20.0).abs() < 0.2, "{rates:?}");
    }
}
