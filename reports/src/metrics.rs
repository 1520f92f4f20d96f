//! Metrics from request records, exactly as defined in docs/ARCHITECTURE.md ("Metric
//! definitions").
//!
//! Latencies are taken from successful requests of the measurement window only; failed
//! requests are counted by [`ErrorKind`] and never enter a latency distribution.
//! Percentiles come from HDR histograms (microseconds, 3 significant digits); mean, std,
//! min and max are computed exactly from the raw values.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

pub use crate::latency::{
    histogram_of, new_histogram, request_latency, to_micros, DistStats, PercentileCis,
    RequestLatency, PERCENTILE_CI_LEVEL,
};
use crate::records::{ErrorKind, Phase, RequestRecord};
use crate::stats::min_sample_for_quantile;

/// The client-bound rules compare the client's own error with what it measured: the send lag
/// at the highest percentile the sample bounds (p99, else p90, else p50) above max(this floor,
/// [`CLIENT_BOUND_LAG_SHARE`] × TTFT at that percentile) marks the run client-bound (the lag
/// is added to TTFT from the scheduled send, so it is judged against TTFT). Below 1 ms, lag
/// is a VM's scheduling noise, not a client that fell behind.
pub const CLIENT_BOUND_LAG_FLOOR_MS: f64 = 1.0;
/// The share of the latency it contaminates above which lag is material: the smallest effect
/// `compare` calls a difference (its default `--min-effect`, 2%). Lag below it moves
/// TTFT-from-schedule by less than any verdict of this tool resolves, so flagging it would
/// cry wolf (a 1.2 ms scheduler hiccup beside a 73 ms TTFT is 1.6%).
pub const CLIENT_BOUND_LAG_SHARE: f64 = 0.02;
/// Sent fewer requests/s than this share of the scheduled rate: client-bound.
pub const CLIENT_BOUND_MIN_SENT_SHARE: f64 = 0.98;
/// The client process used at least this share of the cores it may run on: client-bound.
pub const CLIENT_BOUND_CPU_SHARE: f64 = 0.9;

/// A latency metric an SLO can bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloMetric {
    Ttft,
    /// Time to first answer token: TTFT of the answer, after any reasoning.
    TimeToFirstAnswer,
    Tpot,
    E2el,
}

/// One per-request service-level objective: `metric <= limit_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub metric: SloMetric,
    pub limit_ms: f64,
}

/// Options for [`compute`].
#[derive(Debug, Clone, Default)]
pub struct MetricsOptions {
    pub slos: Vec<Slo>,
    /// Open-loop run: compare the sent rate with the scheduled one (see [`crate::rates`]).
    pub open_loop: bool,
    /// CPU time of the client process over the run, as a share of the cores it may use.
    pub client_cpu: Option<f64>,
}

/// Whether a successful request met every SLO.
pub fn meets_slos(latency: &RequestLatency, slos: &[Slo]) -> bool {
    slos.iter().all(|slo| {
        let value = match slo.metric {
            SloMetric::Ttft => Some(latency.ttft),
            // A request that never answered (reasoning only) missed a bound on its answer.
            SloMetric::TimeToFirstAnswer => Some(latency.ttfa.unwrap_or(f64::INFINITY)),
            SloMetric::Tpot => latency.tpot,
            SloMetric::E2el => Some(latency.e2el),
        };
        value.is_none_or(|v| v <= slo.limit_ms)
    })
}

