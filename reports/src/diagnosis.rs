//! What limited a run: one regime and the sentence of numbers that shows it, from the
//! measured requests, the server's gauges and steps, the SLO and the roofline ([`crate::bound`]).
//!
//! The rules, in the order they are tried (the first that holds decides):
//! - **server-errors**: at least [`SERVER_ERROR_SHARE`] of the window's requests failed on the
//!   server's side (refused connections, 429s, 5xx, timeouts, cut streams), named by kind: the
//!   latencies of the rest describe a server that was not serving;
//! - **client-bound**: the load generator itself fell behind (the metrics' client-bound rules:
//!   its CPU, its send lag against TTFT, its sent rate against the scheduled one): the
//!   numbers describe the client, not the server;
//! - **kv-pressure**: the KV cache nearly full (usage ≥ 95%) or requests preempted;
//! - **queueing**: the run saturated (`crate::saturation`), or requests waited in the server's
//!   queue (its waiting gauge ≥ 1 on average), or, without the gauge, the TTFT median of the last third of the sends is over twice the
//!   first third's (and 100 ms above it) while the TPOT median holds within 25%;
//! - **cold-cache**: the requests sent in the first tenth of the window (at least 5) have a
//!   TTFT median over 1.5 × the rest's, significantly (Mann–Whitney p < 0.01, the A/B test);
//! - **prefill-interference**: decode steps that carry prefill chunks (the engine's mixed
//!   steps) run at least [`INTERFERENCE_SLOWDOWN`]× slower than decode-only ones and take at
//!   least [`INTERFERENCE_SHARE`] of decode's time; without step metrics, the ITL p95 is at
//!   least [`ITL_TAIL_FACTOR`]× its median;
//! - **queueing**, by the server's own per-request timing: at least [`QUEUE_SHARE`] of the
//!   TTFT spent in its queue (tried after interference: long mixed steps keep new requests
//!   waiting for the step in flight, which is not a queue more concurrency empties);
//! - **tail**: an SLO target whose median meets its limit while the target percentile's 95%
//!   interval lies wholly above it;
//! - **decode-memory-bound** / **decode-compute-bound**: the TPOT median within
//!   [`DECODE_FACTOR`] of the roofline at the observed batch and context
//!   ([`crate::bound`]), named by the side that binds;
//! - **prefill-compute-bound**: the TTFT median within [`PREFILL_FACTOR`] of the compute floor
//!   of the mean prompt, or prefill at least [`PREFILL_SHARE`] of the engine's time in steps
//!   while its waiting gauge read 0 throughout;
//! - **step-overhead**: the decode-only steps (or, without step metrics, the TPOT median at a
//!   batch of at most [`SMALL_BATCH`]) take over [`DECODE_FACTOR`]× the roofline: the engine's
//!   own time per step, which neither side of the roofline explains;
//! - **undetermined**: none holds, with the telemetry that was missing named.
//!
//! The batch is the server's mean running requests when scraped (and above 0), else Little's
//! law (completed rate × mean E2E); the context, the mean prompt plus half the mean output.

use serde::{Deserialize, Serialize};

use crate::bound::{BoundInputs, DecodeBound, Side};
use crate::latency::request_latency;
use crate::records::{Phase, RequestRecord};
use crate::server_metrics::ServerView;
use crate::slo::SloSpec;
use crate::stats::{mann_whitney_u, median, quantile_ci};

/// Decode is memory-bound when its TPOT median is at most this many times the bound.
pub const DECODE_FACTOR: f64 = 2.0;
/// Prefill is compute-bound when its TTFT median is at most this many times the floor.
pub const PREFILL_FACTOR: f64 = 3.0;
/// Requests queued when the server's own timing puts at least this share of their TTFT in
/// its queue.
pub const QUEUE_SHARE: f64 = 0.2;
/// Mixed steps are interfering when they take at least this many times a decode-only step…
pub const INTERFERENCE_SLOWDOWN: f64 = 2.0;
/// …and at least this share of the time decode spends in steps.
pub const INTERFERENCE_SHARE: f64 = 0.10;
/// Without step metrics: the ITL p95 over its median that reads as prefill interference.
pub const ITL_TAIL_FACTOR: f64 = 3.0;
/// Prefill is compute-bound when it took at least this share of the engine's time in steps.
pub const PREFILL_SHARE: f64 = 0.5;
/// Without step metrics, step-overhead is read only at a batch this small.
pub const SMALL_BATCH: f64 = 4.0;
/// A run is in server-errors when at least this share of its window's requests failed on the
/// server's side.
pub const SERVER_ERROR_SHARE: f64 = 0.05;

/// What limited a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Regime {
    ServerErrors,
    PrefillInterference,
    DecodeMemoryBound,
    DecodeComputeBound,
    PrefillComputeBound,
    StepOverhead,
    Queueing,
    KvPressure,
    ColdCache,
    Tail,
    ClientBound,
    Undetermined,
}

impl std::fmt::Display for Regime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&text)
    }
}

impl Regime {
    /// The server knob to try next and its direction, or why none helps.
    pub fn knob_to_try(self) -> &'static str {
        match self {
            Regime::ServerErrors => "none: fix the server, or raise its queue limit for 429s",
            Regime::ClientBound => "none on the server: more client machines (--shard)",
            Regime::KvPressure => "more KV memory, a smaller max context, or a quantised KV cache",
            Regime::Queueing => {
                "more instances, or more concurrent sequences if the KV cache allows"
            }
            Regime::ColdCache => "none on the server: a longer warm-up",
            Regime::Tail => "none yet: read the timeline for what the slow requests shared",
            Regime::PrefillInterference => {
                "a smaller per-step token budget, or a decode-first policy"
            }
            Regime::DecodeMemoryBound => "fewer bytes per weight, or a larger batch",
            Regime::DecodeComputeBound => {
                "more instances, or a faster device: no batch knob helps"
            }
            Regime::StepOverhead => {
                "a larger batch (more concurrent sequences) amortises it; otherwise the engine itself"
            }
            Regime::PrefillComputeBound => {
                "a smaller per-step token budget if decodes suffer, else more instances"
            }
            Regime::Undetermined => "none: the telemetry named as missing would tell",
        }
    }
}

