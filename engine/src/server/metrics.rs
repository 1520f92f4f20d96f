//! Prometheus metrics under vLLM's names, so existing dashboards work, and the engine's step
//! telemetry under names of its own (`engine:`), where vLLM has none.
//!
//! A "request" here is one generated sequence (a choice); with `n = 1` the two coincide.
//! Its phases are vLLM's: queued from arrival to first scheduled, prefill from first
//! scheduled to first token, decode from first to last token, inference from first
//! scheduled to last token.

use std::fmt::Write;
use std::sync::Mutex;

use crate::engine::{EngineStats, FinishReason, StepKind, StepRecord};

/// vLLM's buckets for `vllm:time_to_first_token_seconds`.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for `vllm:time_per_output_token_seconds`.
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's buckets for `vllm:iteration_tokens_total` (tokens per engine step).
const ITERATION_TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// Buckets of `engine:step_duration_seconds`: a CPU decode step of a small model takes a few
/// milliseconds, a long prefill chunk seconds.
const STEP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// vLLM's buckets for request-level latencies (e2e, queue time).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative count per bound; the last slot is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, x: f64) {
        let slot = self
            .bounds
            .iter()
            .position(|&b| x <= b)
            .unwrap_or(self.bounds.len());
        self.counts[slot] += 1;
        self.sum += x;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, labels);
    }

    /// The buckets, sum and count under `labels`, without the header (one series of several).
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| format!("{b:?}"));
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Timings of one finished (not aborted) sequence, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeqTimings {
    pub queue: f64,
    pub ttft: f64,
    pub e2e: f64,
    /// Mean time per output token after the first; `None` with fewer than 2 tokens.
    pub tpot: Option<f64>,
    /// First scheduled to first token.
    pub prefill: f64,
    /// First token to last token.
    pub decode: f64,
    /// First scheduled to last token.
    pub inference: f64,
}

#[derive(Debug, Clone)]
struct Inner {
    stats: EngineStats,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    inference: Histogram,
    /// Finished sequences by reason: stop, length, abort, error.
    finished: [u64; 4],
    iteration_tokens: Histogram,
    /// Step seconds by [`StepKind`] (in `StepKind::ALL`'s order).
    steps: [Histogram; 3],
}

/// Shared between the engine loop (writer) and `/metrics` (reader).
#[derive(Debug)]
pub struct Metrics {
    labels: String,
    inner: Mutex<Inner>,
}

fn reason_slot(reason: FinishReason) -> usize {
    match reason {
        FinishReason::Stop => 0,
        FinishReason::Length => 1,
        FinishReason::Abort => 2,
        FinishReason::Error => 3,
    }
}

impl Metrics {
    pub fn new(model_name: &str) -> Metrics {
        let escaped = model_name
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        Metrics {
            labels: format!("model_name=\"{escaped}\""),
            inner: Mutex::new(Inner {
                stats: EngineStats::default(),
                ttft: Histogram::new(TTFT_BUCKETS),
                tpot: Histogram::new(TPOT_BUCKETS),
                e2e: Histogram::new(REQUEST_BUCKETS),
                queue: Histogram::new(REQUEST_BUCKETS),
                prefill: Histogram::new(REQUEST_BUCKETS),
                decode: Histogram::new(REQUEST_BUCKETS),
                inference: Histogram::new(REQUEST_BUCKETS),
                finished: [0; 4],
                iteration_tokens: Histogram::new(ITERATION_TOKEN_BUCKETS),
                steps: StepKind::ALL.map(|_| Histogram::new(STEP_BUCKETS)),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The engine's latest counters and gauges.
    pub fn set_stats(&self, stats: EngineStats) {
        self.lock().stats = stats;
    }

    pub fn stats(&self) -> EngineStats {
        self.lock().stats.clone()
    }

    /// A sequence ended; timings only for those that were not aborted.
    pub fn record_finished(&self, reason: FinishReason, timings: Option<SeqTimings>) {
        let mut inner = self.lock();
        inner.finished[reason_slot(reason)] += 1;
        if let Some(t) = timings {
            inner.queue.observe(t.queue);
            inner.ttft.observe(t.ttft);
            inner.e2e.observe(t.e2e);
            inner.prefill.observe(t.prefill);
            inner.decode.observe(t.decode);
            inner.inference.observe(t.inference);
            if let Some(tpot) = t.tpot {
                inner.tpot.observe(tpot);
            }
        }
    }

    /// An engine step ran.
    pub fn record_step(&self, step: StepRecord) {
        let mut inner = self.lock();
        inner.iteration_tokens.observe(step.tokens as f64);
        let slot = StepKind::ALL
            .iter()
            .position(|k| *k == step.kind)
            .unwrap_or(0);
        inner.steps[slot].observe(step.secs);
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let inner = self.lock().clone();
        let l = &self.labels;
        let s = &inner.stats;
        let mut out = String::new();
        let usage = if s.kv_blocks_total == 0 {
            0.0
        } else {
            s.kv_blocks_used as f64 / s.kv_blocks_total as f64
        };
        let gauges: [(&str, &str, f64); 4] = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                s.num_running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                s.num_waiting as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                usage,
            ),
            (
                "engine:state_checkpoint_blocks",
                "KV-pool blocks the prefix cache holds for checkpoints of recurrent state \
                 (each checkpoint: /version's state_checkpoint_bytes).",
                s.state_checkpoint_blocks as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {value:?}"
            );
        }
        let counters: [(&str, &str, u64); 6] = [
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                s.prompt_tokens_total,
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                s.generation_tokens_total,
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions from the engine.",
                s.num_preemptions,
            ),
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                s.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                s.prefix_cache_hits,
            ),
            (
                "engine:state_checkpoints_total",
                "Checkpoints of recurrent state taken for the prefix cache.",
                s.state_checkpoints_total,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {value}"
            );
        }
        let name = "vllm:request_success_total";
        let _ = writeln!(out, "# HELP {name} Count of finished requests by finish reason (abort = client gone, error = this sequence failed alone).\n# TYPE {name} counter");
        for (reason, count) in ["stop", "length", "abort", "error"]
            .iter()
            .zip(inner.finished)
        {
            let _ = writeln!(out, "{name}{{{l},finished_reason=\"{reason}\"}} {count}");
        }
        inner.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            l,
        );
        inner.tpot.render(
            &mut out,
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            l,
        );
        inner.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            l,
        );
        inner.queue.render(
            &mut out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            l,
        );
        for (histogram, name, help) in [
            (
                &inner.prefill,
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
            ),
            (
                &inner.decode,
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
            ),
            (
                &inner.inference,
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
            ),
            (
                &inner.iteration_tokens,
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
            ),
        ] {
            histogram.render(&mut out, name, help, l);
        }
        let name = "engine:step_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Engine step seconds by kind: decode-only, mixed (prefill chunks beside decodes), prefill-only.
