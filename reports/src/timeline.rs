//! The run over time (`timeline.json`): slices aligned to the run's origin, each with the
//! requests started and finished in it (a request is placed in the slice where it finished),
//! its errors, the output tokens that arrived in it and their rate, the TTFT / TPOT / E2E
//! percentiles of the requests that finished in it, and the server's gauges scraped in it.
//! Where a queue builds up, a warm-up leaks into the window or the server stalls, this is
//! where it shows.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::latency::request_latency;
use crate::records::{Phase, RequestRecord};
use crate::server_metrics::{Kind, Scrape, QUANTITIES};
use crate::stats::percentile_nearest_rank;

/// The file in a run folder.
pub const TIMELINE_FILE: &str = "timeline.json";

/// Slices are at most this long by default (`--slice`), and at least 30 to a run.
pub const DEFAULT_SLICE_S: f64 = 10.0;

/// The run's phases on its clock (seconds from the origin), to label the slices.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PhaseBounds {
    /// The measurement window starts here.
    pub warmup_s: f64,
    /// And ends here (`None`: at the end of the run).
    pub measured_end_s: Option<f64>,
}

impl PhaseBounds {
    fn phase_at(&self, t_s: f64) -> Phase {
        if t_s < self.warmup_s {
            Phase::Warmup
        } else if self.measured_end_s.is_some_and(|end| t_s >= end) {
            Phase::Cooldown
        } else {
            Phase::Measured
        }
    }
}

/// `timeline.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub slice_s: f64,
    pub phases: PhaseBounds,
    pub slices: Vec<Slice>,
}

/// One slice of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slice {
    pub start_s: f64,
    pub end_s: f64,
    /// The phase of the schedule at the slice's start.
    pub phase: Phase,
    /// Requests sent in the slice.
    pub started: u64,
    /// Requests that ended in the slice, successes and failures.
    pub finished: u64,
    /// The same by the phase of each request (which a later slice's phase may not be):
    /// summed over the slices, each equals the run's own count of that phase.
    pub finished_by_phase: BTreeMap<String, u64>,
    /// Failed requests that ended in the slice.
    pub errors: u64,
    /// Output tokens whose chunks arrived in the slice.
    pub output_tokens: u64,
    pub output_tok_per_s: f64,
    pub ttft_ms: Quantiles,
    pub tpot_ms: Quantiles,
    pub e2el_ms: Quantiles,
    /// The mean of each server gauge over the scrapes taken in the slice, by its label.
    pub server: BTreeMap<String, f64>,
}

/// A distribution's size, median and p90 (nearest rank), `None` when empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub n: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
}

impl Quantiles {
    fn of(values: &[f64]) -> Quantiles {
        Quantiles {
            n: values.len() as u64,
            p50: percentile_nearest_rank(values, 50.0),
            p90: percentile_nearest_rank(values, 90.0),
        }
    }
}

/// The default slice of a run that spans `span_s`: 10 s, or a thirtieth of the run when
/// that is shorter.
pub fn default_slice_s(span_s: f64) -> f64 {
    let slice = DEFAULT_SLICE_S.min(span_s / 30.0);
    if slice > 0.0 {
        slice
    } else {
        DEFAULT_SLICE_S
    }
}

fn phase_name(phase: Phase) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The timeline of `records` in slices of `slice_s` (default: [`default_slice_s`]); the
/// scrapes' Unix times are placed on the run's clock by `origin_unix_ms`, its t = 0.
pub fn build(
    records: &[RequestRecord],
    phases: PhaseBounds,
    slice_s: Option<f64>,
    scrapes: &[Scrape],
    origin_unix_ms: f64,
) -> Timeline {
    let end_ms = records
        .iter()
        .map(|r| r.end_ms.max(r.sent_ms))
        .fold(0.0, f64::max);
    let slice_s = slice_s
        .filter(|s| *s > 0.0)
        .unwrap_or_else(|| default_slice_s(end_ms / 1000.0));
    let count = ((end_ms / 1000.0 / slice_s).floor() as usize + 1).max(1);
    let index = |ms: f64| ((ms.max(0.0) / 1000.0 / slice_s) as usize).min(count - 1);
    let mut slices: Vec<Slice> = (0..count)
        .map(|i| {
            let start_s = i as f64 * slice_s;
            Slice {
                start_s,
                end_s: start_s + slice_s,
                phase: phases.phase_at(start_s),
                started: 0,
                finished: 0,
                finished_by_phase: BTreeMap::new(),
                errors: 0,
                output_tokens: 0,
                output_tok_per_s: 0.0,
                ttft_ms: Quantiles::default(),
                tpot_ms: Quantiles::default(),
                e2el_ms: Quantiles::default(),
                server: BTreeMap::new(),
            }
        })
        .collect();
    let mut latencies: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); count];
    for r in records {
        slices[index(r.sent_ms)].started += 1;
        let done = &mut slices[index(r.end_ms)];
        done.finished += 1;
        *done
            .finished_by_phase
            .entry(phase_name(r.phase))
            .or_insert(0) += 1;
        done.errors += u64::from(!r.is_success());
        for (&at, &tokens) in r.chunk_ms.iter().zip(&r.chunk_tokens) {
            slices[index(at)].output_tokens += u64::from(tokens);
        }
        if let Some(latency) = request_latency(r) {
            let (ttft, tpot, e2el) = &mut latencies[index(r.end_ms)];
            ttft.push(latency.ttft);
            tpot.extend(latency.tpot);
            e2el.push(latency.e2el);
        }
    }
    let mut gauges: Vec<BTreeMap<String, Vec<f64>>> = vec![BTreeMap::new(); count];
    for scrape in scrapes {
        let at_ms = scrape.unix_ms - origin_unix_ms;
        if at_ms < 0.0 || at_ms > end_ms {
            continue;
        }
        for q in QUANTITIES.iter().filter(|q| q.kind == Kind::Gauge) {
            if let Some(v) = q.names.iter().find_map(|n| scrape.values.get(*n)) {
                gauges[index(at_ms)]
                    .entry(q.label.to_string())
                    .or_default()
                    .push(*v);
            }
        }
    }
    for ((slice, (ttft, tpot, e2el)), gauges) in slices.iter_mut().zip(latencies).zip(gauges) {
        slice.output_tok_per_s = slice.output_tokens as f64 / slice_s;
        slice.ttft_ms = Quantiles::of(&ttft);
        slice.tpot_ms = Quantiles::of(&tpot);
        slice.e2el_ms = Quantiles::of(&e2el);
        slice.server = gauges
            .into_iter()
            .map(|(label, values)| (label, values.iter().sum::<f64>() / values.len() as f64))
            .collect();
    }
    Timeline {
        slice_s,
        phases,
        slices,
    }
}

