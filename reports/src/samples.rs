//! Per-request latency samples of one run (or one sweep level, or one A/B side): the input of
//! SLO checks, capacity plans, A/B tests and plots.

use serde::{Deserialize, Serialize};

use crate::metrics::{request_latency, SloMetric};
use crate::records::{Phase, RequestRecord};

/// Latencies of one successful request (ms), keyed by its request id.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RequestSample {
    pub id: u64,
    pub ttft_ms: f64,
    /// Time to first answer token; `None` when only reasoning arrived.
    #[serde(default)]
    pub ttfa_ms: Option<f64>,
    /// `None` for a single-token output.
    pub tpot_ms: Option<f64>,
    pub e2el_ms: f64,
}

impl RequestSample {
    pub fn value(&self, metric: SloMetric) -> Option<f64> {
        match metric {
            SloMetric::Ttft => Some(self.ttft_ms),
            SloMetric::TimeToFirstAnswer => self.ttfa_ms,
            SloMetric::Tpot => self.tpot_ms,
            SloMetric::E2el => Some(self.e2el_ms),
        }
    }
}

/// All latency samples of the measurement window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySamples {
    pub requests: Vec<RequestSample>,
    /// Schedule lag (actual − scheduled send, ms) of every measured request, failed ones too.
    pub schedule_lag_ms: Vec<f64>,
}

impl LatencySamples {
    /// Samples of the measured phase: successful requests only (failed ones are counted
    /// elsewhere, by `metrics::compute`).
    pub fn from_records(records: &[RequestRecord]) -> LatencySamples {
        let measured = records.iter().filter(|r| r.phase == Phase::Measured);
        let mut samples = LatencySamples::default();
        for record in measured {
            samples.schedule_lag_ms.push(record.schedule_lag_ms());
            if let Some(latency) = request_latency(record) {
                samples.requests.push(RequestSample {
                    id: record.id,
                    ttft_ms: latency.ttft,
                    ttfa_ms: latency.ttfa,
                    tpot_ms: latency.tpot,
                    e2el_ms: latency.e2el,
                });
            }
        }
        samples
    }

    /// Every request's value of `metric` (requests without one are skipped).
    pub fn values(&self, metric: SloMetric) -> Vec<f64> {
        self.requests
            .iter()
            .filter_map(|r| r.value(metric))
            .collect()
    }
}

/// Display name of a metric, as used in tables and plots.
pub fn metric_label(metric: SloMetric) -> &'static str {
    match metric {
        SloMetric::Ttft => "TTFT",
        SloMetric::TimeToFirstAnswer => "TTFA",
        SloMetric::Tpot => "TPOT",
        SloMetric::E2el => "E2E",
    }
}

/// The latency metrics compared and plotted, in display order.
pub const LATENCY_METRICS: [SloMetric; 4] = [
    SloMetric::Ttft,
    SloMetric::TimeToFirstAnswer,
    SloMetric::Tpot,
    SloMetric::E2el,
];
