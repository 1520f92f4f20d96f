//! `summary.json`: the run's results under a stable, versioned schema.
//!
//! Top-level keys follow `vllm bench serve --save-result` wherever the meaning is the same
//! (`completed`, `failed`, `duration`, `request_throughput`, `output_throughput`,
//! `total_token_throughput`, `{mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms`). As in vLLM,
//! `itl` there is the raw per-chunk gap; the token-true ITL is `metrics.token_itl`.
//! Everything else of ours (all distributions, schedule lag, errors by kind, client-bound
//! flag) sits beside them, among them the time to first answer token
//! (`{mean,median,std,p90,p99}_time_to_first_answer_ms`, the first answer chunk after any
//! reasoning) and the reasoning token count.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::metrics::{DistStats, Metrics, Slo};
use crate::records::SCHEMA_VERSION;

/// The content of `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub schema_version: u32,
    /// The run was stopped early (Ctrl-C / SIGTERM); numbers cover what was measured.
    pub incomplete: bool,
    pub completed: u64,
    pub failed: u64,
    /// Measurement window in seconds.
    pub duration: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    /// Requests/s meeting every SLO in `slos` (`null` without SLOs).
    pub request_goodput: Option<f64>,
    pub output_throughput: f64,
    pub input_throughput: f64,
    pub total_token_throughput: f64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub std_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    /// Time to first answer token: equal to TTFT when no reasoning streamed.
    #[serde(default)]
    pub mean_time_to_first_answer_ms: f64,
    #[serde(default)]
    pub median_time_to_first_answer_ms: f64,
    #[serde(default)]
    pub std_time_to_first_answer_ms: f64,
    #[serde(default)]
    pub p90_time_to_first_answer_ms: f64,
    #[serde(default)]
    pub p99_time_to_first_answer_ms: f64,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub std_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub std_itl_ms: f64,
    pub p99_itl_ms: f64,
    pub mean_e2el_ms: f64,
    pub median_e2el_ms: f64,
    pub std_e2el_ms: f64,
    pub p99_e2el_ms: f64,
    /// Failed requests by error kind (`connect`, `http_429`, `timeout`, …).
    pub errors: BTreeMap<String, u64>,
    /// Planned requests without a record: never sent before the run was stopped.
    pub unfinished: u64,
    /// Requests in flight when the run was stopped: recorded with their partial timings
    /// (`phase: "interrupted"`), not in any number above.
    #[serde(default)]
    pub interrupted: u64,
    /// Warm-up and cool-down records, not in any number above.
    pub excluded_outside_window: u64,
    pub short_outputs: u64,
    pub counted_output_tokens: u64,
    /// Output tokens spent reasoning (part of `total_output_tokens`).
    #[serde(default)]
    pub total_reasoning_tokens: u64,
    /// Successes whose reasoning tokens were counted from the chunks, not read from usage.
    #[serde(default)]
    pub counted_reasoning_tokens: u64,
    /// Successes that streamed reasoning but no answer (no time to first answer).
    #[serde(default)]
    pub no_answer: u64,
    /// The scheduled rate of the measured requests (open loop; see [`crate::rates`]).
    #[serde(alias = "offered_rate")]
    pub scheduled_rate: Option<f64>,
    /// Their sent rate.
    #[serde(alias = "achieved_rate")]
    pub sent_rate: Option<f64>,
    /// CPU time of the client process over the run, as a share of the cores it may use.
    #[serde(default)]
    pub client_cpu: Option<f64>,
    pub client_bound: bool,
    pub client_bound_reasons: Vec<String>,
    pub slos: Vec<Slo>,
    /// Prompt tokens served from the server's prefix cache over all prompt tokens, of the
    /// requests whose server reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_prompt_share: Option<f64>,
    /// Results by class (`--class-by`), each with the latency fields of the whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<crate::classes::ClassStats>,
    /// Multi-turn sessions: sessions and their rate, how they ended, and each turn index's
    /// latencies, prompt sizes and prefix-cache hits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<crate::sessions::SessionStats>,
    /// Every distribution, in ms, keyed `ttft`, `time_to_first_answer`, `tpot`, `itl` (chunk), `token_itl`, `e2el`,
    /// `ttft_from_scheduled`, `e2el_from_scheduled`, `schedule_lag`, `queue_time`, `connect`
    /// (requests that opened a connection during the window; its `count` is how many),
    /// `client_server_gap` (E2E minus the server's own time, of the requests whose server
    /// said it).
    pub metrics: BTreeMap<String, DistStats>,
    /// What limited the run (`crate::diagnosis`), once diagnosed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regime: Option<crate::diagnosis::Regime>,
    /// The sentence of numbers behind `regime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regime_evidence: Option<String>,
    /// The whole diagnosis: the bound beside the measurement and what was missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<crate::diagnosis::Diagnosis>,
}

