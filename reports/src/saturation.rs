//! Whether a sweep level kept up with the rate its schedule held: a tested verdict, each
//! rule firing only on evidence beyond noise (one-sided, p < [`SATURATION_P`] were the
//! errors independent; near capacity they are not, and the amounts that matter guard against
//! what that inflates) by an amount that matters.
//!
//! - **Completed below scheduled.** Over the measured requests, the least-squares slope of
//!   the successful ends on their scheduled sends is 1 for a server that keeps up (an end is
//!   its send plus a latency that does not grow) and scheduled / completed for one that does
//!   not; the completed share of the schedule is (successes / requests) / slope. The rule
//!   fires when that share is below [`SATURATION_FRACTION`] and below 1 beyond its standard
//!   error (the slope's, and the binomial error of the successes).
//! - **A growing backlog.** The requests in flight (sent, not yet ended), sampled evenly over
//!   the measured sends, rise from the first third to the last beyond a stable queue's noise
//!   and still stand at the end (see [`backlog_trend`]), with a significant slope over time.
//! - **TTFT rising.** At exactly the capacity a queue grows only like √t, which the backlog
//!   test can miss: the TTFTs of the requests sent in the last third of the window are
//!   larger than the first third's (a one-sided Mann–Whitney test) by a rise of the median
//!   that matters: half the SLO's TTFT limit, or without one a doubling of at least 100 ms.
//!
//! When the server's waiting gauge was scraped (at least [`MIN_SCRAPES_FOR_GAUGE`] times
//! inside the window) and read 0 throughout, every request succeeded and none waited for the
//! client's own concurrency cap, the server queued nothing, and that vetoes every rule: a continuous-batching server admits every request
//! then, and the latencies of a batch still growing to its steady size rise through the
//! window (the ends lag the sends, TTFT climbs) without any queue; the SLO judges them. On the
//! default demo such levels completed 94–95% of their schedule by the slope of their ends,
//! which the first rule alone would call saturated.
//!
//! [`judge`] combines them into saturated, unsaturated or unclear (too few requests to
//! tell), and keeps the rule that decided with its numbers.

use crate::records::{Phase, RequestRecord};
use crate::stats::{mann_whitney_u, median, ols_slope};
use serde::{Deserialize, Serialize};

/// A level saturates when it completes less than this fraction of its scheduled rate.
pub const SATURATION_FRACTION: f64 = 0.95;

/// Fewer successful measured requests than this: too few to call a level either way.
pub const MIN_REQUESTS_TO_JUDGE: usize = 10;

/// The one-sided false-positive rate of each saturation rule's test.
pub const SATURATION_P: f64 = 0.01;

/// The standard normal's upper [`SATURATION_P`] quantile.
const Z_SATURATION: f64 = 2.326_347_874;

/// A request that waited this long (ms) before its send task started waited for the client's
/// own `--max-concurrency`; every send takes a few microseconds to start.
pub const CLIENT_QUEUE_MS: f64 = 1.0;

/// Scrapes inside the window from which the waiting gauge speaks for it.
pub const MIN_SCRAPES_FOR_GAUGE: usize = 3;

/// A TTFT rise matters from this fraction of the SLO's TTFT limit.
pub const TTFT_RISE_OF_LIMIT: f64 = 0.5;

/// Whether a level kept up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaturationState {
    Saturated,
    Unsaturated,
    Unclear,
}

/// What the judgement knows besides the records.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JudgeContext {
    /// The SLO's TTFT limit (ms), the smallest when it has several.
    pub ttft_limit_ms: Option<f64>,
    /// The server's waiting gauge, its largest value scraped inside the measured window.
    pub waiting_max: Option<f64>,
}

impl JudgeContext {
    /// The context of a level under `slo`, with `window_server` the server's view of the
    /// scrapes inside its measured window.
    pub fn new(
        slo: Option<&crate::slo::SloSpec>,
        window_server: Option<&crate::server_metrics::ServerView>,
    ) -> JudgeContext {
        JudgeContext {
            ttft_limit_ms: slo.and_then(|s| {
                s.targets
                    .iter()
                    .filter(|t| t.metric == crate::metrics::SloMetric::Ttft)
                    .map(|t| t.limit_ms)
                    .reduce(f64::min)
            }),
            waiting_max: window_server
                .filter(|v| v.scrapes >= MIN_SCRAPES_FOR_GAUGE)
                .and_then(|v| v.get("requests waiting"))
                .map(|q| q.max),
        }
    }
}

