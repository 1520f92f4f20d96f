//! The plan of a run: every request decided before the first is sent (its send time in open
//! loop, its lengths and prompt, its place in a session) and the run's phases. `prepare`
//! builds it from the options, `send` sends it.

use std::io::Write;

use anyhow::{Context, Result};
use reports::records::Phase;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::load::workload::agentic::Agent;
use crate::load::workload::RequestSpec;

/// One request of the pre-generated list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedRequest {
    pub id: u64,
    /// Send time in seconds from the run origin (open loop); `None` in closed loop and for
    /// a session's later turns, which follow the previous answer (a trace's later turns
    /// have their recorded time, and wait for the previous answer too).
    pub at_s: Option<f64>,
    pub spec: RequestSpec,
    /// Its place in a multi-turn session; a session's turns are consecutive in the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<PlannedTurn>,
}

/// A planned request's place in its session.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlannedTurn {
    pub session: u64,
    /// 1 for the first turn.
    pub turn: u32,
    /// The wait after the previous answer ended (0 for the first turn): the user's think
    /// time, or in an agent session the tools' latency.
    pub think_s: f64,
    /// The session's last planned turn.
    pub last: bool,
    /// The session was drawn longer than `--max-session-turns` allows (on its last turn).
    pub capped: bool,
}

/// What ends a session besides its turns (session mode only).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionLimits {
    /// `--max-history-tokens`: a session ends, capped, when its next turn's prompt would pass
    /// this (the previous prompt, its answer and the next user turn).
    pub max_history_tokens: Option<u64>,
    /// How long after the schedule's end (warm-up + duration + cool-down) sessions may go
    /// on; `None` without `--duration`: every session runs to its end.
    pub drain_s: Option<f64>,
}

/// Open or closed loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LoadMode {
    /// Requests sent at their `at_s`, whatever the server does.
    Open,
    /// `concurrency` workers, each waiting for its response before sending the next.
    Closed { concurrency: usize },
}

/// Everything decided before the run: the request list, schedule and phases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub requests: Vec<PlannedRequest>,
    pub mode: LoadMode,
    pub warmup_s: f64,
    /// Measured span; `None` = everything after the warm-up is measured.
    pub duration_s: Option<f64>,
    pub cooldown_s: f64,
    /// Cap on requests in flight; queued requests record their wait.
    pub max_concurrency: Option<usize>,
    /// Multi-turn sessions: `Some` when the requests are sessions' turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionLimits>,
    /// Agent sessions: `Some` when the sessions are agents' (their turns' `prefix_group` is
    /// the agent's index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agentic: Option<AgenticPlan>,
    /// The sessions are a trace's: each turn sends its own recorded prompt (not the history
    /// and the server's answers) at its `at_s`, but not before the previous answer ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recorded_sessions: bool,
    /// What each request's record is classed by.
    #[serde(default)]
    pub class_by: ClassBy,
}

/// What a request's class is (`--class-by`), resolved for the plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassBy {
    /// No classes.
    #[default]
    None,
    /// The trace's model or service column (the spec's `class`).
    Trace,
    /// The model it asks for (`--model-mix`).
    Model,
    /// Its prefix group (an agent, in agent sessions).
    PrefixGroup,
    /// A session turn's kind: `first`, then `follow-up` in chat sessions; in agent sessions
    /// `tool-result` when the answer called tools again, `final` when it did not.
    Turn,
}

impl ClassBy {
    /// The class of a request with `spec` (a turn's kind is its session's to say).
    pub fn of_spec(self, spec: &RequestSpec) -> Option<String> {
        match self {
            ClassBy::Trace => spec.class.clone(),
            ClassBy::Model => spec.model.clone(),
            ClassBy::PrefixGroup => spec.prefix_group.map(|g| format!("group {g}")),
            ClassBy::None | ClassBy::Turn => None,
        }
    }
}

/// What agent sessions share: the pool of agents, and whether each session's first turn
/// must call a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticPlan {
    pub agents: Vec<Agent>,
    pub require_first_call: bool,
}

impl Plan {
    /// The phase of a request sent (or scheduled) at `t_s`.
    pub fn phase_at(&self, t_s: f64) -> Phase {
        if t_s < self.warmup_s {
            Phase::Warmup
        } else if self.duration_s.is_some_and(|d| t_s >= self.warmup_s + d) {
            Phase::Cooldown
        } else {
            Phase::Measured
        }
    }

    /// Connections to open before the window: the closed-loop concurrency, or in open loop
    /// the most requests scheduled within any one second (the requests in flight together
    /// when each takes up to a second), capped by `pool`.
    pub fn warm_connections(&self, pool: usize) -> usize {
        let wanted = match self.mode {
            LoadMode::Closed { concurrency } => concurrency,
            LoadMode::Open => {
                let times: Vec<f64> = self.requests.iter().filter_map(|r| r.at_s).collect();
                let mut start = 0;
                let mut most = 0;
                for (end, &t) in times.iter().enumerate() {
                    while t - times[start] >= 1.0 {
                        start += 1;
                    }
                    most = most.max(end - start + 1);
                }
                most
            }
        };
        wanted.min(pool).max(1)
    }

    /// Writes `schedule.jsonl`: one line per planned request (id, send time, lengths).
    pub fn write_schedule(&self, path: &std::path::Path) -> Result<()> {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for r in &self.requests {
            let line = json!({
                "id": r.id,
                "at_ms": r.at_s.map(|t| t * 1000.0),
                "input_len": r.spec.input_len,
                "output_len": r.spec.output_len,
                "prefix_group": r.spec.prefix_group,
                "session": r.session,
            });
            writeln!(out, "{line}").with_context(|| format!("writing {}", path.display()))?;
        }
        out.flush()
            .with_context(|| format!("writing {}", path.display()))
    }

    /// An open-loop plan: request `i` sent at `times[i]` seconds from the origin with
    /// `spec(i)`; no warm-up, cool-down or concurrency cap, and everything after the origin
    /// measured (set those fields on the result).
    pub fn open(times: Vec<f64>, mut spec: impl FnMut(u64) -> RequestSpec) -> Plan {
        let requests = times
            .into_iter()
            .enumerate()
            .map(|(i, t)| PlannedRequest {
                id: i as u64,
                at_s: Some(t),
                session: None,
                spec: spec(i as u64),
            })
            .collect();
        Plan::with_requests(LoadMode::Open, requests)
    }

    /// A closed-loop plan of `n` requests for `concurrency` workers, request `i` with
    /// `spec(i)`; phases as in [`Plan::open`].
    pub fn closed(concurrency: usize, n: usize, mut spec: impl FnMut(u64) -> RequestSpec) -> Plan {
        let requests = (0..n as u64)
            .map(|i| PlannedRequest {
                id: i,
                at_s: None,
                session: None,
                spec: spec(i),
            })
            .collect();
        Plan::with_requests(LoadMode::Closed { concurrency }, requests)
    }

    /// `requests` in `mode`, with no warm-up, cool-down, concurrency cap or sessions.
    pub fn with_requests(mode: LoadMode, requests: Vec<PlannedRequest>) -> Plan {
        Plan {
            requests,
            mode,
            warmup_s: 0.0,
            duration_s: None,
            cooldown_s: 0.0,
            max_concurrency: None,
            sessions: None,
            agentic: None,
            recorded_sessions: false,
            class_by: ClassBy::None,
        }
    }
}
