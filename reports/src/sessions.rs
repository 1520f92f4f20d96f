//! Multi-turn sessions in a run's records: how many started in the measurement window, at
//! what rate, how they ended, and latencies, prompt sizes and prefix-cache hits by turn
//! index (turn 1 against later turns is the server's prefix cache at work). A session
//! belongs to the window by its first turn: all its turns share that turn's phase, except a
//! turn cut in flight (a stop, or the session drain limit), recorded as interrupted, which
//! still says how its session ended.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::latency::{request_latency, DistStats};
use crate::records::{Phase, RequestRecord};

/// The sessions of a run's measurement window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Sessions whose first turn was scheduled in the measurement window.
    pub sessions: u64,
    /// Sessions per second: (first turns − 1) over the span of their scheduled sends.
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
        let sessions: std::collections::BTreeSet<u64> = records
            .iter()
            .filter_map(|r| r.session.filter(|s| s.window == Phase::Measured))
            .map(|s| s.session)
            .collect();
        if sessions.is_empty() {
            return None;
        }
        let mine: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| matches!(r.phase, Phase::Measured | Phase::Interrupted))
            .filter(|r| r.session.is_some_and(|s| s.window == Phase::Measured))
            .collect();
        let mut ended = BTreeMap::new();
        let mut turns: BTreeMap<u32, Vec<&RequestRecord>> = BTreeMap::new();
        let mut starts = Vec::new();
        for r in &mine {
            let Some(s) = r.session else { continue };
            if let Some(end) = s.end {
                let name = serde_json::to_value(end)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                *ended.entry(name).or_insert(0) += 1;
            }
            if r.phase == Phase::Measured {
                turns.entry(s.turn).or_default().push(r);
                if s.turn == 1 {
                    starts.push(r.scheduled_ms);
                }
            }
        }
        let n = sessions.len() as u64;
        let first = starts.iter().copied().fold(f64::INFINITY, f64::min);
        let last = starts.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let session_rate = if starts.len() >= 2 && last > first {
            (starts.len() - 1) as f64 / ((last - first) / 1000.0)
        } else if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        };
        Some(SessionStats {
            sessions: n,
            session_rate,
            requests_per_session: mine.len() as f64 / n as f64,
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