# TYPE {name} histogram");
        for (kind, histogram) in StepKind::ALL.iter().zip(&inner.steps) {
            histogram.render_series(&mut out, name, &format!("{l},kind=\"{}\"", kind.name()));
        }
        let busy: f64 = inner.steps.iter().map(|h| h.sum).sum();
        let name = "engine:busy_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Seconds the engine spent in steps.\n# TYPE {name} counter\n{name}{{{l}}} {busy:?}"
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let metrics = Metrics::new("m\"x");
        metrics.record_finished(
            FinishReason::Length,
            Some(SeqTimings {
                queue: 0.2,
                ttft: 0.003,
                e2e: 1.2,
                tpot: Some(0.02),
                prefill: 0.001,
                decode: 0.9,
                inference: 0.95,
            }),
        );
        metrics.record_finished(FinishReason::Abort, None);
        metrics.set_stats(EngineStats {
            kv_blocks_total: 4,
            kv_blocks_used: 1,
            ..EngineStats::default()
        });
        let text = metrics.render();
        assert!(
            text.contains(
                "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.001\"} 0\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.005\"} 1\n"
        ));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 1\n"
        ));
        assert!(text.contains("vllm:e2e_request_latency_seconds_count{model_name=\"m\\\"x\"} 1\n"));
        assert!(text.contains(
            "vllm:request_success_total{model_name=\"m\\\"x\",finished_reason=\"abort\"} 1\n"
        ));
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25\n"));
    }

    /// A scripted mix of steps and one finished request, counted by hand: the iteration
    /// tokens, each kind's step histogram, the busy seconds and the request's phases.
    #[test]
    fn step_telemetry_counts_by_hand() {
        let metrics = Metrics::new("m");
        let step = |kind, tokens, secs| StepRecord { kind, tokens, secs };
        // A 300-token prefill alone, two decode steps of 4 tokens, a mixed step of 64 + 3.
        metrics.record_step(step(StepKind::PrefillOnly, 300, 0.2));
        metrics.record_step(step(StepKind::DecodeOnly, 4, 0.004));
        metrics.record_step(step(StepKind::DecodeOnly, 4, 0.006));
        metrics.record_step(step(StepKind::Mixed, 67, 0.05));
        metrics.record_finished(
            FinishReason::Stop,
            Some(SeqTimings {
                queue: 0.1,
                ttft: 0.3,
                e2e: 2.0,
                tpot: Some(0.02),
                prefill: 0.2,
                decode: 1.7,
                inference: 1.9,
            }),
        );
        let text = metrics.render();
        let has = |line: &str| assert!(text.contains(&format!("{line}\n")), "{line}\n{text}");
        has("vllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"1.0\"} 0");
        has("vllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"8.0\"} 2");
        has("vllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"128.0\"} 3");
        has("vllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"512.0\"} 4");
        has("vllm:iteration_tokens_total_sum{model_name=\"m\"} 375.0");
        has("vllm:iteration_tokens_total_count{model_name=\"m\"} 4");
        has("engine:step_duration_seconds_count{model_name=\"m\",kind=\"decode-only\"} 2");
        has("engine:step_duration_seconds_sum{model_name=\"m\",kind=\"decode-only\"} 0.01");
        has("engine:step_duration_seconds_count{model_name=\"m\",kind=\"mixed\"} 1");
        has("engine:step_duration_seconds_count{model_name=\"m\",kind=\"prefill-only\"} 1");
        has("engine:step_duration_seconds_bucket{model_name=\"m\",kind=\"prefill-only\",le=\"0.1\"} 0");
        has("engine:step_duration_seconds_bucket{model_name=\"m\",kind=\"prefill-only\",le=\"0.25\"} 1");
        has("engine:busy_seconds_total{model_name=\"m\"} 0.26");
        has("vllm:request_prefill_time_seconds_sum{model_name=\"m\"} 0.2");
        has("vllm:request_decode_time_seconds_sum{model_name=\"m\"} 1.7");
        has("vllm:request_inference_time_seconds_sum{model_name=\"m\"} 1.9");
        has("vllm:request_inference_time_seconds_count{model_name=\"m\"} 1");
        assert_eq!(
            text.matches("# TYPE engine:step_duration_seconds histogram")
                .count(),
            1
        );
    }
}