/// The saturation verdict of a level and the rule that decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saturation {
    pub state: SaturationState,
    pub rule: String,
    pub rates: Option<LevelRates>,
    /// The completed share of the schedule and its test.
    #[serde(default)]
    pub completion: Option<Completion>,
    pub backlog: Option<Backlog>,
    /// TTFT of the first and the last third of the window, and its test.
    #[serde(default)]
    pub ttft_trend: Option<TtftTrend>,
    /// The server's waiting gauge, its largest value inside the window, when scraped.
    #[serde(default)]
    pub waiting_max: Option<f64>,
}

/// The completed share of a level's schedule (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// (successes / requests) / the slope of ends on scheduled sends.
    pub share: f64,
    /// (1 − share) / its standard error.
    pub z: f64,
}

/// The TTFT of the requests sent in the first and the last third of the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TtftTrend {
    pub first_median_ms: f64,
    pub last_median_ms: f64,
    /// One-sided Mann–Whitney p-value of the last third being larger.
    pub p_value: f64,
}

fn measured_successes(records: &[RequestRecord]) -> Vec<&RequestRecord> {
    records
        .iter()
        .filter(|r| r.phase == Phase::Measured && r.is_success())
        .collect()
}

/// The completed share of the schedule (see the module doc); `None` with fewer than three
/// successes or no spread in their sends.
pub fn completion(records: &[RequestRecord]) -> Option<Completion> {
    let requests = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .count();
    let ok = measured_successes(records);
    let scheduled: Vec<f64> = ok.iter().map(|r| r.scheduled_ms).collect();
    let ends: Vec<f64> = ok.iter().map(|r| r.end_ms).collect();
    let fit = ols_slope(&scheduled, &ends)?;
    if fit.slope <= 0.0 {
        return None;
    }
    let kept = ok.len() as f64 / requests as f64;
    let share = kept / fit.slope;
    let relative_error =
        ((fit.standard_error / fit.slope).powi(2) + (1.0 - kept) / ok.len() as f64).sqrt();
    let error = share * relative_error;
    let z = if error > 0.0 {
        (1.0 - share) / error
    } else if share < 1.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Some(Completion { share, z })
}

/// The TTFT trend of a level's measured successful requests, by send time.
pub fn ttft_trend(records: &[RequestRecord]) -> Option<TtftTrend> {
    let ok = measured_successes(records);
    let start = ok.iter().map(|r| r.sent_ms).reduce(f64::min)?;
    let end = ok.iter().map(|r| r.sent_ms).reduce(f64::max)?;
    let third = (end - start) / 3.0;
    let ttft_in = |lo: f64, hi: f64| -> Vec<f64> {
        ok.iter()
            .filter(|r| r.sent_ms >= lo && r.sent_ms <= hi)
            .filter_map(|r| Some(r.first_token_ms? - r.sent_ms))
            .collect()
    };
    let (first, last) = (ttft_in(start, start + third), ttft_in(end - third, end));
    let test = mann_whitney_u(&first, &last)?;
    let p_value = if test.direction > 0 {
        test.p_value / 2.0
    } else {
        1.0 - test.p_value / 2.0
    };
    Some(TtftTrend {
        first_median_ms: median(&first)?,
        last_median_ms: median(&last)?,
        p_value,
    })
}

/// The TTFT rise from the first third's median to the last's that matters.
fn rise_that_matters(trend: &TtftTrend, ttft_limit_ms: Option<f64>) -> bool {
    let rise = trend.last_median_ms - trend.first_median_ms;
    match ttft_limit_ms {
        Some(limit) => rise >= TTFT_RISE_OF_LIMIT * limit,
        None => trend.last_median_ms > 2.0 * trend.first_median_ms && rise >= 100.0,
    }
}