/// The regime, its evidence, and the bound beside the measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub regime: Regime,
    /// A sentence with the numbers that decided.
    pub evidence: String,
    /// The bound at the observed batch and context, when its inputs are known.
    pub bound: Option<DecodeBound>,
    /// Observed TPOT median / bound TPOT.
    pub tpot_over_bound: Option<f64>,
    /// Observed output tok/s / bound output tok/s at the same batch.
    pub throughput_over_bound: Option<f64>,
    /// The telemetry the rules lacked.
    pub missing: Vec<String>,
    /// The server's own flags for the knob to try and its direction, where the run knows
    /// the server's kind (`crate::knob_roles::knob_flags`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knob_flags: Option<String>,
}

/// What the rules look at.
pub struct Observation<'a> {
    /// The run's records (warm-up and cool-down are left out here).
    pub records: &'a [RequestRecord],
    pub server: Option<&'a ServerView>,
    pub slo: Option<&'a SloSpec>,
    pub bound_inputs: &'a BoundInputs,
    /// Completed requests/s and output tok/s over the window.
    pub completed_rate: Option<f64>,
    pub output_tok_per_s: f64,
    /// Why the metrics call the run client-bound (empty when they do not).
    pub client_bound_reasons: &'a [String],
    /// The rule by which the run saturated (`crate::saturation`), when it did.
    pub saturated: Option<&'a str>,
}

struct Measured {
    sent: Vec<f64>,
    ttft: Vec<f64>,
    tpot: Vec<Option<f64>>,
    e2e: Vec<f64>,
    prompt: f64,
    output: f64,
}

fn measured(records: &[RequestRecord]) -> Measured {
    let mut m = Measured {
        sent: Vec::new(),
        ttft: Vec::new(),
        tpot: Vec::new(),
        e2e: Vec::new(),
        prompt: 0.0,
        output: 0.0,
    };
    let mut n = 0.0;
    for r in records.iter().filter(|r| r.phase == Phase::Measured) {
        let Some(latency) = request_latency(r) else {
            continue;
        };
        m.sent.push(r.sent_ms);
        m.ttft.push(latency.ttft);
        m.tpot.push(latency.tpot);
        m.e2e.push(latency.e2el);
        m.prompt += r.prompt_tokens as f64;
        m.output += r.output_tokens as f64;
        n += 1.0;
    }
    if n > 0.0 {
        m.prompt /= n;
        m.output /= n;
    }
    m
}

/// Medians of `values` over the requests sent in the first and the last third of the sends.
fn thirds(sent: &[f64], values: &[f64]) -> Option<(f64, f64)> {
    let start = sent.iter().copied().reduce(f64::min)?;
    let end = sent.iter().copied().reduce(f64::max)?;
    let third = (end - start) / 3.0;
    let pick = |lo: f64, hi: f64| -> Vec<f64> {
        sent.iter()
            .zip(values)
            .filter(|(s, _)| **s >= lo && **s <= hi)
            .map(|(_, v)| *v)
            .collect()
    };
    Some((
        median(&pick(start, start + third))?,
        median(&pick(end - third, end))?,
    ))
}

fn gauge(server: Option<&ServerView>, label: &str) -> Option<crate::server_metrics::QuantityView> {
    server.and_then(|s| s.get(label)).cloned()
}

