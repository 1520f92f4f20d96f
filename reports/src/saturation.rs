//! Whether a sweep level kept up with the rate its schedule held: a tested verdict, each
//! rule firing only on evidence beyond noise at a stated false-positive rate, by an amount
//! that matters.
//!
//! - **Asked beyond the server's capacity.** While some request waits for the server (sent,
//!   not yet admitted), every slot or batch place is taken, so the successful ends in that
//!   time come at the server's capacity. The capacity is those ends per second of queued
//!   time, over the measured sends; the level's utilisation is its scheduled rate over that
//!   capacity. The rule fires when the utilisation exceeds 1 and exceeds a margin beyond its
//!   standard error (one-sided p < [`SATURATION_P`], the ends counted as Poisson). A level
//!   whose requests waited for less than [`MIN_QUEUED_SHARE`] of the window, or through fewer
//!   than [`MIN_REQUESTS_TO_JUDGE`] ends, has no capacity read: it had room.
//!   - A request waited, as the client sees it, for its TTFT beyond the level's quickest (that
//!     of a request that found the server free). That is exact for a server that starts a
//!     request when it admits it; a continuous-batching server's TTFT also stretches while
//!     it prefills other prompts, and those stretches come when its ends are slow, so read
//!     alone they show time as queued in which ends come below the capacity (on our engine,
//!     "capacities" of a third of its throughput).
//!   - Where the server's waiting gauge was scraped, the queued time is only that in which
//!     both say requests waited: the gauge's own queue, each reading above 0 standing for
//!     the half-gaps to its neighbours. A request the client's own `--max-concurrency` held
//!     (sent later than scheduled) waited too, where no gauge sees: that time counts as well.
//!   - Where the gauge read above 0 at [`GAUGE_QUEUED_SHARE`] of the window's scrapes or
//!     more, the margin is [`UTILISATION_MARGIN`]: a level at ≤ 90% utilisation is called
//!     saturated in at most 1% of runs, and one at ≥ 109% in nearly all of a 25-s window's
//!     (`loadgen/tests/coverage.rs` measures both); between, no window of that length can
//!     tell. Otherwise the margin is 1.
//! - **Requests the server did not carry.** Fewer than [`SATURATION_FRACTION`] of the measured
//!   requests were carried, beyond their binomial error: the rest were refused (a refused
//!   connection, 429, 5xx), timed out or cut off. A failure the server would give at any load
//!   (another 4xx, an answer that does not parse) or the run's own stop says nothing of it.
//! - **Without first tokens** (a run that does not stream), no wait can be seen, and the
//!   older rules decide: the completed share of the schedule (the least-squares slope of
//!   the successful ends on their scheduled sends is 1 for a server that keeps up and
//!   scheduled / completed for one that does not) below [`SATURATION_FRACTION`] beyond its
//!   standard error, or requests in flight growing ([`backlog_trend`]). Their tests assume
//!   independent samples, which a queue near capacity does not give: on the simulated server
//!   of the coverage test they fired on 2% of levels at 80% utilisation.
//!
//! Why not a trend of TTFT or of the backlog with a fixed p-value: near capacity a queue's
//! own fluctuations last about as long as the window, so such a trend is autocorrelated and
//! its p-value far too small. On the coverage test's server, a Mann–Whitney test of TTFT
//! between the window's thirds (p < 0.01, a rise of half the SLO's TTFT limit) called 8% of
//! levels at 80% utilisation saturated.
//!
//! When the server's waiting gauge was scraped (at least [`MIN_SCRAPES_FOR_GAUGE`] times
//! inside the window) and read 0 throughout, every request succeeded and none waited for the
//! client's own concurrency cap, the server queued nothing, and that vetoes every rule: a
//! continuous-batching server admits every request then, and the latencies of a batch still
//! growing to its steady size rise through the window without any queue; the SLO judges them.
//!
//! [`judge`] combines them into saturated, unsaturated or unclear (too few requests to
//! tell), and keeps the rule that decided with its numbers.

use crate::records::{Phase, RequestRecord};
use crate::stats::ols_slope;
use serde::{Deserialize, Serialize};

/// A level saturates when fewer than this fraction of its requests succeed, or (without
/// first tokens) it completes less than this fraction of its scheduled rate.
pub const SATURATION_FRACTION: f64 = 0.95;

/// Fewer successful measured requests than this: too few to call a level either way; fewer
/// ends while requests waited: too little queued time to measure the capacity.
pub const MIN_REQUESTS_TO_JUDGE: usize = 10;