/// Everything derived from one run's records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Successful requests in the measurement window.
    pub completed: u64,
    /// Failed requests in the measurement window.
    pub failed: u64,
    /// Failed requests by error kind (measurement window).
    pub errors: BTreeMap<String, u64>,
    /// Records outside the measurement window (warm-up + cool-down), all outcomes.
    pub excluded_outside_window: u64,
    /// Records of requests in flight when the run was stopped (partial timings, never
    /// counted above).
    pub interrupted: u64,
    /// First measured send to last measured completion, seconds.
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    /// Requests/s meeting every SLO; `None` when no SLO was given.
    pub request_goodput: Option<f64>,
    /// Successful requests that returned fewer tokens than requested.
    pub short_outputs: u64,
    /// Successes whose output count was counted by the client (no `usage`).
    pub counted_output_tokens: u64,
    /// Output tokens spent reasoning (in `total_output_tokens` too).
    pub total_reasoning_tokens: u64,
    /// Successes whose reasoning count was counted from the chunks (no
    /// `usage.completion_tokens_details.reasoning_tokens`) and is not zero.
    pub counted_reasoning_tokens: u64,
    /// Successes that streamed reasoning only, no answer (no time to first answer).
    pub no_answer: u64,
    /// Time to first token, from the actual send.
    pub ttft: DistStats,
    /// Time to first answer token (not reasoning), from the actual send.
    pub time_to_first_answer: DistStats,
    /// Time per output token after the first.
    pub tpot: DistStats,
    /// Token-true inter-token latency (a k-token chunk after gap g gives k gaps of g/k).
    pub token_itl: DistStats,
    /// Raw gaps between content chunks (vLLM's `itl`).
    pub chunk_itl: DistStats,
    /// End-to-end latency, from the actual send.
    pub e2el: DistStats,
    /// TTFT measured from the scheduled send (includes lag and queueing).
    pub ttft_from_scheduled: DistStats,
    /// E2E measured from the scheduled send.
    pub e2el_from_scheduled: DistStats,
    /// Actual send − scheduled send (all measured requests, failed ones included).
    pub schedule_lag: DistStats,
    /// Wait for a `--max-concurrency` slot (all measured requests).
    pub queue_time: DistStats,
    /// Connect time of the measured requests that opened a connection (`count` of them).
    pub connect: DistStats,
    /// Client E2E minus the server's own time with the request (network, HTTP and the
    /// client; and the server's queue where it gives no queue time, as llama.cpp), of the
    /// successes whose server said its timing (`count` of them).
    #[serde(default)]
    pub client_server_gap: DistStats,

    /// The scheduled rate of the measured requests (open loop; see [`crate::rates`]).
    #[serde(alias = "offered_rate")]
    pub scheduled_rate: Option<f64>,
    /// The sent rate of the same requests.
    #[serde(alias = "achieved_rate")]
    pub sent_rate: Option<f64>,
    /// CPU time of the client process over the run, as a share of the cores it may use.
    pub client_cpu: Option<f64>,
    /// The client, not the server, may have limited the numbers.
    pub client_bound: bool,
    pub client_bound_reasons: Vec<String>,
    /// Prompt tokens the server served from its prefix cache over all prompt tokens, of the
    /// successes whose server said (`usage.prompt_tokens_details.cached_tokens`).
    pub cached_prompt_share: Option<f64>,
    /// Multi-turn sessions (`--turns`), by turn index.
    pub sessions: Option<crate::sessions::SessionStats>,
}

/// The latency samples of a run's measurement window, in milliseconds: what [`compute`]
/// summarises and [`window_histograms`] records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowSamples {
    pub ttft: Vec<f64>,
    pub time_to_first_answer: Vec<f64>,
    pub tpot: Vec<f64>,
    pub e2el: Vec<f64>,
    pub token_itl: Vec<f64>,
    pub chunk_itl: Vec<f64>,
    pub ttft_from_scheduled: Vec<f64>,
    pub e2el_from_scheduled: Vec<f64>,
    /// All measured requests, failed ones included.
    pub schedule_lag: Vec<f64>,
    /// All measured requests, failed ones included.
    pub queue_time: Vec<f64>,
    /// Connect time of the measured requests that went over a connection opened for them
    /// (failed ones included): inside their TTFT, reported apart.
    pub connect: Vec<f64>,
    /// E2E minus the server's own time, of the successes whose server said it.
    pub client_server_gap: Vec<f64>,
}

impl WindowSamples {
    /// The samples of `measured` (records of the measurement window).
    pub fn of(measured: &[&RequestRecord]) -> WindowSamples {
        let mut s = WindowSamples::default();
        for r in measured {
            s.schedule_lag.push(r.schedule_lag_ms());
            s.queue_time.push(r.queue_ms);
            s.connect.extend(r.connect_ms);
            let Some(latency) = request_latency(r) else {
                continue;
            };
            s.ttft.push(latency.ttft);
            s.time_to_first_answer.extend(latency.ttfa);
            s.e2el.push(latency.e2el);
            s.tpot.extend(latency.tpot);
            if let Some(server) = &r.server_timing {
                s.client_server_gap.push(latency.e2el - server.total_ms());
            }
            let wait = r.sent_ms - r.scheduled_ms;
            s.ttft_from_scheduled.push(latency.ttft + wait);
            s.e2el_from_scheduled.push(latency.e2el + wait);
            for i in 1..r.chunk_ms.len() {
                let gap = r.chunk_ms[i] - r.chunk_ms[i - 1];
                s.chunk_itl.push(gap);
                let k = r.chunk_tokens.get(i).copied().unwrap_or(1).max(1);
                s.token_itl
                    .extend(std::iter::repeat_n(gap / f64::from(k), k as usize));
            }
        }
        s
    }

