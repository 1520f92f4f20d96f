//! The plan of a trace whose turns are linked into sessions (Bailian, TraceLab, WEKA): each
//! session's turns in order, each with the prompt and lengths the trace recorded for it
//! (shared prefixes from its block ids, or TraceLab's cached prefix chained from the
//! session's previous turn). Each turn is sent at its time (the caller's: the trace's own,
//! scaled, or its offset in the session from a start on an arrival process), but never before
//! the previous turn's answer ended: the send loop waits for it.

use std::collections::BTreeMap;

use serde_json::json;

use crate::load::plan::{PlannedRequest, PlannedTurn};
use crate::load::workload::traces::TraceRow;
use crate::load::workload::{Block, PromptSource, RequestSpec};

/// The rows of each session (indexes into the trace), sessions in the order of their first
/// turn's time, turns by their place in the session, then by time; `times_s` gives each
/// row's time (`None`: not replayed, as outside `--trace-window`).
pub fn sessions(rows: &[TraceRow], times_s: &[Option<f64>]) -> Vec<Vec<usize>> {
    let mut by_session: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut single = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        if times_s[i].is_none() {
            continue;
        }
        match row.session {
            Some(t) => by_session.entry(t.session).or_default().push(i),
            None => single.push(vec![i]),
        }
    }
    let time = |i: usize| times_s[i].unwrap_or(f64::INFINITY);
    let mut out: Vec<Vec<usize>> = by_session
        .into_values()
        .map(|mut turns| {
            turns.sort_by(|&a, &b| {
                let turn = |i: usize| rows[i].session.map_or(0, |t| t.turn);
                turn(a).cmp(&turn(b)).then(time(a).total_cmp(&time(b)))
            });
            turns
        })
        .chain(single)
        .collect();
    out.sort_by(|a, b| time(a[0]).total_cmp(&time(b[0])));
    out
}

/// The first `len` tokens of `blocks`.
fn cut(blocks: &[Block], len: u32) -> Vec<Block> {
    let mut left = len;
    let mut out = Vec::new();
    for b in blocks {
        if left == 0 {
            break;
        }
        let take = b.len.min(left);
        out.push(Block {
            key: b.key,
            len: take,
        });
        left -= take;
    }
    out
}