/// The one-sided false-positive rate of each saturation rule's test.
pub const SATURATION_P: f64 = 0.01;

/// The utilisation the capacity rule must exceed beyond noise where the server's waiting
/// gauge shows a queue through the window: below it, a level is called saturated in fewer
/// than [`SATURATION_P`] of runs.
pub const UTILISATION_MARGIN: f64 = 0.9;

/// The share of a window's scrapes whose waiting gauge must read above 0 for the gauge to
/// show a queue through the window.
pub const GAUGE_QUEUED_SHARE: f64 = 0.5;

/// The standard normal's upper [`SATURATION_P`] quantile.
const Z_SATURATION: f64 = 2.326_347_874;

/// A request that waited this long (ms) before its send task started waited for the client's
/// own `--max-concurrency`; every send takes a few microseconds to start.
pub const CLIENT_QUEUE_MS: f64 = 1.0;

/// The share of the measured sends' span that requests must have waited for a capacity to be
/// read from it: a server asked beyond its capacity keeps a queue through most of the window
/// once one forms, while a level that waited less was caught in a burst or in the client's own
/// timing noise (a few ends that happen to fall in a millisecond's wait say nothing of a
/// capacity).
pub const MIN_QUEUED_SHARE: f64 = 0.25;

/// Scrapes inside the window from which the waiting gauge speaks for it.
pub const MIN_SCRAPES_FOR_GAUGE: usize = 3;

/// Whether a level kept up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaturationState {
    Saturated,
    Unsaturated,
    Unclear,
}

/// What the judgement knows besides the records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JudgeContext {
    /// The server's waiting gauge over the scrapes inside the measured window, when at
    /// least [`MIN_SCRAPES_FOR_GAUGE`] of them read it.
    pub waiting: Option<WaitingGauge>,
}

/// The server's waiting gauge over a level's window.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingGauge {
    /// Its readings in time order: (ms on the records' clock, requests waiting).
    pub readings: Vec<(f64, f64)>,
}

impl WaitingGauge {
    /// Its largest reading.
    pub fn max(&self) -> f64 {
        self.readings.iter().map(|r| r.1).fold(0.0, f64::max)
    }

    /// The share of its readings above 0.
    pub fn nonzero_share(&self) -> f64 {
        let nonzero = self.readings.iter().filter(|r| r.1 > 0.0).count();
        nonzero as f64 / self.readings.len().max(1) as f64
    }

    /// The time (records' ms, merged, in order) the gauge says requests waited: each reading
    /// above 0 stands for half the median gap between scrapes on either side of it.
    fn queued_spans(&self) -> Vec<(f64, f64)> {
        let times: Vec<f64> = self.readings.iter().map(|r| r.0).collect();
        let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort_by(f64::total_cmp);
        let half_gap = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0) / 2.0;
        merged(
            self.readings
                .iter()
                .filter(|r| r.1 > 0.0)
                .map(|r| (r.0 - half_gap, r.0 + half_gap))
                .collect(),
        )
    }
}

impl JudgeContext {
    /// The context of a level, from the scrapes inside its measured window and the run's
    /// origin (Unix ms; the records count from it).
    pub fn new(
        window_scrapes: &[crate::server_metrics::Scrape],
        origin_unix_ms: Option<f64>,
    ) -> JudgeContext {
        let waiting = origin_unix_ms
            .and_then(|origin| {
                let readings = crate::server_metrics::readings(window_scrapes, "requests waiting")?;
                Some(WaitingGauge {
                    readings: readings.into_iter().map(|(t, v)| (t - origin, v)).collect(),
                })
            })
            .filter(|g| g.readings.len() >= MIN_SCRAPES_FOR_GAUGE);
        JudgeContext { waiting }
    }

    /// Whether the gauge read above 0 at [`GAUGE_QUEUED_SHARE`] of its scrapes or more.
    fn gauge_shows_a_queue(&self) -> bool {
        self.waiting
            .as_ref()
            .is_some_and(|w| w.nonzero_share() >= GAUGE_QUEUED_SHARE)
    }
}