    /// Each distribution with its name (the tag it carries in `histograms.hlog`).
    pub fn named(&self) -> [(&'static str, &[f64]); 12] {
        [
            ("ttft", &self.ttft),
            ("time_to_first_answer", &self.time_to_first_answer),
            ("tpot", &self.tpot),
            ("e2el", &self.e2el),
            ("token_itl", &self.token_itl),
            ("chunk_itl", &self.chunk_itl),
            ("ttft_from_scheduled", &self.ttft_from_scheduled),
            ("e2el_from_scheduled", &self.e2el_from_scheduled),
            ("schedule_lag", &self.schedule_lag),
            ("queue_time", &self.queue_time),
            ("connect", &self.connect),
            ("client_server_gap", &self.client_server_gap),
        ]
    }
}

/// The HDR histogram (µs) of each measured-window distribution of `records`, by name: the
/// same values, in the same units, that [`DistStats`] takes its percentiles from.
pub fn window_histograms(records: &[RequestRecord]) -> BTreeMap<String, Histogram<u64>> {
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    let samples = WindowSamples::of(&measured);
    samples
        .named()
        .into_iter()
        .map(|(name, values)| (name.to_string(), histogram_of(values)))
        .collect()
}

/// Computes all metrics from `records`.
pub fn compute(records: &[RequestRecord], opts: &MetricsOptions) -> Metrics {
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    let interrupted = records
        .iter()
        .filter(|r| r.phase == Phase::Interrupted)
        .count();
    let mut m = Metrics {
        excluded_outside_window: (records.len() - measured.len() - interrupted) as u64,
        interrupted: interrupted as u64,
        ..Metrics::default()
    };

    let samples = WindowSamples::of(&measured);
    let mut good = 0u64;
    for r in &measured {
        let Some(latency) = request_latency(r) else {
            m.failed += 1;
            let kind = r.error.as_ref().map_or(ErrorKind::Protocol, |e| e.kind);
            *m.errors.entry(kind.as_str().to_string()).or_default() += 1;
            continue;
        };
        m.completed += 1;
        m.total_input_tokens += r.prompt_tokens;
        m.total_output_tokens += r.output_tokens;
        m.total_reasoning_tokens += r.reasoning_tokens;
        m.counted_reasoning_tokens += u64::from(
            r.reasoning_tokens > 0
                && r.reasoning_tokens_source == crate::records::CountSource::Counted,
        );
        m.no_answer += u64::from(latency.ttfa.is_none());
        m.short_outputs += u64::from(r.short_output);
        m.counted_output_tokens +=
            u64::from(r.output_tokens_source == crate::records::CountSource::Counted);
        good += u64::from(meets_slos(&latency, &opts.slos));
    }

    let first_send = measured
        .iter()
        .map(|r| r.sent_ms)
        .fold(f64::INFINITY, f64::min);
    let last_end = measured
        .iter()
        .map(|r| r.end_ms)
        .fold(f64::NEG_INFINITY, f64::max);
    if !measured.is_empty() && last_end > first_send {
        m.duration_s = (last_end - first_send) / 1000.0;
        let d = m.duration_s;
        m.request_throughput = m.completed as f64 / d;
        m.input_throughput = m.total_input_tokens as f64 / d;
        m.output_throughput = m.total_output_tokens as f64 / d;
        m.total_token_throughput = (m.total_input_tokens + m.total_output_tokens) as f64 / d;
        if !opts.slos.is_empty() {
            m.request_goodput = Some(good as f64 / d);
        }
    }

    m.ttft = DistStats::from_values(&samples.ttft);
    m.time_to_first_answer = DistStats::from_values(&samples.time_to_first_answer);
    m.tpot = DistStats::from_values(&samples.tpot);
    m.e2el = DistStats::from_values(&samples.e2el);
    m.token_itl = DistStats::from_values(&samples.token_itl);
    m.chunk_itl = DistStats::from_values(&samples.chunk_itl);
    m.ttft_from_scheduled = DistStats::from_values(&samples.ttft_from_scheduled);
    m.e2el_from_scheduled = DistStats::from_values(&samples.e2el_from_scheduled);
    m.schedule_lag = DistStats::from_values(&samples.schedule_lag);
    m.queue_time = DistStats::from_values(&samples.queue_time);
    m.connect = DistStats::from_values(&samples.connect);
    m.client_server_gap = DistStats::from_values(&samples.client_server_gap);

    if opts.open_loop {
        m.scheduled_rate = crate::rates::scheduled(&measured);
        m.sent_rate = crate::rates::sent(&measured);
    }
    let (cached, cached_of) = measured
        .iter()
        .filter(|r| r.is_success())
        .filter_map(|r| r.cached_tokens.map(|c| (c, r.prompt_tokens)))
        .fold((0u64, 0u64), |(c, p), (rc, rp)| (c + rc, p + rp));
    m.cached_prompt_share = (cached_of > 0).then(|| cached as f64 / cached_of as f64);
    m.sessions = crate::sessions::SessionStats::of(records, m.duration_s);
    m.client_cpu = opts.client_cpu;
    m.client_bound_reasons = client_bound_reasons(&m);
    m.client_bound = !m.client_bound_reasons.is_empty();
    m
}

/// The client-bound rules that fire (see [`CLIENT_BOUND_LAG_FLOOR_MS`]), each with the size of
/// the client's error beside the metric it affects.
fn client_bound_reasons(m: &Metrics) -> Vec<String> {
    let mut reasons = Vec::new();
    // A percentile the sample cannot bound from above is really the maximum: not used.
    let bounded = [(0.99, "p99"), (0.9, "p90"), (0.5, "p50")]
        .into_iter()
        .find(|&(q, _)| m.schedule_lag.count >= min_sample_for_quantile(q, PERCENTILE_CI_LEVEL));
    if let Some((q, name)) = bounded {
        let at = |d: &DistStats| d.percentile(q).map_or(0.0, |(v, _)| v);
        let lag = at(&m.schedule_lag);
        let ttft = if m.ttft.count > 0 { at(&m.ttft) } else { 0.0 };
        let limit = CLIENT_BOUND_LAG_FLOOR_MS.max(CLIENT_BOUND_LAG_SHARE * ttft);
        if lag > limit {
            reasons.push(format!(
                "send lag {name} {lag:.3} ms > max({CLIENT_BOUND_LAG_FLOOR_MS} ms, {}% of TTFT \
                 {name} {ttft:.1} ms): TTFT from the scheduled send carries up to that much of \
                 the client's own delay",
                CLIENT_BOUND_LAG_SHARE * 100.0
            ));
        }
    }
    if let (Some(scheduled), Some(sent)) = (m.scheduled_rate, m.sent_rate) {
        if sent < CLIENT_BOUND_MIN_SENT_SHARE * scheduled {
            reasons.push(format!(
                "sent {sent:.3} req/s < {}% of the {scheduled:.3} req/s scheduled",
                CLIENT_BOUND_MIN_SENT_SHARE * 100.0
            ));
        }
    }
    if let Some(cpu) = m.client_cpu.filter(|&c| c >= CLIENT_BOUND_CPU_SHARE) {
        reasons.push(format!(
            "the client used {:.0}% of the CPU it may use (≥ {}%): its timestamps may be late",
            cpu * 100.0,
            CLIENT_BOUND_CPU_SHARE * 100.0
        ));
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{ChunkTokensSource, CountSource, RequestError, ServerTiming};

    #[test]
    fn every_percentile_lies_inside_its_own_interval() {
        // 2,000 values within 0.3 ms of 202 ms: narrower intervals than the histogram's
        // 128 µs buckets there.
        let values: Vec<f64> = (0..2000)
            .map(|i| 201.9 + 0.3 * ((i * 7919) % 2000) as f64 / 2000.0)
            .collect();
        let d = DistStats::from_values(&values);
        for q in [0.5, 0.9, 0.95, 0.99, 0.999] {
            let (p, ci) = d.percentile(q).unwrap();
            // p99.9 of 2,000 values has no upper bound (it needs 3,688).
            let inside = ci.lower.is_some_and(|lo| lo <= p) && ci.upper.is_none_or(|hi| p <= hi);
            assert!(inside, "p{} {p} outside {ci:?}", q * 100.0);
        }
    }

    fn record(id: u64, sent: f64, chunks: &[f64], tokens: &[u32]) -> RequestRecord {
        RequestRecord {
            id,
            phase: Phase::Measured,
            scheduled_ms: sent,
            queue_ms: 0.0,
            sent_ms: sent,
            first_token_ms: chunks.first().copied(),
            first_answer_ms: chunks.first().copied(),
            end_ms: chunks.last().copied().unwrap_or(sent),
            chunk_ms: chunks.to_vec(),
            chunk_tokens: tokens.to_vec(),
            chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
            prompt_tokens: 10,
            prompt_tokens_source: CountSource::Usage,
            output_tokens: tokens.iter().map(|&k| u64::from(k)).sum(),
            output_tokens_source: CountSource::Usage,
            reasoning_tokens: 0,
            reasoning_tokens_source: CountSource::Counted,
            requested_output_tokens: 9,
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

    #[test]
    fn the_client_server_gap_is_e2e_less_the_servers_time() {
        // E2E 70 ms; the server says 5 ms queued, 40 ms to the first token and 20 ms after:
        // a 5-ms gap. Without a queue time (llama.cpp) the 5 ms stay in the gap: 10 ms. A
        // request whose server said nothing has no gap.
        let mut ours = record(0, 0.0, &[50.0, 60.0, 70.0], &[1, 4, 4]);
        ours.server_timing = Some(ServerTiming {
            queue_ms: Some(5.0),
            prefill_ms: 40.0,
            decode_ms: 20.0,
        });
        let mut llama = record(1, 100.0, &[150.0, 160.0, 170.0], &[1, 4, 4]);
        llama.server_timing = Some(ServerTiming {
            queue_ms: None,
            prefill_ms: 40.0,
            decode_ms: 20.0,
        });
        let silent = record(2, 200.0, &[250.0, 260.0, 270.0], &[1, 4, 4]);
        let m = compute(&[ours, llama, silent], &MetricsOptions::default());
        assert_eq!(m.client_server_gap.count, 2);
        assert!(
            (m.client_server_gap.mean - 7.5).abs() < 1e-9,
            "{:?}",
            m.client_server_gap
        );
        assert!((m.client_server_gap.max - 10.0).abs() < 0.01);
        assert_eq!(
            compute(&[record(3, 0.0, &[50.0], &[1])], &MetricsOptions::default())
                .client_server_gap
                .count,
            0
        );
    }

    #[test]
    fn formulas_match_the_architecture() {
        // First chunk 1 token at 50 ms, then two 4-token chunks 10 ms apart: n = 9.
        let ok = record(0, 0.0, &[50.0, 60.0, 70.0], &[1, 4, 4]);
        let mut failed = record(1, 5.0, &[], &[]);
        failed.error = Some(RequestError {
            kind: ErrorKind::Http429,
            message: "429".into(),
        });
        failed.end_ms = 6.0;
        let mut warm = record(2, 0.0, &[1.0, 2.0], &[1, 1]);
        warm.phase = Phase::Warmup;
        let slos = crate::slo::SloSpec::parse("ttft:p99:60ms,tpot:1s")
            .unwrap()
            .per_request();
        let m = compute(
            &[ok, failed, warm],
            &MetricsOptions {
                slos,
                open_loop: true,
                client_cpu: None,
            },
        );
        assert_eq!(
            (m.completed, m.failed, m.excluded_outside_window),
            (1, 1, 1)
        );
        assert_eq!(m.errors.get("http_429"), Some(&1));
        assert_eq!(m.ttft.count, 1);
        assert!((m.ttft.mean - 50.0).abs() < 1e-9);
        assert!((m.e2el.mean - 70.0).abs() < 1e-9);
        assert!((m.tpot.mean - 20.0 / 8.0).abs() < 1e-9);
        assert_eq!(m.chunk_itl.count, 2);
        assert!((m.chunk_itl.mean - 10.0).abs() < 1e-9);
        assert_eq!(m.token_itl.count, 8);
        assert!((m.token_itl.p50 - 2.5).abs() < 0.01);
        assert!((m.duration_s - 0.070).abs() < 1e-12);
        assert_eq!(m.total_output_tokens, 9);
        assert!((m.request_goodput.unwrap() - 1.0 / 0.070).abs() < 1e-9);
    }

    #[test]
    fn percentiles_have_three_significant_digits() {
        let values: Vec<f64> = (1..=1000).map(f64::from).collect();
        let s = DistStats::from_values(&values);
        assert!((s.p50 - 500.0).abs() <= 0.5, "{}", s.p50);
        assert!((s.p99 - 990.0).abs() <= 1.0, "{}", s.p99);
        assert!((s.p99_9 - 999.0).abs() <= 1.0, "{}", s.p99_9);
        assert_eq!((s.min, s.max), (1.0, 1000.0));
        assert!((s.mean - 500.5).abs() < 1e-9);
    }

    #[test]
    fn percentiles_carry_their_intervals_and_small_samples_say_so() {
        let values: Vec<f64> = (1..=1000).map(f64::from).collect();
        let d = DistStats::from_values(&values);
        let ci = d.ci.p99;
        assert!(
            ci.lower.unwrap() < 990.0 && 990.0 < ci.upper.unwrap(),
            "{ci:?}"
        );
        let text = d.percentile_text(0.99, 1);
        assert!(
            text.starts_with(&format!("{:.1} [95% CI ", d.p99)),
            "{text}"
        );
        let few = DistStats::from_values(&values[..11]);
        assert_eq!(few.ci.p99.upper, None);
        assert_eq!(few.percentile_text(0.99, 1), "too few (11 < 368); ≥ 10.0");
        assert!(few
            .percentile_text(0.5, 1)
            .starts_with("6.0 [95% CI 2.0–10.0]"));
    }

    /// `n` requests sent every 100 ms with lag `lag(i)` ms and a 73 ms TTFT.
    fn lagged(n: u64, lag: impl Fn(u64) -> f64) -> Vec<RequestRecord> {
        (0..n)
            .map(|i| {
                let at = i as f64 * 100.0;
                let mut r = record(i, at, &[at + lag(i) + 73.0], &[1]);
                r.sent_ms = at + lag(i);
                r
            })
            .collect()
    }

    #[test]
    fn client_bound_on_lag_in_proportion_to_ttft() {
        // The demo's light first level: 39 sends, lag 0.1 ms but one 1.2 ms hiccup, beside a
        // 73 ms TTFT. Its "p99" would be the hiccup (39 < 368): p90 (39 ≥ 35) judges it.
        let light = lagged(39, |i| if i == 17 { 1.223 } else { 0.1 });
        let m = compute(&light, &MetricsOptions::default());
        assert!(!m.client_bound, "{:?}", m.client_bound_reasons);
        // A client that fell behind: lag growing to 40 ms over 400 sends, flagged by p99.
        let behind = lagged(400, |i| i as f64 / 10.0);
        let m = compute(&behind, &MetricsOptions::default());
        assert!(m.client_bound);
        assert!(
            m.client_bound_reasons[0].starts_with("send lag p99 39."),
            "{:?}",
            m.client_bound_reasons
        );
        // 1.2 ms of steady lag beside the 73 ms TTFT is 1.6%: under the 2% share.
        let steady = lagged(400, |_| 1.2);
        assert!(!compute(&steady, &MetricsOptions::default()).client_bound);
        // 2 ms is 2.7%: material.
        let steady = lagged(400, |_| 2.0);
        assert!(compute(&steady, &MetricsOptions::default()).client_bound);
        // Five sends bound no percentile: the rule says nothing rather than guess.
        let few = lagged(5, |_| 50.0);
        assert!(compute(&few, &MetricsOptions::default())
            .client_bound_reasons
            .is_empty());
    }

    #[test]
    fn client_bound_on_sent_rate_and_cpu() {
        // Scheduled every 10 ms, sent every 11 ms: 91% of the scheduled rate.
        let records: Vec<RequestRecord> = (0..50)
            .map(|i| {
                let mut r = record(i, i as f64 * 10.0, &[i as f64 * 11.0 + 500.0], &[1]);
                r.sent_ms = i as f64 * 11.0;
                r
            })
            .collect();
        let open = MetricsOptions {
            open_loop: true,
            ..MetricsOptions::default()
        };
        let m = compute(&records, &open);
        assert!(
            m.client_bound_reasons
                .iter()
                .any(|r| r.starts_with("sent ")),
            "{:?}",
            m.client_bound_reasons
        );
        let one = [record(0, 0.0, &[50.0], &[1])];
        let busy = MetricsOptions {
            client_cpu: Some(0.95),
            ..MetricsOptions::default()
        };
        let m = compute(&one, &busy);
        assert_eq!(m.client_bound_reasons.len(), 1);
        assert!(m.client_bound_reasons[0].contains("95% of the CPU"));
        let idle = MetricsOptions {
            client_cpu: Some(0.3),
            ..MetricsOptions::default()
        };
        assert!(!compute(&one, &idle).client_bound);
    }
}