/// The planned requests of `sessions` (ids from 0, in order), each turn sent at
/// `times_s[row]` (later turns also wait for the previous answer); sessions whose first
/// turn is at or after `end` are left out. Also what the plan synthesised, for `meta.json`.
pub fn requests(
    seed: u64,
    rows: &[TraceRow],
    sessions: &[Vec<usize>],
    times_s: &[Option<f64>],
    end: Option<f64>,
) -> (Vec<PlannedRequest>, serde_json::Value) {
    let mut requests = Vec::new();
    let mut clamped = 0u64;
    let mut linked = 0u64;
    let mut kept = 0u64;
    for (s, turns) in sessions.iter().enumerate() {
        let start = times_s[turns[0]].unwrap_or(0.0);
        if end.is_some_and(|end| start >= end) {
            continue;
        }
        kept += 1;
        linked += u64::from(turns.len() > 1);
        let mut previous: Option<Vec<Block>> = None;
        for (k, &i) in turns.iter().enumerate() {
            let row = &rows[i];
            let id = requests.len() as u64;
            let mut spec: RequestSpec = row.spec(seed, id);
            // TraceLab: the cached prefix is the previous turn's prompt, as far as it goes.
            if let (Some(shared), Some(prev)) = (row.shared_prefix, &previous) {
                let prev_len: u32 = prev.iter().map(|b| b.len).sum();
                let shared = shared.min(row.input_len);
                if shared > prev_len {
                    clamped += 1;
                }
                let mut blocks = cut(prev, shared.min(prev_len));
                if let PromptSource::Blocks(own) = &spec.prompt {
                    let kept: u32 = blocks.iter().map(|b| b.len).sum();
                    let rest = row.input_len - kept;
                    if let (true, Some(own)) = (rest > 0, own.last()) {
                        blocks.push(Block {
                            key: own.key,
                            len: rest,
                        });
                    }
                }
                spec.prompt = PromptSource::Blocks(blocks);
            }
            if let PromptSource::Blocks(blocks) = &spec.prompt {
                previous = Some(blocks.clone());
            }
            requests.push(PlannedRequest {
                id,
                at_s: times_s[i],
                spec,
                session: Some(PlannedTurn {
                    session: s as u64,
                    turn: k as u32 + 1,
                    think_s: 0.0,
                    last: k + 1 == turns.len(),
                    capped: false,
                }),
            });
        }
    }
    let meta = json!({
        "sessions": kept, "linked_sessions": linked,
        "synthesised": "prompts are seeded words to the recorded lengths; turns that share block \
            ids (or TraceLab's cached prefix) share those words",
        "shared_prefix_beyond_previous_prompt": clamped,
    });
    (requests, meta)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::load::workload::traces::{self, detect_format};

    fn sample(name: &str) -> Vec<TraceRow> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../traces")
            .join(name);
        traces::load(&path, detect_format(&path).unwrap(), &|t| {
            t.split_whitespace().count()
        })
        .unwrap()
    }

    fn blocks(r: &PlannedRequest) -> Vec<Block> {
        match &r.spec.prompt {
            PromptSource::Blocks(b) => b.clone(),
            PromptSource::Text(_) => panic!("a trace turn's prompt is blocks"),
        }
    }

    /// Tokens two prompts share from their start (equal blocks, the last equal one perhaps
    /// cut shorter in one of them).
    fn shared(a: &[Block], b: &[Block]) -> u32 {
        let mut n = 0;
        for (x, y) in a.iter().zip(b) {
            if x.key != y.key {
                break;
            }
            n += x.len.min(y.len);
            if x.len != y.len {
                break;
            }
        }
        n
    }

    /// The plan of a whole trace at its own times: (session, turn, at_s) per request.
    fn planned(rows: &[TraceRow]) -> (Vec<PlannedRequest>, serde_json::Value) {
        let times: Vec<Option<f64>> = rows
            .iter()
            .map(|r| r.timestamp_ms.map(|t| t / 1000.0))
            .collect();
        let groups = sessions(rows, &times);
        requests(7, rows, &groups, &times, None)
    }

    fn places(requests: &[PlannedRequest]) -> Vec<(u64, u32, f64)> {
        requests
            .iter()
            .map(|r| {
                let t = r.session.unwrap();
                (t.session, t.turn, r.at_s.unwrap())
            })
            .collect()
    }

    #[test]
    fn bailian_sessions_and_prefixes_as_computed_by_hand() {
        let (requests, meta) = planned(&sample("bailian-sample.jsonl"));
        // Sessions by their first turn: chat 100 (0 s), 200 (1 s), 300 (4 s), 401 (5 s).
        assert_eq!(
            places(&requests),
            [
                (0, 1, 0.0),
                (0, 2, 3.5),
                (0, 3, 9.25),
                (1, 1, 1.0),
                (1, 2, 2.0),
                (2, 1, 4.0),
                (3, 1, 5.0)
            ]
        );
        assert_eq!(meta["linked_sessions"], 2);
        let b: Vec<Vec<Block>> = requests.iter().map(blocks).collect();
        // 100 → 101: blocks 0 and 1 (32 tokens; 100's block 2 held 8 tokens, 101's block 3
        // is another); 101 → 102: blocks 0, 1, 3, 4 (64); 100 and 200 share blocks 0, 1.
        assert_eq!(shared(&b[0], &b[1]), 32);
        assert_eq!(shared(&b[1], &b[2]), 64);
        assert_eq!(shared(&b[3], &b[4]), 32);
        assert_eq!(shared(&b[0], &b[3]), 32);
        assert_eq!(shared(&b[5], &b[0]), 0);
        for (r, b) in requests.iter().zip(&b) {
            assert_eq!(b.iter().map(|b| b.len).sum::<u32>(), r.spec.input_len);
        }
    }

    #[test]
    fn tracelab_chains_the_cached_prefix_from_the_previous_round() {
        let (requests, meta) = planned(&sample("tracelab-sample.jsonl"));
        assert_eq!(
            places(&requests),
            [
                (0, 1, 0.0),
                (0, 2, 11.545),
                (0, 3, 25.349),
                (1, 1, 4.849),
                (1, 2, 20.099)
            ]
        );
        let b: Vec<Vec<Block>> = requests.iter().map(blocks).collect();
        // Claude: 320 of round 1's 420 are round 0's prompt; round 2 reuses 400 of round 1's.
        assert_eq!(shared(&b[0], &b[1]), 320);
        assert_eq!(shared(&b[1], &b[2]), 400);
        // Codex: 256 cached tokens, but round 0's prompt has 200: the 56 more are its own.
        assert_eq!(shared(&b[3], &b[4]), 200);
        assert_eq!(meta["shared_prefix_beyond_previous_prompt"], 1);
        assert_eq!(shared(&b[0], &b[3]), 0, "sessions share nothing");
        for (r, b) in requests.iter().zip(&b) {
            assert_eq!(b.iter().map(|b| b.len).sum::<u32>(), r.spec.input_len);
        }
    }

    #[test]
    fn weka_subagents_share_their_parents_blocks() {
        let (requests, _) = planned(&sample("weka-sample.json"));
        assert_eq!(
            places(&requests),
            [
                (0, 1, 0.0),
                (0, 2, 3.5),
                (0, 3, 11.0),
                (1, 1, 6.0),
                (1, 2, 7.5)
            ]
        );
        let b: Vec<Vec<Block>> = requests.iter().map(blocks).collect();
        // Full 64-token blocks only: 200 tokens are 3 blocks and 8 of its own.
        assert_eq!(shared(&b[0], &b[1]), 192);
        assert_eq!(shared(&b[1], &b[2]), 256);
        assert_eq!(
            shared(&b[0], &b[3]),
            128,
            "the sub-agent's blocks 1, 2 are its parent's"
        );
        assert_eq!(shared(&b[3], &b[4]), 128);
    }
}