impl Timeline {
    /// Writes `timeline.json` into the run folder `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(TIMELINE_FILE);
        let text = serde_json::to_string_pretty(self).context("serialising the timeline")?;
        std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a run folder's `timeline.json`, if it has one.
    pub fn read(dir: &Path) -> Result<Option<Timeline>> {
        let path = dir.join(TIMELINE_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("{}: invalid timeline", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{ChunkTokensSource, CountSource, ErrorKind, RequestError};

    fn record(id: u64, phase: Phase, sent_ms: f64, chunks: &[f64]) -> RequestRecord {
        RequestRecord {
            id,
            phase,
            scheduled_ms: sent_ms,
            queue_ms: 0.0,
            sent_ms,
            connect_ms: None,
            first_token_ms: chunks.first().copied(),
            first_answer_ms: chunks.first().copied(),
            end_ms: chunks.last().copied().unwrap_or(sent_ms + 5.0),
            chunk_ms: chunks.to_vec(),
            chunk_tokens: vec![2; chunks.len()],
            chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
            prompt_tokens: 4,
            prompt_tokens_source: CountSource::Usage,
            cached_tokens: None,
            server_timing: None,
            output_tokens: 2 * chunks.len() as u64,
            output_tokens_source: CountSource::Usage,
            reasoning_tokens: 0,
            reasoning_tokens_source: CountSource::Counted,
            requested_output_tokens: 4,
            short_output: false,
            prefix_group: None,
            session: None,
            class: None,
            http_status: Some(200),
            error: None,
        }
    }

    #[test]
    fn slices_count_each_request_once_and_add_up_phase_by_phase() {
        // Warm-up for 1 s, measured until 3 s: requests every 100 ms from 0 to 3.9 s, each
        // answered in 3 chunks 150 ms apart (the last at send + 450 ms, often a slice later).
        let phases = PhaseBounds {
            warmup_s: 1.0,
            measured_end_s: Some(3.0),
        };
        let mut records: Vec<RequestRecord> = (0..40)
            .map(|i| {
                let at = i as f64 * 100.0;
                let phase = phases.phase_at(at / 1000.0);
                record(i, phase, at, &[at + 150.0, at + 300.0, at + 450.0])
            })
            .collect();
        records[7].error = Some(RequestError {
            kind: ErrorKind::Http5xx,
            message: "x".into(),
        });
        let t = build(&records, phases, Some(0.5), &[], 0.0);
        assert_eq!(t.slices.len(), 9, "4.35 s of run in 0.5 s slices");
        assert_eq!(t.slices.iter().map(|s| s.started).sum::<u64>(), 40);
        assert_eq!(t.slices.iter().map(|s| s.finished).sum::<u64>(), 40);
        for phase in [Phase::Warmup, Phase::Measured, Phase::Cooldown] {
            let in_slices: u64 = t
                .slices
                .iter()
                .filter_map(|s| s.finished_by_phase.get(&phase_name(phase)))
                .sum();
            let in_run = records.iter().filter(|r| r.phase == phase).count() as u64;
            assert_eq!(in_slices, in_run, "{phase:?}");
        }
        assert_eq!(t.slices.iter().map(|s| s.errors).sum::<u64>(), 1);
        assert_eq!(t.slices.iter().map(|s| s.output_tokens).sum::<u64>(), 240);
        assert_eq!(
            (t.slices[0].phase, t.slices[2].phase, t.slices[6].phase),
            (Phase::Warmup, Phase::Measured, Phase::Cooldown)
        );
        // Slice 1 (0.5–1 s) finishes the requests sent at 0.1 … 0.5 s (ends 0.55 … 0.95 s).
        assert_eq!(t.slices[1].finished, 5);
        assert_eq!(t.slices[1].ttft_ms.p50, Some(150.0));
        assert_eq!(
            t.slices[1].output_tok_per_s,
            t.slices[1].output_tokens as f64 / 0.5
        );
        assert_eq!(default_slice_s(60.0), 2.0);
        assert_eq!(default_slice_s(3600.0), 10.0);
    }
}