/// The regime of a run (see the module doc).
pub fn diagnose(o: &Observation<'_>) -> Diagnosis {
    let m = measured(o.records);
    let mut missing: Vec<String> = Vec::new();
    let ttft_p50 = median(&m.ttft);
    let tpots: Vec<f64> = m.tpot.iter().flatten().copied().collect();
    let tpot_p50 = median(&tpots);
    let running = gauge(o.server, "requests running");
    let waiting = gauge(o.server, "requests waiting");
    let kv = gauge(o.server, "KV-cache usage (fraction)");
    let preemptions = gauge(o.server, "preemptions");
    if o.server.is_none() {
        missing.push("the server's gauges (no /metrics scraped)".into());
    }
    // A running gauge that averaged 0 over a window in which requests completed was
    // sampled between them: Little's law then.
    let batch = running
        .as_ref()
        .map(|q| q.mean)
        .filter(|&b| b > 0.0)
        .or_else(|| {
            let mean_e2e_s = m.e2e.iter().sum::<f64>() / m.e2e.len().max(1) as f64 / 1000.0;
            o.completed_rate.map(|r| r * mean_e2e_s)
        });
    let context = m.prompt + m.output / 2.0;
    let bound = batch.and_then(|b| o.bound_inputs.decode(b, context));
    if bound.is_none() {
        missing.extend(
            o.bound_inputs
                .missing_for_decode()
                .iter()
                .map(|s| s.to_string()),
        );
    }
    let tpot_over_bound = bound.zip(tpot_p50).map(|(b, t)| t / b.tpot_ms);
    let throughput_over_bound = bound.map(|b| o.output_tok_per_s / b.output_tok_per_s);
    let verdict = |regime: Regime, evidence: String, missing: Vec<String>| Diagnosis {
        regime,
        evidence,
        bound,
        tpot_over_bound,
        throughput_over_bound,
        missing,
        knob_flags: None,
    };

    // Server errors.
    if let Some(evidence) = server_errors(o.records) {
        return verdict(Regime::ServerErrors, evidence, missing);
    }
    // Client-bound.
    if !o.client_bound_reasons.is_empty() {
        return verdict(
            Regime::ClientBound,
            format!(
                "the load generator fell behind ({}): it, not the server, may have set the pace",
                o.client_bound_reasons.join("; ")
            ),
            missing,
        );
    }
    // KV pressure.
    let preempted = preemptions
        .as_ref()
        .map(|q| q.last - q.first)
        .filter(|d| *d > 0.0);
    if let Some(p) = preempted {
        return verdict(
            Regime::KvPressure,
            format!(
                "the server preempted {p:.0} requests (KV usage max {})",
                kv.as_ref()
                    .map_or("unknown".into(), |q| format!("{:.0}%", q.max * 100.0))
            ),
            missing,
        );
    }
    if let Some(k) = kv.as_ref().filter(|q| q.max >= 0.95) {
        return verdict(
            Regime::KvPressure,
            format!("the KV cache reached {:.0}% of its capacity", k.max * 100.0),
            missing,
        );
    }
    // Queueing.
    if let Some(rule) = o.saturated {
        return verdict(
            Regime::Queueing,
            format!(
                "the run saturated ({rule}): requests arrived faster than the server finished \
                 them{}",
                waiting.as_ref().map_or(String::new(), |w| format!(
                    ", {:.1} waiting on average and {:.0} at most",
                    w.mean, w.max
                ))
            ),
            missing,
        );
    }
    if let Some(w) = waiting.as_ref().filter(|q| q.mean >= 1.0) {
        return verdict(
            Regime::Queueing,
            format!(
                "requests waited in the server's queue: {:.1} on average, {:.0} at most, with {} running (KV usage max {})",
                w.mean,
                w.max,
                running.as_ref().map_or("an unknown number".into(), |q| format!("{:.1}", q.mean)),
                kv.as_ref().map_or("unknown".into(), |q| format!("{:.0}%", q.max * 100.0)),
            ),
            missing,
        );
    }
    let tpot_by_send: Vec<(f64, f64)> = m
        .sent
        .iter()
        .zip(&m.tpot)
        .filter_map(|(s, t)| Some((*s, (*t)?)))
        .collect();
    let (tpot_sent, tpot_values): (Vec<f64>, Vec<f64>) = tpot_by_send.into_iter().unzip();
    if waiting.is_none() {
        if let (Some((first, last)), Some((t_first, t_last))) =
            (thirds(&m.sent, &m.ttft), thirds(&tpot_sent, &tpot_values))
        {
            let holds = (t_last / t_first - 1.0).abs() <= 0.25;
            if last > 2.0 * first && last - first >= 100.0 && holds {
                return verdict(
                    Regime::Queueing,
                    format!("TTFT rose from a median of {first:.0} ms in the first third of the sends to {last:.0} ms in the last while TPOT held ({t_first:.1} → {t_last:.1} ms): a queue built up"),
                    missing,
                );
            }
        }
    }
    // Cold cache.
    if let (Some(start), Some(end)) = (
        m.sent.iter().copied().reduce(f64::min),
        m.sent.iter().copied().reduce(f64::max),
    ) {
        let cut = start + (end - start) / 10.0;
        let ttft_sent = |early: bool| -> Vec<f64> {
            m.sent
                .iter()
                .zip(&m.ttft)
                .filter(|(s, _)| (**s <= cut) == early)
                .map(|(_, t)| *t)
                .collect()
        };
        let (early, rest) = (ttft_sent(true), ttft_sent(false));
        if early.len() >= 5 && rest.len() >= 5 {
            if let (Some(e), Some(r), Some(test)) =
                (median(&early), median(&rest), mann_whitney_u(&early, &rest))
            {
                if e > 1.5 * r && test.p_value < 0.01 {
                    return verdict(
                        Regime::ColdCache,
                        format!("the {} requests sent in the first tenth of the window had a TTFT median of {e:.0} ms against {r:.0} ms for the rest (Mann–Whitney p = {:.1e}): a warm-up the window did not exclude", early.len(), test.p_value),
                        missing,
                    );
                }
            }
        }
    }
    // Prefill interference.
    let steps = o.server.and_then(|s| s.steps);
    if let Some(evidence) = prefill_interference(steps.as_ref(), o.records) {
        return verdict(Regime::PrefillInterference, evidence, missing);
    }
    if steps.is_none() {
        missing.push("the engine's step durations by kind (engine:step_duration_seconds, for prefill interference and step overhead)".into());
    }
    // Queueing by the server's own timing, after interference: an engine whose steps are
    // long keeps a new request waiting for the step in flight to end, which no concurrency
    // cures.
    if let Some(evidence) = server_queue(o.records, steps.as_ref()) {
        return verdict(Regime::Queueing, evidence, missing);
    }
    // Tail.
    if let Some(slo) = o.slo {
        let samples = crate::samples::LatencySamples::from_records(o.records);
        for t in &slo.targets {
            let mut values = samples.values(t.metric);
            values.sort_by(f64::total_cmp);
            let ci = quantile_ci(&values, t.percentile / 100.0, 0.95);
            if let (Some(p50), Some(low)) = (median(&values), ci.lower) {
                if p50 <= t.limit_ms && low > t.limit_ms {
                    return verdict(
                        Regime::Tail,
                        format!("{} meets its {:.0} ms limit at the median ({p50:.1} ms) but its p{} is above it beyond doubt (95% interval from {low:.1} ms)", crate::samples::metric_label(t.metric), t.limit_ms, t.percentile),
                        missing,
                    );
                }
            }
        }
    } else {
        missing.push("an SLO (for the tail rule)".into());
    }
    // Decode memory- or compute-bound.
    if bound.is_some_and(|b| b.compute_ms.is_none()) {
        missing.extend(
            o.bound_inputs
                .missing_for_compute()
                .iter()
                .map(|s| format!("{s}, for the roofline's compute side")),
        );
    }
    if let (Some(b), Some(ratio), Some(tpot)) = (bound, tpot_over_bound, tpot_p50) {
        if ratio <= DECODE_FACTOR {
            let regime = match b.binds {
                Side::Memory => Regime::DecodeMemoryBound,
                Side::Compute => Regime::DecodeComputeBound,
            };
            return verdict(
                regime,
                format!("the TPOT median, {tpot:.2} ms, is {ratio:.2}× {} at a batch of {:.1} and a context of {:.0} tokens ({:.2} GB{} a step)", b.describe(), b.batch, b.context, b.bytes_per_step / 1e9, b.flops_per_step.map_or(String::new(), |f| format!(" and {:.2} GFLOP", f / 1e9))),
                missing,
            );
        }
    }
    // Prefill compute-bound.
    let floor = o.bound_inputs.prefill_floor_ms(m.prompt);
    if floor.is_none() {
        missing.push("parameters and FLOP/s (for the prefill floor: --model-config and --hardware or --flops)".into());
    }
    if let (Some(floor), Some(ttft)) = (floor, ttft_p50) {
        if ttft <= PREFILL_FACTOR * floor {
            return verdict(
                Regime::PrefillComputeBound,
                format!("the TTFT median, {ttft:.1} ms, is {:.2}× the compute floor of {floor:.1} ms for a {:.0}-token prompt", ttft / floor, m.prompt),
                missing,
            );
        }
    }
    let queue_empty = waiting.as_ref().is_some_and(|w| w.max < 1.0);
    if let Some((share, st)) = steps
        .as_ref()
        .and_then(|st| Some((st.prefill_share()?, st)))
        .filter(|(share, _)| *share >= PREFILL_SHARE && queue_empty)
    {
        return verdict(
            Regime::PrefillComputeBound,
            format!(
                "prefill took {:.0}% of the engine's {:.1} s in steps ({:.1} s: {:.1} s of prefill-only steps and what {:.0} mixed steps took beyond as many decode-only ones) while its waiting gauge read 0 throughout",
                share * 100.0,
                st.busy_seconds(),
                st.prefill_seconds(),
                st.prefill_only.seconds,
                st.mixed.steps
            ),
            missing,
        );
    }
    // Step overhead.
    if let Some(b) = bound {
        let decode_step = steps.as_ref().and_then(|st| st.decode_only.mean_ms());
        let (step, what) = match decode_step {
            Some(ms) => (Some(ms), "the decode-only steps' mean"),
            None => (
                tpot_p50.filter(|_| b.batch <= SMALL_BATCH),
                "the TPOT median",
            ),
        };
        if let Some(step) = step.filter(|&t| t > DECODE_FACTOR * b.tpot_ms) {
            return verdict(
                Regime::StepOverhead,
                format!(
                    "{what}, {step:.2} ms, is {:.2}× {} at a batch of {:.1}: {:.2} ms of each step ({:.0}%) is the engine's own time, which neither bandwidth nor compute explains",
                    step / b.tpot_ms,
                    b.describe(),
                    b.batch,
                    step - b.tpot_ms,
                    (1.0 - b.tpot_ms / step) * 100.0
                ),
                missing,
            );
        }
    }
    let mut evidence = match (tpot_over_bound, bound) {
        (Some(ratio), Some(b)) => format!(
            "no rule holds: the queue was empty, and the TPOT median is {ratio:.2}× {} at a batch of {:.1}: more than the roofline explains",
            b.describe(),
            b.batch
        ),
        _ => format!("no rule holds; missing: {}", if missing.is_empty() { "nothing".into() } else { missing.join("; ") }),
    };
    if let Some(share) = o.server.and_then(ServerView::busy_share) {
        evidence.push_str(&format!(
            "; the engine was in steps {:.0}% of the scraped span",
            share * 100.0
        ));
    }
    verdict(Regime::Undetermined, evidence, missing)
}

