//! Multi-turn sessions (`--turns`, `--think-time`): how many turns each session has and how
//! long its user thinks between an answer and the next turn, drawn from the seed before the
//! run. What depends on the server (when a later turn is sent, the answers in its history)
//! is decided during the run, in `session_run`.

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp, Geometric};
use serde::{Deserialize, Serialize};

use crate::units::parse_duration;

/// Turns per session.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TurnCount {
    /// Geometric on 1, 2, … with this mean (`--turns N`).
    Geometric { mean: f64 },
    /// Every session has this many (`--turns constant:N`).
    Constant { turns: u32 },
    /// A conversation file's own turns, every one (`--turns all`).
    All,
}

impl TurnCount {
    /// Parses `N`, `constant:N` or `all`.
    pub fn parse(text: &str) -> Result<TurnCount> {
        let t = text.trim();
        if t == "all" {
            return Ok(TurnCount::All);
        }
        let (constant, number) = match t.strip_prefix("constant:") {
            Some(n) => (true, n),
            None => (false, t),
        };
        let value: f64 = number
            .trim()
            .parse()
            .with_context(|| format!("--turns `{text}`: expected N, constant:N or all"))?;
        if !(value >= 1.0 && value.is_finite()) {
            bail!("--turns `{text}`: a session has at least 1 turn");
        }
        if constant {
            if value.fract() != 0.0 {
                bail!("--turns `{text}`: a constant turn count is a whole number");
            }
            return Ok(TurnCount::Constant {
                turns: value as u32,
            });
        }
        Ok(TurnCount::Geometric { mean: value })
    }
}

/// The user's think time between an answer's end and the next turn's send.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ThinkTime {
    /// Exponential with this mean (`--think-time D`).
    Exponential { mean_s: f64 },
    /// Always this long (`--think-time constant:D`).
    Constant { secs: f64 },
}

impl ThinkTime {
    /// Parses `--think-time` `D` or `constant:D` (`5s`, `500ms`, …).
    pub fn parse(text: &str) -> Result<ThinkTime> {
        ThinkTime::parse_flag(text, "--think-time")
    }

    /// Parses `D` or `constant:D` given to `flag` (a wait of the same shape).
    pub fn parse_flag(text: &str, flag: &str) -> Result<ThinkTime> {
        let t = text.trim();
        let (constant, d) = match t.strip_prefix("constant:") {
            Some(d) => (true, d),
            None => (false, t),
        };
        let secs = parse_duration(d)
            .with_context(|| format!("{flag} `{text}`: expected D or constant:D"))?
            .as_secs_f64();
        Ok(if constant {
            ThinkTime::Constant { secs }
        } else {
            ThinkTime::Exponential { mean_s: secs }
        })
    }
}

/// How sessions are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionSpec {
    pub turns: TurnCount,
    pub think: ThinkTime,
    /// `--max-session-turns`: a session drawn longer ends, capped, after this many.
    pub max_turns: Option<u32>,
}

/// One session's draws: its turn count (after the cap) and the think time before each turn
/// (0 before the first).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionDraw {
    pub think_s: Vec<f64>,
    /// More turns were drawn than `--max-session-turns` allows.
    pub capped: bool,
}

impl SessionSpec {
    /// The draws of `sessions` sessions from `seed`; `recorded` gives a conversation's own
    /// turn count (for [`TurnCount::All`]).
    pub fn draw(
        &self,
        sessions: usize,
        seed: u64,
        recorded: impl Fn(usize) -> u32,
    ) -> Result<Vec<SessionDraw>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let geometric = match self.turns {
            TurnCount::Geometric { mean } => Some(
                Geometric::new(1.0 / mean)
                    .with_context(|| format!("--turns {mean}: no geometric distribution"))?,
            ),
            _ => None,
        };
        let exp = match self.think {
            ThinkTime::Exponential { mean_s } if mean_s > 0.0 => Some(
                Exp::new(1.0 / mean_s)
                    .with_context(|| format!("--think-time {mean_s}s: no exponential"))?,
            ),
            _ => None,
        };
        (0..sessions)
            .map(|s| {
                let drawn = match (self.turns, &geometric) {
                    (TurnCount::Constant { turns }, _) => turns,
                    (TurnCount::All, _) => recorded(s),
                    (TurnCount::Geometric { .. }, Some(g)) => {
                        u32::try_from(g.sample(&mut rng)).unwrap_or(u32::MAX - 1) + 1
                    }
                    (TurnCount::Geometric { .. }, None) => 1,
                };
                let turns = self.max_turns.map_or(drawn, |cap| drawn.min(cap)).max(1);
                let think_s = (0..turns)
                    .map(|k| match (k, self.think, &exp) {
                        (0, _, _) => 0.0,
                        (_, ThinkTime::Constant { secs }, _) => secs,
                        (_, _, Some(exp)) => exp.sample(&mut rng),
                        (_, _, None) => 0.0,
                    })
                    .collect();
                Ok(SessionDraw {
                    think_s,
                    capped: turns < drawn,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_counts_and_think_times_parse() {
        assert_eq!(
            TurnCount::parse("4").unwrap(),
            TurnCount::Geometric { mean: 4.0 }
        );
        assert_eq!(
            TurnCount::parse("constant:3").unwrap(),
            TurnCount::Constant { turns: 3 }
        );
        assert_eq!(TurnCount::parse("all").unwrap(), TurnCount::All);
        for bad in ["0", "constant:2.5", "x", "-1"] {
            assert!(TurnCount::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            ThinkTime::parse("2s").unwrap(),
            ThinkTime::Exponential { mean_s: 2.0 }
        );
        assert_eq!(
            ThinkTime::parse("constant:500ms").unwrap(),
            ThinkTime::Constant { secs: 0.5 }
        );
        assert!(ThinkTime::parse("soon").is_err());
    }

    #[test]
    fn geometric_turns_have_their_mean_and_the_cap_marks_sessions() {
        let spec = SessionSpec {
            turns: TurnCount::Geometric { mean: 4.0 },
            think: ThinkTime::Constant { secs: 1.0 },
            max_turns: None,
        };
        let draws = spec.draw(20_000, 7, |_| 0).unwrap();
        let mean = draws.iter().map(|d| d.think_s.len() as f64).sum::<f64>() / 20_000.0;
        // Geometric with mean 4: standard deviation √12 ≈ 3.46, so the mean of 20,000 is
        // 4 ± 0.024 (1 σ).
        assert!((mean - 4.0).abs() < 0.1, "mean turns {mean}");
        assert!(draws.iter().all(|d| d.think_s[0] == 0.0 && !d.capped));
        assert!(draws
            .iter()
            .all(|d| d.think_s[1..].iter().all(|&t| t == 1.0)));
        let capped = SessionSpec {
            max_turns: Some(2),
            ..spec
        }
        .draw(20_000, 7, |_| 0)
        .unwrap();
        assert!(capped.iter().all(|d| d.think_s.len() <= 2));
        // P(more than 2 turns) = (3/4)² = 0.5625.
        let share = capped.iter().filter(|d| d.capped).count() as f64 / 20_000.0;
        assert!((share - 0.5625).abs() < 0.02, "capped share {share}");
        let all = SessionSpec {
            turns: TurnCount::All,
            ..spec
        }
        .draw(3, 7, |s| s as u32 + 1)
        .unwrap();
        assert_eq!(
            all.iter().map(|d| d.think_s.len()).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }
}