impl Summary {
    /// Builds the summary of a run from its metrics.
    pub fn new(m: &Metrics, slos: &[Slo], incomplete: bool, unfinished: u64) -> Summary {
        let metrics = BTreeMap::from([
            ("ttft".to_string(), m.ttft),
            ("time_to_first_answer".to_string(), m.time_to_first_answer),
            ("tpot".to_string(), m.tpot),
            ("itl".to_string(), m.chunk_itl),
            ("token_itl".to_string(), m.token_itl),
            ("e2el".to_string(), m.e2el),
            ("ttft_from_scheduled".to_string(), m.ttft_from_scheduled),
            ("e2el_from_scheduled".to_string(), m.e2el_from_scheduled),
            ("schedule_lag".to_string(), m.schedule_lag),
            ("queue_time".to_string(), m.queue_time),
            ("connect".to_string(), m.connect),
            ("client_server_gap".to_string(), m.client_server_gap),
        ]);
        Summary {
            schema_version: SCHEMA_VERSION,
            incomplete,
            completed: m.completed,
            failed: m.failed,
            duration: m.duration_s,
            total_input_tokens: m.total_input_tokens,
            total_output_tokens: m.total_output_tokens,
            request_throughput: m.request_throughput,
            request_goodput: m.request_goodput,
            output_throughput: m.output_throughput,
            input_throughput: m.input_throughput,
            total_token_throughput: m.total_token_throughput,
            mean_ttft_ms: m.ttft.mean,
            median_ttft_ms: m.ttft.p50,
            std_ttft_ms: m.ttft.std,
            p99_ttft_ms: m.ttft.p99,
            mean_time_to_first_answer_ms: m.time_to_first_answer.mean,
            median_time_to_first_answer_ms: m.time_to_first_answer.p50,
            std_time_to_first_answer_ms: m.time_to_first_answer.std,
            p90_time_to_first_answer_ms: m.time_to_first_answer.p90,
            p99_time_to_first_answer_ms: m.time_to_first_answer.p99,
            mean_tpot_ms: m.tpot.mean,
            median_tpot_ms: m.tpot.p50,
            std_tpot_ms: m.tpot.std,
            p99_tpot_ms: m.tpot.p99,
            mean_itl_ms: m.chunk_itl.mean,
            median_itl_ms: m.chunk_itl.p50,
            std_itl_ms: m.chunk_itl.std,
            p99_itl_ms: m.chunk_itl.p99,
            mean_e2el_ms: m.e2el.mean,
            median_e2el_ms: m.e2el.p50,
            std_e2el_ms: m.e2el.std,
            p99_e2el_ms: m.e2el.p99,
            errors: m.errors.clone(),
            unfinished,
            interrupted: m.interrupted,
            excluded_outside_window: m.excluded_outside_window,
            short_outputs: m.short_outputs,
            counted_output_tokens: m.counted_output_tokens,
            total_reasoning_tokens: m.total_reasoning_tokens,
            counted_reasoning_tokens: m.counted_reasoning_tokens,
            no_answer: m.no_answer,
            scheduled_rate: m.scheduled_rate,
            sent_rate: m.sent_rate,
            client_cpu: m.client_cpu,
            client_bound: m.client_bound,
            client_bound_reasons: m.client_bound_reasons.clone(),
            slos: slos.to_vec(),
            cached_prompt_share: m.cached_prompt_share,
            sessions: m.sessions.clone(),
            classes: Vec::new(),
            metrics,
            regime: None,
            regime_evidence: None,
            diagnosis: None,
        }
    }

    /// Writes pretty JSON to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).context("serialising summary")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a `summary.json`.
    pub fn read(path: &Path) -> Result<Summary> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: invalid summary", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_keys_are_present_and_round_trip() {
        let mut m = Metrics {
            completed: 5,
            ..Metrics::default()
        };
        m.ttft.p50 = 50.0;
        let s = Summary::new(&m, &[], true, 2);
        let value = serde_json::to_value(&s).unwrap();
        for key in [
            "completed",
            "failed",
            "duration",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "mean_ttft_ms",
            "median_ttft_ms",
            "std_ttft_ms",
            "p99_ttft_ms",
            "median_time_to_first_answer_ms",
            "p90_time_to_first_answer_ms",
            "p99_tpot_ms",
            "median_itl_ms",
            "std_e2el_ms",
            "schema_version",
        ] {
            assert!(value.get(key).is_some(), "missing {key}");
        }
        assert_eq!(value["median_ttft_ms"], 50.0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        s.write(&path).unwrap();
        assert_eq!(Summary::read(&path).unwrap(), s);
    }
}