/// `spans` sorted and merged where they touch.
fn merged(mut spans: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (from, to) in spans {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}

/// The time both merged, ordered span lists cover.
fn intersection(a: &[(f64, f64)], b: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (from, to) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if from < to {
            out.push((from, to));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The saturation verdict of a level and the rule that decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saturation {
    pub state: SaturationState,
    pub rule: String,
    pub rates: Option<LevelRates>,
    /// The server's capacity while requests waited, and the level's utilisation of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<QueuedCapacity>,
    /// The completed share of the schedule and its test.
    #[serde(default)]
    pub completion: Option<Completion>,
    pub backlog: Option<Backlog>,
    /// The server's waiting gauge, its largest value inside the window, when it was read there
    /// [`MIN_SCRAPES_FOR_GAUGE`] times or more.
    #[serde(default)]
    pub waiting_max: Option<f64>,
    /// The share of the window's scrapes whose waiting gauge read above 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_nonzero_share: Option<f64>,
}

/// The server's capacity while requests waited for it (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueuedCapacity {
    /// Seconds of the measured sends' span during which some request waited.
    pub queued_s: f64,
    /// The successful ends inside that time.
    pub ends: usize,
    /// `ends / queued_s`, requests/s.
    pub rate: f64,
    /// The scheduled rate over `rate`.
    pub utilisation: f64,
    /// The utilisation tested against: [`UTILISATION_MARGIN`] where the waiting gauge shows
    /// a queue through the window, else 1.
    pub margin: f64,
    /// (utilisation − margin) / its standard error there (the ends counted as Poisson).
    pub z: f64,
}

/// The completed share of a level's schedule (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// (successes / requests) / the slope of ends on scheduled sends.
    pub share: f64,
    /// (1 − share) / its standard error.
    pub z: f64,
}

fn measured_successes(records: &[RequestRecord]) -> Vec<&RequestRecord> {
    records
        .iter()
        .filter(|r| r.phase == Phase::Measured && r.is_success())
        .collect()
}

/// The server's capacity while requests waited (see the module doc); `None` without a
/// scheduled rate, without first tokens, or with fewer than [`MIN_REQUESTS_TO_JUDGE`] ends
/// while requests waited or less than [`MIN_QUEUED_SHARE`] of the sends' span queued.
pub fn queued_capacity(
    records: &[RequestRecord],
    waiting: Option<&WaitingGauge>,
    margin: f64,
) -> Option<QueuedCapacity> {
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    let scheduled = crate::rates::scheduled(&measured)?;
    let start = measured.iter().map(|r| r.sent_ms).reduce(f64::min)?;
    let end = measured.iter().map(|r| r.sent_ms).reduce(f64::max)?;
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.is_success()).collect();
    let quickest = ok
        .iter()
        .filter_map(|r| Some(r.first_token_ms? - r.sent_ms))
        .reduce(f64::min)?;
    let waits = merged(
        ok.iter()
            .filter_map(|r| {
                let began = r.first_token_ms? - quickest;
                (began.min(end) > r.sent_ms.max(start))
                    .then(|| (r.sent_ms.max(start), began.min(end)))
            })
            .collect(),
    );
    let at_server = match waiting {
        Some(gauge) => intersection(&waits, &gauge.queued_spans()),
        None => waits,
    };
    // A request the client's own --max-concurrency held waited too, where no gauge sees.
    let at_client = records
        .iter()
        .filter(|r| r.queue_ms >= CLIENT_QUEUE_MS)
        .map(|r| ((r.sent_ms - r.queue_ms).max(start), r.sent_ms.min(end)))
        .filter(|(from, to)| to > from);
    let queued = merged(at_server.into_iter().chain(at_client).collect());
    let queued_s = queued.iter().map(|(from, to)| to - from).sum::<f64>() / 1000.0;
    let ends = ok
        .iter()
        .filter(|r| {
            let i = queued.partition_point(|(from, _)| *from < r.end_ms);
            i > 0 && r.end_ms <= queued[i - 1].1
        })
        .count();
    if ends < MIN_REQUESTS_TO_JUDGE || queued_s < MIN_QUEUED_SHARE * (end - start) / 1000.0 {
        return None;
    }
    let rate = ends as f64 / queued_s;
    let utilisation = scheduled / rate;
    Some(QueuedCapacity {
        queued_s,
        ends,
        rate,
        utilisation,
        margin,
        z: (utilisation - margin) / (margin / (ends as f64).sqrt()),
    })
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

/// The saturation verdict of a level's records (see the module doc).
pub fn judge(records: &[RequestRecord], context: &JudgeContext) -> Saturation {
    let rates = level_rates(records);
    let margin = if context.gauge_shows_a_queue() {
        UTILISATION_MARGIN
    } else {
        1.0
    };
    let capacity = queued_capacity(records, context.waiting.as_ref(), margin);
    let completion = completion(records);
    let backlog = backlog_trend(records);
    let successes = measured_successes(records).len();
    let verdict = |state, rule: String| Saturation {
        state,
        rule,
        rates,
        capacity,
        completion,
        backlog,
        waiting_max: context.waiting.as_ref().map(WaitingGauge::max),
        waiting_nonzero_share: context.waiting.as_ref().map(WaitingGauge::nonzero_share),
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
    if context.waiting.as_ref().is_some_and(|w| w.max() == 0.0)
        && nothing_else_queued
        && successes >= MIN_REQUESTS_TO_JUDGE
    {
        return verdict(
            SaturationState::Unsaturated,
            "the server's waiting gauge read 0 throughout the window: it queued nothing, so \
             whatever its latencies did (a batch still growing to its steady size) the SLO \
             judges them"
                .into(),
        );
    }
    if let Some(c) = capacity.filter(|c| c.utilisation > 1.0 && c.z > Z_SATURATION) {
        return verdict(
            SaturationState::Saturated,
            format!(
                "asked {:.0}% of the server's capacity ({:.3} req/s: {} ends in the {:.1} s \
                 during which requests waited{}; > {:.0}% at {:.1} standard errors, p < \
                 {SATURATION_P})",
                c.utilisation * 100.0,
                c.rate,
                c.ends,
                c.queued_s,
                wait_source(context),
                c.margin * 100.0,
                c.z
            ),
        );
    }
    let requests = measured.len();
    let refused = measured
        .iter()
        .filter(|r| r.error.as_ref().is_some_and(|e| server_refusal(e.kind)))
        .count();
    if requests > 0 {
        let carried = requests - refused;
        let kept = carried as f64 / requests as f64;
        let error = (SATURATION_FRACTION * (1.0 - SATURATION_FRACTION) / requests as f64).sqrt();
        if (SATURATION_FRACTION - kept) / error > Z_SATURATION {
            return verdict(
                SaturationState::Saturated,
                format!(
                    "{carried} of {requests} requests carried ({:.1}% < {:.0}%, p < \
                     {SATURATION_P}; the rest refused, timed out or cut off)",
                    kept * 100.0,
                    SATURATION_FRACTION * 100.0
                ),
            );
        }
    }
    let first_tokens = measured.iter().any(|r| r.first_token_ms.is_some());
    if !first_tokens {
        if let Some(c) = completion.filter(|c| c.share < SATURATION_FRACTION && c.z > Z_SATURATION)
        {
            return verdict(
                SaturationState::Saturated,
                format!(
                    "completed {:.1}% of the scheduled rate (< {:.0}%, {:.1} standard errors \
                     below 100%, p < {SATURATION_P}; no first tokens to see a queue by)",
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
                     third, slope t = {:.1}, p < {SATURATION_P}; no first tokens to see a queue \
                     by)",
                    b.first_third, b.last_third, b.slope_t
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
    let why = match capacity {
        Some(c) => format!(
            "asked {:.0}% of the server's capacity ({:.3} req/s while requests waited{}, {:.1} \
             s): not beyond {:.0}% at p < {SATURATION_P}",
            c.utilisation * 100.0,
            c.rate,
            wait_source(context),
            c.queued_s,
            c.margin * 100.0
        ),
        None if first_tokens => format!(
            "requests waited for the server{} too briefly to read a capacity (under {:.0}% of \
             the window, or fewer than {MIN_REQUESTS_TO_JUDGE} ends meanwhile): it had room",
            wait_source(context),
            MIN_QUEUED_SHARE * 100.0
        ),
        None => {
            let share =
                completion.map_or(String::from("–"), |c| format!("{:.0}%", c.share * 100.0));
            format!("completed {share} of the scheduled rate; requests in flight not growing")
        }
    };
    verdict(SaturationState::Unsaturated, why)
}

/// Whether a failure is the server not carrying a request (refused, timed out, cut off), rather
/// than one it would never serve (a 404, a body it cannot parse) or the run's own stop.
pub(crate) fn server_refusal(kind: crate::records::ErrorKind) -> bool {
    use crate::records::ErrorKind;
    matches!(
        kind,
        ErrorKind::Connect
            | ErrorKind::Http429
            | ErrorKind::Http5xx
            | ErrorKind::Timeout
            | ErrorKind::StreamCut
    )
}

/// Where the queued time was read from, for a rule's text.
fn wait_source(context: &JudgeContext) -> &'static str {
    if context.waiting.is_some() {
        " (by their TTFT and the waiting gauge)"
    } else {
        " (by their TTFT alone: no waiting gauge read 3 times in the window)"
    }
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
            server_timing: None,
            session: None,
            class: None,
            connect_ms: None,
            http_status: Some(200),
            error: None,
        }
    }

    /// 40 req/s for 5 s to a server that starts `capacity` requests/s FIFO, each answering
    /// its first token 1 ms after its start and ending 100 ms after it.
    fn level(capacity: f64) -> Vec<RequestRecord> {
        let mut free_at: f64 = 0.0;
        (0..200)
            .map(|i| {
                let sent = i as f64 * 25.0;
                let start = free_at.max(sent);
                free_at = start + 1000.0 / capacity;
                let mut r = record(i, sent, start + 100.0);
                r.first_token_ms = Some(start + 1.0);
                r.first_answer_ms = r.first_token_ms;
                r
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

    /// A waiting gauge scraped every 500 ms over [`level`]'s 5 s, reading `at(ms)`.
    fn gauge(at: impl Fn(f64) -> f64) -> JudgeContext {
        JudgeContext {
            waiting: Some(WaitingGauge {
                readings: (0..=10)
                    .map(|k| {
                        let t = k as f64 * 500.0;
                        (t, at(t))
                    })
                    .collect(),
            }),
        }
    }

    #[test]
    fn judge_names_the_rule_that_decided() {
        let none = JudgeContext::default();
        let fine = judge(&level(50.0), &none);
        assert_eq!(fine.state, SaturationState::Unsaturated, "{fine:?}");
        assert_eq!(fine.capacity, None, "nobody waited: {fine:?}");
        // 40 req/s asked of a server that carries 30: while requests wait it ends 30 a second.
        let over = judge(&level(30.0), &none);
        assert_eq!(over.state, SaturationState::Saturated, "{over:?}");
        assert!(over.rule.starts_with("asked 13"), "{}", over.rule);
        let capacity = over.capacity.unwrap();
        assert!((capacity.rate - 30.0).abs() < 1.0, "{capacity:?}");
        assert!(
            (capacity.utilisation - 4.0 / 3.0).abs() < 0.05,
            "{capacity:?}"
        );
        assert_eq!(
            judge(&level(50.0)[..5], &none).state,
            SaturationState::Unclear
        );
        // Half the requests failed: the server did not carry them.
        let mut failing = level(50.0);
        for r in failing.iter_mut().skip(1).step_by(2) {
            r.error = Some(crate::records::RequestError {
                kind: crate::records::ErrorKind::Http5xx,
                message: "500".into(),
            });
        }
        let judged = judge(&failing, &none);
        assert_eq!(judged.state, SaturationState::Saturated, "{judged:?}");
        assert!(
            judged.rule.starts_with("100 of 200 requests carried"),
            "{}",
            judged.rule
        );
        // Without first tokens no wait shows, and the completed share decides.
        let mut unstreamed = level(30.0);
        for r in &mut unstreamed {
            r.first_token_ms = None;
            r.first_answer_ms = None;
        }
        let judged = judge(&unstreamed, &none);
        assert_eq!(judged.state, SaturationState::Saturated, "{judged:?}");
        assert!(judged.rule.starts_with("completed "), "{}", judged.rule);
        assert!(judged.rule.contains("no first tokens"), "{}", judged.rule);
        // The waiting gauge at 0 throughout vetoes every rule, unless a request failed or
        // waited for the client's own --max-concurrency: every send task takes microseconds
        // to start, which is no client queue, and a request held 50 ms is one.
        let idle = gauge(|_| 0.0);
        let mut vetoed = level(30.0);
        for r in &mut vetoed {
            r.queue_ms = 0.012;
        }
        let judged = judge(&vetoed, &idle);
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
        assert!(
            judged.rule.contains("waiting gauge read 0"),
            "{}",
            judged.rule
        );
        let queued = gauge(|_| 3.0);
        assert_eq!(judge(&vetoed, &queued).state, SaturationState::Saturated);
        assert_eq!(judge(&failing, &idle).state, SaturationState::Saturated);
        // The same overload held in the client by its --max-concurrency: each request sent
        // when the server could start it. The gauge cannot see that queue; the client can.
        let mut capped = level(30.0);
        for r in &mut capped {
            let start = r.first_token_ms.unwrap() - 1.0;
            r.queue_ms = start - r.sent_ms;
            r.sent_ms = start;
        }
        let judged = judge(&capped, &idle);
        assert_eq!(judged.state, SaturationState::Saturated, "{judged:?}");
        assert!(judged.rule.starts_with("asked 13"), "{}", judged.rule);
    }

    #[test]
    fn a_ttft_that_rises_while_ends_keep_pace_is_not_saturation() {
        // Every TTFT grows by a tenth of its send time (to 500 ms), as a batch growing to its
        // steady size stretches it, while the ends keep pace with the sends: time looks
        // queued, but its ends come at the arrival rate, a utilisation of about 1, not beyond
        // 90% at p < 0.01 with this many ends.
        let mut creeping = level(50.0);
        for r in &mut creeping {
            r.first_token_ms = Some(r.sent_ms + 1.0 + r.sent_ms / 10.0);
        }
        let judged = judge(&creeping, &JudgeContext::default());
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
        let capacity = judged.capacity.unwrap();
        assert!(
            (capacity.utilisation - 1.0).abs() < 0.1,
            "{capacity:?}: {}",
            judged.rule
        );
        assert!(capacity.z < Z_SATURATION, "{capacity:?}");
    }

    #[test]
    fn a_batching_servers_prefill_stalls_are_no_queue_where_its_gauge_reads_none() {
        // A server that keeps up (40 req/s sent, every request ended 100 ms after it began)
        // but stalls for 300 ms of every 600 (a long prompt's prefill): a request sent in a
        // stall gets its first token when the stall ends. Read from TTFT alone, the stalls
        // look queued, and the few ends in them a capacity far below the arrival rate.
        let stall_end = |sent: f64| {
            let k = ((sent - 300.0) / 600.0).floor();
            let from = 300.0 + 600.0 * k;
            (sent >= from && sent < from + 300.0).then_some(from + 300.0)
        };
        let stalled: Vec<RequestRecord> = level(50.0)
            .into_iter()
            .map(|mut r| {
                if let Some(until) = stall_end(r.sent_ms) {
                    r.first_token_ms = Some(until);
                    r.first_answer_ms = r.first_token_ms;
                    r.end_ms = until + 100.0;
                    r.chunk_ms = vec![until, until + 100.0];
                }
                r
            })
            .collect();
        let alone = judge(&stalled, &JudgeContext::default());
        assert_eq!(alone.state, SaturationState::Saturated, "{alone:?}");
        assert!(alone.rule.contains("TTFT alone"), "{}", alone.rule);
        // Its waiting gauge read a request waiting once in 11 scrapes: the time both call
        // queued holds too few ends to measure a capacity, and the level kept up.
        let judged = judge(&stalled, &gauge(|t| if t == 2500.0 { 1.0 } else { 0.0 }));
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
        assert_eq!(judged.capacity, None, "{judged:?}");
    }

    #[test]
    fn a_few_brief_stalls_are_no_queue() {
        // 400 req/s for 5 s, each request 100 ms, and five 40-ms stalls (the server's or the
        // client's runtime busy elsewhere): a request sent in one gets its first token when it
        // ends, and every other end due in one comes after it. The stalls look queued from
        // TTFT, and their few ends (about 40 in 0.2 s) read as half the arrival rate, but
        // 4% of the window queued is no server beyond its capacity.
        let stall_end = |t: f64| {
            let k = (t / 1000.0).floor();
            (k >= 1.0 && t < 1000.0 * k + 40.0).then_some(1000.0 * k + 40.0)
        };
        let records: Vec<RequestRecord> = (0..2000u64)
            .map(|i| {
                let sent = i as f64 * 2.5;
                let first = stall_end(sent).unwrap_or(sent + 1.0);
                let due = first + 100.0;
                let end = match stall_end(due) {
                    Some(until) if i % 2 == 0 => until + 1.0,
                    _ => due,
                };
                let mut r = record(i, sent, end);
                r.first_token_ms = Some(first);
                r.first_answer_ms = r.first_token_ms;
                r.chunk_ms = vec![first, end];
                r
            })
            .collect();
        let judged = judge(&records, &JudgeContext::default());
        assert_eq!(judged.state, SaturationState::Unsaturated, "{judged:?}");
        assert!(judged.rule.contains("too briefly"), "{}", judged.rule);
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
        let judged = judge(&late, &JudgeContext::default());
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