/// The saturation verdict of a level's records (see the module doc).
pub fn judge(records: &[RequestRecord], context: JudgeContext) -> Saturation {
    let rates = level_rates(records);
    let completion = completion(records);
    let backlog = backlog_trend(records);
    let trend = ttft_trend(records);
    let successes = measured_successes(records).len();
    let verdict = |state, rule: String| Saturation {
        state,
        rule,
        rates,
        completion,
        backlog,
        ttft_trend: trend,
        waiting_max: context.waiting_max,
    };
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    // The gauge speaks for the server's queue only: a request that failed, or waited for the
    // client's own --max-concurrency, is a deficit it cannot show.
    let nothing_else_queued = measured
        .iter()
        .all(|r| r.is_success() && r.queue_ms < CLIENT_QUEUE_MS);
    if context.waiting_max == Some(0.0) && nothing_else_queued && successes >= MIN_REQUESTS_TO_JUDGE
    {
        return verdict(
            SaturationState::Unsaturated,
            "the server's waiting gauge read 0 throughout the window: it queued nothing, so \
             whatever its latencies did (a batch still growing to its steady size) the SLO \
             judges them"
                .into(),
        );
    }
    if let Some(c) = completion.filter(|c| c.share < SATURATION_FRACTION && c.z > Z_SATURATION) {
        return verdict(
            SaturationState::Saturated,
            format!(
                "completed {:.1}% of the scheduled rate (< {:.0}%, {:.1} standard errors below \
                 100%, p < {SATURATION_P})",
                c.share * 100.0,
                SATURATION_FRACTION * 100.0,
                c.z
            ),
        );
    }
    if let Some(b) = backlog.filter(|b| b.growing) {
        return verdict(
            SaturationState::Saturated,
            format!(
                "requests in flight kept growing ({:.1} → {:.1} from the first to the last \
                 third, slope t = {:.1}, p < {SATURATION_P})",
                b.first_third, b.last_third, b.slope_t
            ),
        );
    }
    if let Some(t) = trend.filter(|t| t.p_value < SATURATION_P) {
        if rise_that_matters(&t, context.ttft_limit_ms) {
            let against = context.ttft_limit_ms.map_or(String::new(), |limit| {
                format!(
                    ", ≥ {:.0}% of the {limit:.0} ms limit",
                    TTFT_RISE_OF_LIMIT * 100.0
                )
            });
            return verdict(
                SaturationState::Saturated,
                format!(
                    "TTFT kept rising (median {:.0} → {:.0} ms from the first to the last \
                     third{against}; Mann–Whitney p = {:.2e})",
                    t.first_median_ms, t.last_median_ms, t.p_value
                ),
            );
        }
    }
    if successes < MIN_REQUESTS_TO_JUDGE || rates.is_none() {
        return verdict(
            SaturationState::Unclear,
            format!("{successes} successful requests: too few to tell"),
        );
    }
    let share = completion.map_or(String::from("–"), |c| format!("{:.0}%", c.share * 100.0));
    verdict(
        SaturationState::Unsaturated,
        format!(
            "completed {share} of the scheduled rate; requests in flight and TTFT with no \
             significant rise"
        ),
    )
}

/// The scheduled and completed rates of a level's measured requests (`crate::rates`).
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
        scheduled: crate::rates::scheduled(&measured)?,
        completed: crate::rates::completed(&measured)?,
    })
}

/// Requests in flight over a level's measured sends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backlog {
    /// Mean number of requests in flight over the first and the last third of the window.
    pub first_third: f64,
    pub last_third: f64,
    /// The least-squares slope of the samples over time, over its standard error.
    #[serde(default)]
    pub slope_t: f64,
    /// The last third exceeds the first by more than a stable queue's noise, and the slope
    /// is significant.
    pub growing: bool,
}

/// Samples taken over the measured sends.
const BACKLOG_SAMPLES: usize = 30;

/// The in-flight trend of a level: the number of requests sent and not yet ended (any phase),
/// sampled at evenly spaced instants from the first to the last measured send. It keeps
/// growing when the means of the three thirds rise (first < middle < last), the count at the
/// end (mean of the last 3 samples) is still at least the last third's mean, the rise from
/// the first third to the last exceeds max(3·√(first + 1), first / 2), and the samples'
/// slope over time is significant (one-sided, p < [`SATURATION_P`]): a stable queue's count
/// fluctuates by about its square root, and a burst near the end of the window has drained
/// (or is draining) by the end, while an overloaded queue is still climbing.
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
    let instants: Vec<f64> = (0..BACKLOG_SAMPLES)
        .map(|i| start + (end - start) * i as f64 / (BACKLOG_SAMPLES - 1) as f64)
        .collect();
    let samples: Vec<f64> = instants.iter().map(|&t| in_flight(t)).collect();
    let third = BACKLOG_SAMPLES / 3;
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let first_third = mean(&samples[..third]);
    let middle_third = mean(&samples[third..BACKLOG_SAMPLES - third]);
    let last_third = mean(&samples[BACKLOG_SAMPLES - third..]);
    let at_end = mean(&samples[BACKLOG_SAMPLES - 3..]);
    let noise = (3.0 * (first_third + 1.0).sqrt()).max(first_third / 2.0);
    let rising = first_third < middle_third && middle_third < last_third && at_end >= last_third;
    let slope_t = ols_slope(&instants, &samples).map_or(0.0, |s| {
        if s.standard_error > 0.0 {
            s.t()
        } else if s.slope > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    });
    Some(Backlog {
        first_third,
        last_third,
        slope_t,
        growing: rising && last_third - first_third > noise && slope_t > Z_SATURATION,
    })
}

