//! Multi-turn sessions in a run's records: how many started in the measurement window, at
//! what rate, how they ended, and latencies, prompt sizes and prefix-cache hits by turn
//! index (turn 1 against later turns is the server's prefix cache at work); per session its
//! end-to-end time split into time in the server and time waiting (think time, or tools),
//! and the prompt tokens it sent against those the server took from its cache; TTFT against
//! the context length; and in agent sessions, how many turns called tools. A session
//! belongs to the window by its first turn: all its turns share that turn's phase, except a
//! turn cut in flight (a stop, or the session drain limit), recorded as interrupted, which
//! still says how its session ended.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::latency::{request_latency, DistStats};
use crate::records::{Phase, RequestRecord, SessionEnd};

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
    /// Per session, over those that completed or were capped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_session: Option<PerSession>,
    /// Tool calls, when the sessions offered tools (agent sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolUse>,
    /// TTFT of the measured turns by their prompt length (history included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ttft_by_context: Vec<ContextBin>,
}

/// Each session's totals, as distributions over the sessions that completed or were capped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PerSession {
    pub sessions: u64,
    /// From the first turn's scheduled send to the last turn's end (ms).
    pub e2e: DistStats,
    /// Time in the server: the sum of its turns' send-to-end times (ms).
    pub server: DistStats,
    /// Time waiting between turns: think times, or the tools' latencies (ms).
    pub waiting: DistStats,
    /// Prompt tokens sent, over all turns of these sessions (each turn's history included).
    pub prompt_tokens: u64,
    /// Of the prompt tokens of the turns whose server reported it, those served from the
    /// prefix cache, and the prompt tokens of those turns.
    pub cached_tokens: Option<(u64, u64)>,
}

/// How often the model called the tools it was offered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    /// Measured turns that offered tools and were answered.
    pub turns: u64,
    /// Of those, the turns whose answer called at least one tool.
    pub turns_with_calls: u64,
    pub calls: u64,
    /// Sessions that failed on a call the client could not run.
    pub unusable_calls: u64,
}

/// The measured turns whose prompt length is in `[from, to)` tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextBin {
    pub from: u64,
    pub to: u64,
    pub ttft: DistStats,
    /// Prompt tokens served from the prefix cache over all prompt tokens, of the turns
    /// whose server reported it.
    pub cached_share: Option<f64>,
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
        let measured: Vec<&RequestRecord> = mine
            .iter()
            .copied()
            .filter(|r| r.phase == Phase::Measured)
            .collect();
        Some(SessionStats {
            sessions: n,
            session_rate,
            requests_per_session: mine.len() as f64 / n as f64,
            ended,
            by_turn: turns
                .into_iter()
                .map(|(turn, records)| TurnStats::of(turn, &records))
                .collect(),
            per_session: PerSession::of(&mine),
            tools: ToolUse::of(&measured, &mine),
            ttft_by_context: ContextBin::of(&measured),
        })
    }
}

impl PerSession {
    /// The sessions of `records` (one window's turns) that completed or were capped.
    fn of(records: &[&RequestRecord]) -> Option<PerSession> {
        let mut by_session: BTreeMap<u64, Vec<&RequestRecord>> = BTreeMap::new();
        for r in records {
            if let Some(s) = r.session {
                by_session.entry(s.session).or_default().push(r);
            }
        }
        let mut out = PerSession::default();
        let (mut e2e, mut server, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cached, mut cached_of, mut reported) = (0, 0, false);
        for turns in by_session.values_mut() {
            turns.sort_by_key(|r| r.session.map_or(0, |s| s.turn));
            let ended = turns
                .last()
                .and_then(|r| r.session?.end)
                .is_some_and(|e| matches!(e, SessionEnd::Completed | SessionEnd::Capped));
            let whole = turns
                .iter()
                .enumerate()
                .all(|(k, r)| r.session.is_some_and(|s| s.turn as usize == k + 1));
            if !(ended && whole) {
                continue;
            }
            out.sessions += 1;
            e2e.push(turns[turns.len() - 1].end_ms - turns[0].scheduled_ms);
            server.push(turns.iter().map(|r| r.end_ms - r.sent_ms).sum());
            waiting.push(
                turns
                    .iter()
                    .filter_map(|r| r.session)
                    .map(|s| s.wait_ms)
                    .sum(),
            );
            for r in turns.iter() {
                out.prompt_tokens += r.prompt_tokens;
                if let Some(c) = r.cached_tokens {
                    reported = true;
                    cached += c;
                    cached_of += r.prompt_tokens;
                }
            }
        }
        if out.sessions == 0 {
            return None;
        }
        out.e2e = DistStats::from_values(&e2e);
        out.server = DistStats::from_values(&server);
        out.waiting = DistStats::from_values(&waiting);
        out.cached_tokens = reported.then_some((cached, cached_of));
        Some(out)
    }
}

impl ToolUse {
    /// The tool use of the `measured` turns that offered tools; `None` when none did. The
    /// unusable calls are counted over the window's sessions' turns, `mine` (a session's
    /// failing turn may be one cut in flight).
    fn of(measured: &[&RequestRecord], mine: &[&RequestRecord]) -> Option<ToolUse> {
        let offers = |r: &&&RequestRecord| r.session.is_some_and(|s| s.tools_offered > 0);
        let offered: Vec<&&RequestRecord> = measured.iter().filter(offers).collect();
        if offered.is_empty() {
            return None;
        }
        let answered = offered.iter().filter(|r| r.first_token_ms.is_some());
        let mut out = ToolUse::default();
        for r in answered {
            let calls = r.session.map_or(0, |s| s.tool_calls);
            out.turns += 1;
            out.turns_with_calls += u64::from(calls > 0);
            out.calls += u64::from(calls);
        }
        out.unusable_calls = mine
            .iter()
            .filter(offers)
            .filter(|r| {
                r.error
                    .as_ref()
                    .is_some_and(|e| e.kind == crate::records::ErrorKind::ToolCall)
            })
            .count() as u64;
        Some(out)
    }
}

impl ContextBin {
    /// The successful turns of `records` by prompt length: [0, 512), then doublings.
    fn of(records: &[&RequestRecord]) -> Vec<ContextBin> {
        let mut bins: BTreeMap<u32, Vec<&RequestRecord>> = BTreeMap::new();
        for r in records {
            if request_latency(r).is_none() {
                continue;
            }
            let bin = match r.prompt_tokens / 512 {
                0 => 0,
                blocks => blocks.ilog2() + 1,
            };
            bins.entry(bin).or_default().push(r);
        }
        bins.into_iter()
            .map(|(bin, turns)| {
                let (from, to) = match bin {
                    0 => (0, 512),
                    b => (512 << (b - 1), 512 << b),
                };
                let ttft: Vec<f64> = turns
                    .iter()
                    .filter_map(|r| request_latency(r).map(|l| l.ttft))
                    .collect();
                let reported: Vec<&&RequestRecord> =
                    turns.iter().filter(|r| r.cached_tokens.is_some()).collect();
                let of: u64 = reported.iter().map(|r| r.prompt_tokens).sum();
                let cached: u64 = reported.iter().filter_map(|r| r.cached_tokens).sum();
                ContextBin {
                    from,
                    to,
                    ttft: DistStats::from_values(&ttft),
                    cached_share: (of > 0).then(|| cached as f64 / of as f64),
                }
            })
            .collect()
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
