//! Multi-turn sessions in a run's records: how many started in the measurement window, at
//! what rate, how they ended, and latencies, prompt sizes and prefix-cache hits by turn
//! index (turn 1 against later turns is the server's prefix cache at work). A session
//! belongs to the window by its first turn: all its turns share that turn's phase.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::{request_latency, DistStats};
use crate::records::{Phase, RequestRecord};

/// The sessions of a run's measurement window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Sessions whose first turn was scheduled in the measurement window.
    pub sessions: u64,
    /// Sessions per second over the measurement window.
    pub session_rate: f64,
    /// Requests (turns sent) per session.
    pub requests_per_session: f64,
    /// How the sessions ended (`completed`, `capped`, `failed`, `cut`).
    pub ended: BTreeMap<String, u64>,
    pub by_turn: Vec<TurnStats>,
}

/// The requests of one turn index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    /// 1 for sessions' first turns.
    pub turn: u32,
    /// Successful requests of this turn index.
    pub completed: u64,
    pub failed: u64,
    pub ttft: DistStats,
    pub e2el: DistStats,
    /// Prompt tokens (the history included), mean over the successes.
    pub prompt_tokens_mean: f64,
    /// Prompt tokens served from the prefix cache over all prompt tokens, of the successes
    /// whose server reported it (`usage.prompt_tokens_details.cached_tokens`).
    pub cached_share: Option<f64>,
}

impl SessionStats {
    /// The statistics of the measured session turns of `records` over a window of
    /// `duration_s`; `None` when the run has no sessions.
    pub fn of(records: &[RequestRecord], duration_s: f64) -> Option<SessionStats> {
        let measured: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| r.phase == Phase::Measured && r.session.is_some())
            .collect();
        if measured.is_empty() {
            return None;
        }
        let mut sessions = std::collections::BTreeSet::new();
        let mut ended = BTreeMap::new();
        let mut turns: BTreeMap<u32, Vec<&RequestRecord>> = BTreeMap::new();
        for r in &measured {
            let Some(s) = r.session else { continue };
            sessions.insert(s.session);
            if let Some(end) = s.end {
                let name = serde_json::to_value(end)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                *ended.entry(name).or_insert(0) += 1;
            }
            turns.entry(s.turn).or_default().push(r);
        }
        let n = sessions.len() as u64;
        Some(SessionStats {
            sessions: n,
            session_rate: if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            },
            requests_per_session: measured.len() as f64 / n as f64,
            ended,
            by_turn: turns
                .into_iter()
                .map(|(turn, records)| TurnStats::of(turn, &records))
                .collect(),
        })
    }
}

impl TurnStats {
    fn of(turn: u32, records: &[&RequestRecord]) -> TurnStats {
        let (mut ttft, mut e2el, mut prompt) = (Vec::new(), Vec::new(), 0u64);
        let (mut cached, mut cached_of) = (0u64, 0u64);
        let mut failed = 0;
        for r in records {
            let Some(latency) = request_latency(r) else {
                failed += 1;
                continue;
            };
            ttft.push(latency.ttft);
            e2el.push(latency.e2el);
            prompt += r.prompt_tokens;
            if let Some(c) = r.cached_tokens {
                cached += c;
                cached_of += r.prompt_tokens;
            }
        }
        let completed = ttft.len() as u64;
        TurnStats {
            turn,
            completed,
            failed,
            ttft: DistStats::from_values(&ttft),
            e2el: DistStats::from_values(&e2el),
            prompt_tokens_mean: if completed > 0 {
                prompt as f64 / completed as f64
            } else {
                0.0
            },
            cached_share: (cached_of > 0).then(|| cached as f64 / cached_of as f64),
        }
    }
}
