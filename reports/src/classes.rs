//! Results by class (`--class-by`: a trace's model or service column, a model mix's models,
//! a session turn's kind, a prefix group): each class's measured requests with the same
//! latency numbers as the whole, so that a mixed workload is read per class.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::latency::DistStats;
use crate::metrics::{self, MetricsOptions};
use crate::records::{Phase, RequestRecord};

/// One class's numbers (`summary.json`'s `classes`), its latency fields named as the
/// whole's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassStats {
    pub class: String,
    /// Measured requests of the class, failed ones included.
    pub requests: u64,
    pub completed: u64,
    pub failed: u64,
    /// Its completed requests per second of the whole run's window.
    pub request_throughput: f64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub std_ttft_ms: f64,
    pub p99_ttft_ms: f64,
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
    /// The distributions with their intervals, keyed `ttft`, `time_to_first_answer`,
    /// `tpot`, `itl` (chunk), `token_itl`, `e2el`.
    pub metrics: BTreeMap<String, DistStats>,
}

/// The class of the requests without one, when others have one.
pub const NO_CLASS: &str = "(none)";

/// The classes of `records`' measured requests, by name; none when no record has one (when
/// some do, the others are [`NO_CLASS`], so that the classes add up to the whole).
pub fn of(records: &[RequestRecord], opts: &MetricsOptions, duration_s: f64) -> Vec<ClassStats> {
    let measured = records.iter().filter(|r| r.phase == Phase::Measured);
    if measured.clone().all(|r| r.class.is_none()) {
        return Vec::new();
    }
    let mut by_class: BTreeMap<&str, Vec<RequestRecord>> = BTreeMap::new();
    for r in measured {
        let class = r.class.as_deref().unwrap_or(NO_CLASS);
        by_class.entry(class).or_default().push(r.clone());
    }
    by_class
        .into_iter()
        .map(|(class, records)| {
            let m = metrics::compute(&records, opts);
            ClassStats {
                class: class.to_string(),
                requests: m.completed + m.failed,
                completed: m.completed,
                failed: m.failed,
                request_throughput: if duration_s > 0.0 {
                    m.completed as f64 / duration_s
                } else {
                    0.0
                },
                mean_ttft_ms: m.ttft.mean,
                median_ttft_ms: m.ttft.p50,
                std_ttft_ms: m.ttft.std,
                p99_ttft_ms: m.ttft.p99,
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
                metrics: BTreeMap::from([
                    ("ttft".to_string(), m.ttft),
                    ("time_to_first_answer".to_string(), m.time_to_first_answer),
                    ("tpot".to_string(), m.tpot),
                    ("itl".to_string(), m.chunk_itl),
                    ("token_itl".to_string(), m.token_itl),
                    ("e2el".to_string(), m.e2el),
                ]),
            }
        })
        .collect()
}