/// The evidence of queueing from the server's own timing: the successes whose response said
/// their queue time (at least 10) spent at least [`QUEUE_SHARE`] of their TTFT, summed, in
/// the server's queue. Where the engine exports its steps, a wait no longer than its longest
/// kind of step is a new request waiting for the step in flight, not a queue: the mean wait
/// must exceed it.
fn server_queue(
    records: &[RequestRecord],
    steps: Option<&crate::server_metrics::StepBreakdown>,
) -> Option<String> {
    let (mut queue, mut ttft, mut n) = (0.0, 0.0, 0usize);
    for r in records.iter().filter(|r| r.phase == Phase::Measured) {
        let (Some(latency), Some(q)) =
            (request_latency(r), r.server_timing.and_then(|t| t.queue_ms))
        else {
            continue;
        };
        queue += q;
        ttft += latency.ttft;
        n += 1;
    }
    if n < 10 || ttft <= 0.0 || queue < QUEUE_SHARE * ttft {
        return None;
    }
    let longest_step = steps.and_then(|st| {
        [st.decode_only, st.mixed, st.prefill_only]
            .iter()
            .filter_map(|k| k.mean_ms())
            .reduce(f64::max)
    });
    let mean_wait = queue / n as f64;
    if longest_step.is_some_and(|step| mean_wait <= step) {
        return None;
    }
    Some(format!(
        "requests waited in the server's queue, by its own timing: {mean_wait:.1} ms on average of a {:.1} ms TTFT ({:.0}%, {n} requests){}",
        ttft / n as f64,
        queue / ttft * 100.0,
        longest_step.map_or(String::new(), |step| format!(
            ", longer than its longest kind of step ({step:.1} ms)"
        ))
    ))
}

/// The evidence of prefill interference: from the engine's steps when it exports them,
/// else from the ITL tail against its median.
fn prefill_interference(
    steps: Option<&crate::server_metrics::StepBreakdown>,
    records: &[RequestRecord],
) -> Option<String> {
    if let Some(st) = steps {
        let (slowdown, share) = (st.mixed_slowdown()?, st.mixed_share_of_decode()?);
        return (slowdown >= INTERFERENCE_SLOWDOWN && share >= INTERFERENCE_SHARE).then(|| {
            format!(
                "decode steps that carried prefill chunks took {:.1} ms, {slowdown:.1}× the {:.1} ms of a decode-only step, and were {:.0}% of decode's time in steps ({} mixed of {} steps)",
                st.mixed.mean_ms().unwrap_or(0.0),
                st.decode_only.mean_ms().unwrap_or(0.0),
                share * 100.0,
                st.mixed.steps,
                st.mixed.steps + st.decode_only.steps + st.prefill_only.steps
            )
        });
    }
    // Only where every chunk's token count is known: coalesced or multi-token chunks of
    // unknown size make gaps that are not steps.
    let measured: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    let exact = |r: &&&RequestRecord| {
        use crate::records::ChunkTokensSource;
        r.chunk_tokens_source == ChunkTokensSource::ContinuousUsage
            || (r.chunk_tokens_source == ChunkTokensSource::UsageSpread
                && r.output_tokens as usize == r.chunk_ms.len())
    };
    if !measured
        .iter()
        .filter(|r| r.is_success())
        .all(|r| exact(&r))
    {
        return None;
    }
    let itl = crate::metrics::WindowSamples::of(&measured).token_itl;
    let p50 = median(&itl)?;
    let p95 = crate::stats::percentile_nearest_rank(&itl, 95.0)?;
    (itl.len() >= 50 && p50 > 0.0 && p95 >= ITL_TAIL_FACTOR * p50).then(|| {
        format!(
            "the ITL p95, {p95:.1} ms, is {:.1}× its median of {p50:.1} ms: some decode steps ran far slower than most, as steps carrying prefill chunks do (the server gives no step metrics to confirm it)",
            p95 / p50
        )
    })
}