#[cfg(test)]
mod tests {
    use crate::records::{ChunkTokensSource, CountSource};

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
        let none = JudgeContext::default();
        let fine = judge(&level(50.0), none);
        assert_eq!(fine.state, SaturationState::Unsaturated, "{fine:?}");
        let over = judge(&level(30.0), none);
        assert_eq!(over.state, SaturationState::Saturated);
        assert!(over.rule.starts_with("completed "), "{}", over.rule);
        assert_eq!(
            judge(&level(50.0)[..5], none).state,
            SaturationState::Unclear
        );
        // At capacity: every request completes (no rate deficit) but TTFT climbs.
        let mut creeping = level(50.0);
        for r in &mut creeping {
            let delay = r.sent_ms / 10.0;
            r.first_token_ms = Some(r.sent_ms + 1.0 + delay);
        }
        let judged = judge(&creeping, none);
        assert_eq!(judged.state, SaturationState::Saturated, "{judged:?}");
        assert!(
            judged.rule.starts_with("TTFT kept rising"),
            "{}",
            judged.rule
        );
        // The same rise (about 70 → 400 ms) against a 2 s TTFT limit does not matter: a
        // level climbing to its steady state is not saturated for it.
        let limit = JudgeContext {
            ttft_limit_ms: Some(2000.0),
            waiting_max: None,
        };
        let judged = judge(&creeping, limit);
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
        // Against a 600 ms limit it does (≥ 300 ms), unless the server's waiting gauge read
        // 0 throughout: then nothing queued.
        let tight = JudgeContext {
            ttft_limit_ms: Some(600.0),
            waiting_max: None,
        };
        assert_eq!(judge(&creeping, tight).state, SaturationState::Saturated);
        let idle = JudgeContext {
            waiting_max: Some(0.0),
            ..tight
        };
        let judged = judge(&creeping, idle);
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
        assert!(
            judged.rule.contains("waiting gauge read 0"),
            "{}",
            judged.rule
        );
        let queued = JudgeContext {
            waiting_max: Some(3.0),
            ..tight
        };
        assert_eq!(judge(&creeping, queued).state, SaturationState::Saturated);
        // Every send task takes microseconds to start: that is no client queue, and the
        // veto holds; a request held 50 ms by the client's --max-concurrency lifts it.
        for r in &mut creeping {
            r.queue_ms = 0.012;
        }
        assert_eq!(judge(&creeping, idle).state, SaturationState::Unsaturated);
        creeping[100].queue_ms = 50.0;
        assert_eq!(judge(&creeping, idle).state, SaturationState::Saturated);
    }

    #[test]
    fn a_slow_end_of_a_level_that_keeps_up_is_noise_not_a_deficit() {
        // 200 requests at 40 req/s served at 50 req/s, whose last one ends 400 ms late: the
        // old two-end rate (199 / 5.37 s = 37.1 req/s, < 95% of 40) would call it saturated;
        // the slope of ends on sends barely moves.
        let mut late = level(50.0);
        late.last_mut().unwrap().end_ms += 400.0;
        let rates = level_rates(&late).unwrap();
        assert!(
            rates.completed < SATURATION_FRACTION * rates.scheduled,
            "{rates:?}"
        );
        let c = completion(&late).unwrap();
        assert!(c.share > 0.99, "{c:?}");
        let judged = judge(&late, JudgeContext::default());
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
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
            r.error = Some(crate::records::RequestError {
                kind: crate::records::ErrorKind::Http5xx,
                message: "500".into(),
            });
        }
        let rates = level_rates(&failed).unwrap();
        assert!((rates.completed - 20.0).abs() < 0.2, "{rates:?}");
    }
}