/// The evidence of server-errors: the window's requests that failed on the server's side, by
/// kind, when they are at least [`SERVER_ERROR_SHARE`] of them.
fn server_errors(records: &[RequestRecord]) -> Option<String> {
    use crate::records::ErrorKind;
    let window: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .collect();
    let mut kinds: Vec<(ErrorKind, u64)> = Vec::new();
    for kind in window
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| e.kind))
        .filter(|&k| crate::saturation::server_refusal(k))
    {
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    let failed: u64 = kinds.iter().map(|(_, n)| n).sum();
    let total = window.len() as u64;
    if total == 0 || (failed as f64) < SERVER_ERROR_SHARE * total as f64 {
        return None;
    }
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    let named: Vec<String> = kinds
        .iter()
        .map(|&(kind, n)| {
            let what = match kind {
                ErrorKind::Connect => {
                    "connections refused or failed (the server down or restarting)"
                }
                ErrorKind::Http429 => "429 responses (the server's queue limit)",
                ErrorKind::Http5xx => "5xx responses",
                ErrorKind::Timeout => "timeouts",
                _ => "streams cut before their end",
            };
            format!("{n} {what}")
        })
        .collect();
    Some(format!(
        "{failed} of the window's {total} requests failed on the server's side ({:.1}%): {}",
        failed as f64 / total as f64 * 100.0,
        named.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{ChunkTokensSource, CountSource};
    use crate::server_metrics::{Kind, QuantityView, StepBreakdown, StepTotal};

    /// `n` measured requests sent every 100 ms, 200 prompt and 20 output tokens, TTFT and
    /// TPOT from the functions of the request's index.
    fn records(n: u64, ttft: impl Fn(u64) -> f64, tpot: impl Fn(u64) -> f64) -> Vec<RequestRecord> {
        (0..n)
            .map(|i| {
                let sent = i as f64 * 100.0;
                let first = sent + ttft(i);
                let chunks: Vec<f64> = (0..20).map(|k| first + k as f64 * tpot(i)).collect();
                RequestRecord {
                    id: i,
                    phase: Phase::Measured,
                    scheduled_ms: sent,
                    queue_ms: 0.0,
                    sent_ms: sent,
                    first_token_ms: Some(first),
                    first_answer_ms: Some(first),
                    end_ms: *chunks.last().unwrap(),
                    chunk_tokens: vec![1; chunks.len()],
                    chunk_ms: chunks,
                    chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
                    prompt_tokens: 200,
                    prompt_tokens_source: CountSource::Usage,
                    output_tokens: 20,
                    output_tokens_source: CountSource::Usage,
                    reasoning_tokens: 0,
                    reasoning_tokens_source: CountSource::Counted,
                    requested_output_tokens: 20,
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
            })
            .collect()
    }

    fn server(gauges: &[(&str, Kind, f64, f64, f64)]) -> ServerView {
        ServerView {
            scrapes: 10,
            span_s: 10.0,
            quantities: gauges
                .iter()
                .map(|&(label, kind, first, mean, max)| QuantityView {
                    label: label.into(),
                    name: label.into(),
                    kind,
                    first,
                    mean,
                    max,
                    last: max,
                })
                .collect(),
            other_names: Vec::new(),
            window_prefix_cache: None,
            steps: None,
        }
    }

    /// Gauges of a calm server: 2 running, none waiting, KV 30%, no preemption.
    fn calm() -> ServerView {
        server(&[
            ("requests running", Kind::Gauge, 2.0, 2.0, 3.0),
            ("requests waiting", Kind::Gauge, 0.0, 0.0, 0.0),
            ("KV-cache usage (fraction)", Kind::Gauge, 0.2, 0.25, 0.3),
            ("preemptions", Kind::Counter, 0.0, 0.0, 0.0),
        ])
    }

    /// 2 GB of weights and 100 kB of KV a token at 1 TB/s: 2.04 ms a step at batch 2 and a
    /// context of 210 tokens (200 prompt + 20 / 2 output).
    fn inputs() -> BoundInputs {
        BoundInputs {
            weight_bytes: Some(2e9),
            kv_bytes_per_token: Some(1e5),
            kv_window_reads: Vec::new(),
            state_bytes_per_sequence: None,
            parameters: Some(1e9),
            attention_flops_per_context_token: None,
            bandwidth_bytes_per_s: Some(1e12),
            flops: Some(1e13),
            sources: Vec::new(),
        }
    }

    /// Gauges of a calm server running `batch` requests.
    fn calm_at(batch: f64) -> ServerView {
        server(&[
            ("requests running", Kind::Gauge, batch, batch, batch),
            ("requests waiting", Kind::Gauge, 0.0, 0.0, 0.0),
            ("KV-cache usage (fraction)", Kind::Gauge, 0.2, 0.25, 0.3),
            ("preemptions", Kind::Counter, 0.0, 0.0, 0.0),
        ])
    }

    /// `view` with the engine's steps: (count, seconds) of decode-only, mixed and
    /// prefill-only ones.
    fn with_steps(mut view: ServerView, steps: [(f64, f64); 3]) -> ServerView {
        let total = |(steps, seconds): (f64, f64)| StepTotal { steps, seconds };
        view.steps = Some(StepBreakdown {
            decode_only: total(steps[0]),
            mixed: total(steps[1]),
            prefill_only: total(steps[2]),
        });
        view
    }

    /// `n` requests as [`records`] with TTFT 300 ms, whose k-th gap between tokens is
    /// `gap(k)`.
    fn gapped(n: u64, gap: impl Fn(usize) -> f64) -> Vec<RequestRecord> {
        let mut recs = records(n, |_| 300.0, |_| 1.0);
        for r in &mut recs {
            for k in 1..r.chunk_ms.len() {
                r.chunk_ms[k] = r.chunk_ms[k - 1] + gap(k);
            }
            r.end_ms = *r.chunk_ms.last().unwrap();
        }
        recs
    }

    fn run(
        records: &[RequestRecord],
        server: Option<&ServerView>,
        slo: Option<&SloSpec>,
        client_bound: &[String],
    ) -> Diagnosis {
        run_with(&inputs(), records, server, slo, client_bound)
    }

    fn run_with(
        inputs: &BoundInputs,
        records: &[RequestRecord],
        server: Option<&ServerView>,
        slo: Option<&SloSpec>,
        client_bound: &[String],
    ) -> Diagnosis {
        diagnose(&Observation {
            records,
            server,
            slo,
            bound_inputs: inputs,
            completed_rate: Some(10.0),
            output_tok_per_s: 200.0,
            client_bound_reasons: client_bound,
            saturated: None,
        })
    }

    /// `recs` with the requests of ids in `ids` failed with `kind` (nothing received).
    fn failed(
        mut recs: Vec<RequestRecord>,
        ids: &[u64],
        kind: crate::records::ErrorKind,
    ) -> Vec<RequestRecord> {
        for r in recs.iter_mut().filter(|r| ids.contains(&r.id)) {
            r.error = Some(crate::records::RequestError {
                kind,
                message: "refused".into(),
            });
            r.first_token_ms = None;
            r.first_answer_ms = None;
            r.chunk_ms.clear();
            r.chunk_tokens.clear();
            r.output_tokens = 0;
            r.http_status = None;
        }
        recs
    }

    #[test]
    fn server_errors_come_first_and_name_their_kinds() {
        use crate::records::ErrorKind;
        // 40 requests near the decode bound (decode-memory-bound otherwise), 2 refused and 1
        // cut: 7.5% failed on the server's side, even with the client behind.
        let recs = failed(
            records(40, |_| 300.0, |_| 3.0),
            &[30, 31],
            ErrorKind::Connect,
        );
        let recs = failed(recs, &[35], ErrorKind::StreamCut);
        let d = run(&recs, Some(&calm()), None, &["its CPU".to_string()]);
        assert_eq!(d.regime, Regime::ServerErrors, "{}", d.evidence);
        assert!(
            d.evidence.starts_with("3 of the window's 40 requests failed on the server's side (7.5%): 2 connections refused"),
            "{}",
            d.evidence
        );
        assert!(d.evidence.contains("1 streams cut"), "{}", d.evidence);
        // One refusal in 40 (2.5%) is below the share: the run is what it otherwise is.
        let recs = failed(records(40, |_| 300.0, |_| 3.0), &[30], ErrorKind::Connect);
        assert_eq!(
            run(&recs, Some(&calm()), None, &[]).regime,
            Regime::DecodeMemoryBound
        );
        // Failures the server did not cause (a 404, the run's own stop) do not count.
        let recs = failed(
            records(40, |_| 300.0, |_| 3.0),
            &[1, 2, 3],
            ErrorKind::HttpOther,
        );
        let recs = failed(recs, &[4, 5, 6], ErrorKind::Interrupted);
        assert_ne!(
            run(&recs, Some(&calm()), None, &[]).regime,
            Regime::ServerErrors
        );
    }

    #[test]
    fn decode_memory_bound_at_the_bound() {
        // TPOT 3 ms against a 2.042 ms bound (2e9 + 2 × 210 × 1e5 bytes at 1e12 B/s).
        let recs = records(100, |_| 300.0, |_| 3.0);
        let d = run(&recs, Some(&calm()), None, &[]);
        assert_eq!(d.regime, Regime::DecodeMemoryBound, "{d:?}");
        let b = d.bound.unwrap();
        assert!((b.tpot_ms - 2.042).abs() < 1e-9, "{b:?}");
        assert!((d.tpot_over_bound.unwrap() - 3.0 / 2.042).abs() < 1e-6);
        assert_eq!(b.binds, Side::Memory);
        // Four times the bound at a batch of 8 (2.168 ms): not memory-bound, and nothing
        // else holds either.
        let slow = records(100, |_| 300.0, |_| 8.2);
        let d = run(&slow, Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
        assert!(
            d.evidence.contains(
                "3.78× the roofline of 2.17 ms (memory binds: memory 2.17 ms, compute 1.60 ms)"
            ),
            "{}",
            d.evidence
        );
    }

    #[test]
    fn decode_compute_bound_where_compute_binds() {
        // At 1 TFLOP/s a step of batch 2 computes 2 × 1e9 × 2 = 4e9 FLOPs in 4 ms, over the
        // 2.042 ms of its bytes: compute binds, and a TPOT of 6 ms is 1.5× the roofline.
        let slow_compute = BoundInputs {
            flops: Some(1e12),
            ..inputs()
        };
        let recs = records(100, |_| 300.0, |_| 6.0);
        let d = run_with(&slow_compute, &recs, Some(&calm()), None, &[]);
        assert_eq!(d.regime, Regime::DecodeComputeBound, "{d:?}");
        assert!(
            d.evidence
                .contains("1.50× the roofline of 4.00 ms (compute binds"),
            "{}",
            d.evidence
        );
        // The same TPOT where memory binds is memory-bound.
        let d = run(&records(100, |_| 300.0, |_| 3.0), Some(&calm()), None, &[]);
        assert_eq!(d.regime, Regime::DecodeMemoryBound, "{d:?}");
    }

    #[test]
    fn prefill_interference_from_the_steps_or_the_itl_tail() {
        // TPOT 12 ms at a batch of 8: far from the 2.17-ms roofline; TTFT far from the floor;
        // decode-only steps of 3 ms, within 2× the roofline: no step overhead.
        let recs = records(100, |_| 300.0, |_| 12.0);
        // Mixed steps of 18 ms against decode-only ones of 3 ms (6×), 0.9 of 2.4 decode
        // seconds.
        let steps = [(500.0, 1.5), (50.0, 0.9), (0.0, 0.0)];
        let d = run(&recs, Some(&with_steps(calm_at(8.0), steps)), None, &[]);
        assert_eq!(d.regime, Regime::PrefillInterference, "{d:?}");
        assert!(
            d.evidence.contains("took 18.0 ms, 6.0× the 3.0 ms of a decode-only step, and were 38% of decode's time in steps (50 mixed of 550 steps)"),
            "{}",
            d.evidence
        );
        // 1.5× slower mixed steps do not interfere, and nothing else holds.
        let steps = [(500.0, 1.5), (50.0, 0.225), (0.0, 0.0)];
        let d = run(&recs, Some(&with_steps(calm_at(8.0), steps)), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
        // Without step metrics: 2 of every 19 gaps of 40 ms among 3-ms ones put the ITL p95
        // at 13× its median.
        let tail = gapped(100, |k| if k % 10 == 9 { 40.0 } else { 3.0 });
        let d = run(&tail, Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::PrefillInterference, "{d:?}");
        assert!(
            d.evidence
                .contains("the ITL p95, 40.0 ms, is 13.3× its median of 3.0 ms"),
            "{}",
            d.evidence
        );
        // 8-ms gaps among 3-ms ones are no such tail: the TPOT median, 3.53 ms, is within 2×
        // the roofline.
        let even = gapped(100, |k| if k % 10 == 9 { 8.0 } else { 3.0 });
        let d = run(&even, Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::DecodeMemoryBound, "{d:?}");
        // Chunks of unknown size say nothing of steps.
        let mut unknown = tail.clone();
        for r in &mut unknown {
            r.chunk_tokens_source = crate::records::ChunkTokensSource::OnePerChunk;
        }
        let d = run(&unknown, Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
    }

    #[test]
    fn step_overhead_from_the_steps_or_a_small_batch() {
        let recs = records(100, |_| 300.0, |_| 12.0);
        // Decode-only steps of 10 ms at a batch of 8, 4.61× the 2.17-ms roofline.
        let d = run(
            &recs,
            Some(&with_steps(
                calm_at(8.0),
                [(100.0, 1.0), (0.0, 0.0), (0.0, 0.0)],
            )),
            None,
            &[],
        );
        assert_eq!(d.regime, Regime::StepOverhead, "{d:?}");
        assert!(
            d.evidence.contains(
                "the decode-only steps' mean, 10.00 ms, is 4.61× the roofline of 2.17 ms"
            ),
            "{}",
            d.evidence
        );
        assert!(
            d.evidence.contains("7.83 ms of each step (78%)"),
            "{}",
            d.evidence
        );
        // Without step metrics, the TPOT median at a batch of 2 (8.2 ms, 4.02× the 2.04-ms
        // roofline) says the same; at a batch of 8 it says nothing.
        let slow = records(100, |_| 300.0, |_| 8.2);
        let d = run(&slow, Some(&calm()), None, &[]);
        assert_eq!(d.regime, Regime::StepOverhead, "{d:?}");
        assert!(
            d.evidence.contains("the TPOT median, 8.20 ms, is 4.02×"),
            "{}",
            d.evidence
        );
        let d = run(&slow, Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
        assert!(
            d.missing
                .iter()
                .any(|m| m.contains("engine:step_duration_seconds")),
            "{:?}",
            d.missing
        );
    }

    #[test]
    fn prefill_compute_bound_by_its_share_of_the_steps() {
        // TTFT 300 ms is 7.5× the 40-ms floor; decode-only steps of 3 ms (no step overhead),
        // mixed ones of 4.5 ms (1.5×, no interference); prefill took 0.6 s alone and 0.015 s
        // inside the mixed steps of the 0.945 s in steps: 65%.
        let recs = records(100, |_| 300.0, |_| 12.0);
        let steps = [(100.0, 0.3), (10.0, 0.045), (10.0, 0.6)];
        let d = run(&recs, Some(&with_steps(calm_at(8.0), steps)), None, &[]);
        assert_eq!(d.regime, Regime::PrefillComputeBound, "{d:?}");
        assert!(
            d.evidence
                .contains("prefill took 65% of the engine's 0.9 s in steps (0.6 s"),
            "{}",
            d.evidence
        );
        // Under half (0.215 of 0.545 s): nothing holds.
        let under = [(100.0, 0.3), (10.0, 0.045), (10.0, 0.2)];
        let d = run(&recs, Some(&with_steps(calm_at(8.0), under)), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
        // A request waiting at some scrape: the queue was not empty, so not by this rule.
        let mut waited = with_steps(calm_at(8.0), steps);
        waited.quantities[1].max = 1.0;
        let d = run(&recs, Some(&waited), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
    }

    #[test]
    fn prefill_compute_bound_near_the_floor() {
        // The floor: 2 × 1e9 × 200 / 1e13 = 40 ms; TTFT 100 ms; TPOT far from its bound.
        let recs = records(100, |_| 100.0, |_| 10.0);
        let d = run(&recs, Some(&calm()), None, &[]);
        assert_eq!(d.regime, Regime::PrefillComputeBound, "{d:?}");
        assert!(
            d.evidence.contains("2.50× the compute floor of 40.0 ms"),
            "{}",
            d.evidence
        );
    }

    #[test]
    fn queueing_from_the_gauge_or_the_ttft_trend() {
        let queued = server(&[
            ("requests running", Kind::Gauge, 16.0, 16.0, 16.0),
            ("requests waiting", Kind::Gauge, 0.0, 6.5, 22.0),
            ("KV-cache usage (fraction)", Kind::Gauge, 0.1, 0.15, 0.2),
        ]);
        let recs = records(100, |_| 300.0, |_| 3.0);
        let d = run(&recs, Some(&queued), None, &[]);
        assert_eq!(d.regime, Regime::Queueing, "{d:?}");
        assert!(
            d.evidence.contains("6.5 on average, 22 at most"),
            "{}",
            d.evidence
        );
        // Without gauges: TTFT climbs 10 ms a request while TPOT holds.
        let rising = records(100, |i| 50.0 + 10.0 * i as f64, |_| 3.0);
        let d = run(&rising, None, None, &[]);
        assert_eq!(d.regime, Regime::Queueing, "{d:?}");
        // A saturated run is queueing whatever the gauges say.
        let inputs = inputs();
        let d = diagnose(&Observation {
            records: &recs,
            server: Some(&calm()),
            slo: None,
            bound_inputs: &inputs,
            completed_rate: Some(10.0),
            output_tok_per_s: 200.0,
            client_bound_reasons: &[],
            saturated: Some("completed 3.1 req/s < 95% of the 4.0 req/s scheduled"),
        });
        assert_eq!(d.regime, Regime::Queueing, "{d:?}");
        assert!(
            d.evidence.contains("the run saturated (completed 3.1"),
            "{}",
            d.evidence
        );
        // TTFT and TPOT climbing together is not a queue.
        let both = records(100, |i| 50.0 + 10.0 * i as f64, |i| 3.0 + 0.1 * i as f64);
        assert_ne!(run(&both, None, None, &[]).regime, Regime::Queueing);
    }

    #[test]
    fn queueing_from_the_servers_own_timing() {
        // TTFT 300 ms of which the server says 90 ms queued: 30%.
        let timed = |queue: f64| {
            let mut recs = records(100, |_| 300.0, |_| 12.0);
            for r in &mut recs {
                r.server_timing = Some(crate::records::ServerTiming {
                    queue_ms: Some(queue),
                    prefill_ms: 200.0,
                    decode_ms: 228.0,
                });
            }
            recs
        };
        let d = run(&timed(90.0), Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::Queueing, "{d:?}");
        assert!(
            d.evidence
                .contains("90.0 ms on average of a 300.0 ms TTFT (30%, 100 requests)"),
            "{}",
            d.evidence
        );
        // 30 ms of 300 (10%) is not queueing.
        let d = run(&timed(30.0), Some(&calm_at(8.0)), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{d:?}");
        // Both rules hold where mixed steps interfere: interference is tried first.
        let interfering = with_steps(calm_at(8.0), [(500.0, 1.5), (50.0, 0.9), (0.0, 0.0)]);
        let d = run(&timed(90.0), Some(&interfering), None, &[]);
        assert_eq!(d.regime, Regime::PrefillInterference, "{d:?}");
        // A wait no longer than the longest kind of step (prefill-only steps of 100 ms) is the
        // step in flight, not a queue; beyond it, a queue.
        let long_steps = with_steps(calm_at(8.0), [(500.0, 1.5), (50.0, 0.2), (10.0, 1.0)]);
        let d = run(&timed(90.0), Some(&long_steps), None, &[]);
        assert_ne!(d.regime, Regime::Queueing, "{d:?}");
        let d = run(&timed(150.0), Some(&long_steps), None, &[]);
        assert_eq!(d.regime, Regime::Queueing, "{d:?}");
        assert!(
            d.evidence
                .ends_with("longer than its longest kind of step (100.0 ms)"),
            "{}",
            d.evidence
        );
    }

    #[test]
    fn kv_pressure_from_usage_or_preemptions() {
        let full = server(&[
            ("requests running", Kind::Gauge, 30.0, 30.0, 32.0),
            ("KV-cache usage (fraction)", Kind::Gauge, 0.5, 0.9, 0.97),
        ]);
        let recs = records(100, |_| 300.0, |_| 3.0);
        assert_eq!(
            run(&recs, Some(&full), None, &[]).regime,
            Regime::KvPressure
        );
        let preempting = server(&[
            ("KV-cache usage (fraction)", Kind::Gauge, 0.5, 0.8, 0.9),
            ("preemptions", Kind::Counter, 3.0, 5.0, 7.0),
        ]);
        let d = run(&recs, Some(&preempting), None, &[]);
        assert_eq!(d.regime, Regime::KvPressure);
        assert!(
            d.evidence.contains("preempted 4 requests"),
            "{}",
            d.evidence
        );
    }

    #[test]
    fn cold_cache_when_the_first_tenth_is_slower() {
        let recs = records(
            100,
            |i| {
                if i < 10 {
                    900.0 + i as f64
                } else {
                    300.0 + (i % 7) as f64
                }
            },
            |_| 10.0,
        );
        let d = run(&recs, Some(&calm()), None, &[]);
        assert_eq!(d.regime, Regime::ColdCache, "{d:?}");
    }

    #[test]
    fn tail_when_the_median_meets_and_the_percentile_does_not() {
        // 400 requests: TTFT 300 ms except every 10th at 3 s; SLO p99 ≤ 1 s.
        let recs = records(
            400,
            |i| {
                if i % 10 == 9 {
                    3000.0
                } else {
                    300.0 + (i % 7) as f64
                }
            },
            |_| 10.0,
        );
        let slo = SloSpec::parse("ttft:p99:1s").unwrap();
        let d = run(&recs, Some(&calm()), Some(&slo), &[]);
        assert_eq!(d.regime, Regime::Tail, "{d:?}");
        // Without the SLO the rule cannot fire.
        assert_ne!(run(&recs, Some(&calm()), None, &[]).regime, Regime::Tail);
    }

    #[test]
    fn client_bound_when_the_metrics_say_so() {
        let recs = records(100, |_| 300.0, |_| 3.0);
        let reasons = ["client CPU 95% of its cores".to_string()];
        let d = run(&recs, Some(&calm()), None, &reasons);
        assert_eq!(d.regime, Regime::ClientBound, "{d:?}");
        assert!(d.evidence.contains("client CPU 95%"), "{}", d.evidence);
    }

    #[test]
    fn undetermined_names_what_is_missing() {
        let recs = records(100, |_| 300.0, |_| 3.0);
        let none = BoundInputs::default();
        let d = diagnose(&Observation {
            records: &recs,
            server: None,
            slo: None,
            bound_inputs: &none,
            completed_rate: Some(10.0),
            output_tok_per_s: 200.0,
            client_bound_reasons: &[],
            saturated: None,
        });
        assert_eq!(d.regime, Regime::Undetermined);
        assert!(
            d.missing.iter().any(|m| m.contains("gauges")),
            "{:?}",
            d.missing
        );
        assert!(
            d.missing.iter().any(|m| m.contains("memory bandwidth")),
            "{:?}",
            d.missing
        );
        assert!(d.evidence.contains("missing"), "{}", d.evidence);
    }

    #[test]
    fn undetermined_says_how_busy_the_engine_was() {
        // TPOT 12 ms is 5.5× the 2.17-ms roofline at a batch of 8 and TTFT 300 ms 7.5× the
        // 40-ms floor: no rule holds.
        let recs = records(100, |_| 300.0, |_| 12.0);
        let mut server = calm_at(8.0);
        // 8.1 s in steps over the 10-s scraped span.
        server.quantities.push(QuantityView {
            label: "engine busy (s)".into(),
            name: "engine:busy_seconds_total".into(),
            kind: Kind::Counter,
            first: 1.0,
            mean: 5.0,
            max: 9.1,
            last: 9.1,
        });
        let d = run(&recs, Some(&server), None, &[]);
        assert_eq!(d.regime, Regime::Undetermined, "{}", d.evidence);
        assert!(
            d.evidence
                .ends_with("; the engine was in steps 81% of the scraped span"),
            "{}",
            d.evidence
        );
        // Without the counter the evidence says nothing of it.
        let d = run(&recs, Some(&calm_at(8.0)), None, &[]);
        assert!(!d.evidence.contains("in steps"), "{}", d.evidence);
    }
}
