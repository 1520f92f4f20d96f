//! The 2025–2026 traces that link turns into sessions, each read from its published
//! description:
//! - **Bailian** (`alibaba-edu/qwen-bailian-usagetraces-anon`, JSONL): `chat_id`,
//!   `parent_chat_id` (−1 for a session's first turn), `timestamp` (s from the file's
//!   start), `input_length`, `output_length`, `type` (the class), `turn`, `hash_ids` (16-token
//!   blocks, the last one partial). A turn's session is the root its parent links reach; a
//!   turn whose parent is not in the file (a sampled trace) starts a session of its own.
//! - **TraceLab** (`uw-syfi/TraceLab`, JSONL, or `.jsonl.gz` as released): one row per
//!   round, `session_id`, `round_index`, `model` (the class), `input_tokens_total` =
//!   `prefix_tokens` (served from the provider's cache) + `newly_append_tokens`,
//!   `output_tokens`, `timing_events` (ISO-8601 UTC). A round is sent when its input was
//!   complete: at its last `user_message` or `tool_result` event (its first event when it has
//!   none). It has no block hashes: a round's first `prefix_tokens` tokens are the previous
//!   round's prompt (as much of it as there is).
//! - **WEKA** (`callanjfox/kv-cache-tester`, one JSON object per file, one file per session;
//!   `--trace` a file or a folder of them): `block_size` (64), `requests` with `t` (s from the
//!   session's start), `model` (the class), `in`, `out`, `hash_ids` (full blocks only, ids
//!   local to the file). A `subagent` entry is a session of its own, starting at its `t`, its
//!   requests' `t` counted from there, its hash ids in its parent's space.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::{for_each_line, for_each_line_of, TraceRow, TraceTurn};
use crate::load::workload::mix;

/// Bailian's hash blocks are 16 tokens.
pub const BAILIAN_BLOCK: u32 = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BailianLine {
    chat_id: i64,
    parent_chat_id: i64,
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(rename = "type")]
    kind: String,
    turn: u32,
    hash_ids: Vec<u64>,
}

pub(super) fn load_bailian(path: &Path) -> Result<Vec<TraceRow>> {
    let mut lines = Vec::new();
    for_each_line(path, |line| {
        let l: BailianLine = serde_json::from_str(line)?;
        let blocks = l.input_length.div_ceil(BAILIAN_BLOCK) as usize;
        if l.hash_ids.len() != blocks {
            bail!(
                "field `hash_ids`: {} ids for input_length {} (16-token blocks, the last one partial: {blocks})",
                l.hash_ids.len(),
                l.input_length
            );
        }
        if !l.timestamp.is_finite() || l.timestamp < 0.0 {
            bail!(
                "field `timestamp`: {} is not seconds from the file's start",
                l.timestamp
            );
        }
        lines.push(l);
        Ok(())
    })?;
    let mut parent: HashMap<i64, i64> = HashMap::with_capacity(lines.len());
    let mut row_of: HashMap<i64, usize> = HashMap::with_capacity(lines.len());
    for (row, l) in lines.iter().enumerate() {
        if let Some(first) = row_of.insert(l.chat_id, row) {
            bail!(
                "{}: field `chat_id`: {} is on rows {} and {} (a chat is one request)",
                path.display(),
                l.chat_id,
                first + 1,
                row + 1
            );
        }
        parent.insert(l.chat_id, l.parent_chat_id);
    }
    // The root a chat's parent links reach (a parent absent from the file ends the walk).
    let root = |mut id: i64| {
        for _ in 0..lines.len() {
            match parent.get(&id) {
                Some(&p) if p >= 0 && parent.contains_key(&p) => id = p,
                _ => break,
            }
        }
        id
    };
    Ok(lines
        .iter()
        .map(|l| TraceRow {
            timestamp_ms: Some(l.timestamp * 1000.0),
            input_len: l.input_length,
            output_len: l.output_length,
            hash_ids: l.hash_ids.clone(),
            hash_block: BAILIAN_BLOCK,
            class: Some(l.kind.clone()),
            session: Some(TraceTurn {
                session: root(l.chat_id) as u64,
                turn: l.turn,
            }),
            ..TraceRow::default()
        })
        .collect())
}

#[derive(Deserialize)]
struct TraceLabLine {
    session_id: String,
    round_index: u32,
    model: String,
    input_tokens_total: u32,
    prefix_tokens: u32,
    newly_append_tokens: u32,
    output_tokens: u32,
    timing_events: Vec<TimingEvent>,
}

#[derive(Deserialize)]
struct TimingEvent {
    event_type: String,
    timestamp: String,
}

/// Nanoseconds since the epoch of an ISO-8601 UTC time (`2026-06-01T05:40:20.151Z`).
fn iso_ns(text: &str) -> Result<i64> {
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .with_context(|| format!("`{text}` is not an ISO-8601 time"))?;
    t.timestamp_nanos_opt()
        .with_context(|| format!("`{text}` is out of range"))
}

pub(super) fn load_tracelab(path: &Path) -> Result<Vec<TraceRow>> {
    let mut rows: Vec<(i64, TraceRow)> = Vec::new();
    let mut sessions: HashMap<String, u64> = HashMap::new();
    let parse = |line: &str| -> Result<()> {
        let l: TraceLabLine = serde_json::from_str(line)?;
        if l.prefix_tokens.checked_add(l.newly_append_tokens) != Some(l.input_tokens_total) {
            bail!(
                "field `input_tokens_total`: {} is not prefix_tokens {} + newly_append_tokens {}",
                l.input_tokens_total,
                l.prefix_tokens,
                l.newly_append_tokens
            );
        }
        let input = l
            .timing_events
            .iter()
            .filter(|e| matches!(e.event_type.as_str(), "user_message" | "tool_result"))
            .map(|e| iso_ns(&e.timestamp).context("field `timing_events[].timestamp`"))
            .collect::<Result<Vec<i64>>>()?;
        let sent = match input.iter().max() {
            Some(&t) => t,
            None => iso_ns(
                &l.timing_events
                    .first()
                    .context("field `timing_events`: no event to time the round by")?
                    .timestamp,
            )
            .context("field `timing_events[0].timestamp`")?,
        };
        let next = sessions.len() as u64;
        let session = *sessions.entry(l.session_id.clone()).or_insert(next);
        rows.push((
            sent,
            TraceRow {
                input_len: l.input_tokens_total,
                output_len: l.output_tokens,
                class: Some(l.model),
                session: Some(TraceTurn {
                    session,
                    turn: l.round_index + 1,
                }),
                shared_prefix: Some(l.prefix_tokens),
                ..TraceRow::default()
            },
        ));
        Ok(())
    };
    if path.extension().is_some_and(|e| e == "gz") {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // Every member of a concatenated (or bgzip) file.
        let reader = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(file));
        for_each_line_of(path, reader, parse)?;
    } else {
        for_each_line(path, parse)?;
    }
    // In send order; the times from the first round's.
    rows.sort_by_key(|(sent, _)| *sent);
    let origin = rows.first().map_or(0, |(t, _)| *t);
    Ok(rows
        .into_iter()
        .map(|(sent, mut row)| {
            row.timestamp_ms = Some((sent - origin) as f64 / 1e6);
            row
        })
        .collect())
}

#[derive(Deserialize)]
struct WekaFile {
    block_size: u32,
    /// `local`: ids are the file's own (the only scope published).
    #[serde(default)]
    hash_id_scope: Option<String>,
    requests: Vec<WekaRequest>,
}

#[derive(Deserialize)]
struct WekaRequest {
    t: f64,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, rename = "in")]
    input: Option<u32>,
    #[serde(default)]
    out: Option<u32>,
    #[serde(default)]
    hash_ids: Vec<u64>,
    /// A sub-agent's own requests.
    #[serde(default)]
    requests: Vec<WekaRequest>,
}

/// `path`: one WEKA session file, or a folder of them (each `.json` file a session, in name
/// order; other files are not read). The files share no clock: every session starts at 0.
pub(super) fn load_weka(path: &Path) -> Result<Vec<TraceRow>> {
    let files = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("{}: no .json session file", path.display());
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut rows = Vec::new();
    let mut sessions = 0u64;
    for (f, file) in files.iter().enumerate() {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let session: WekaFile = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!("{}:{}: malformed WEKA trace: {e}", file.display(), e.line())
        })?;
        if session.block_size == 0 {
            bail!("{}: field `block_size` is 0", file.display());
        }
        if let Some(scope) = session.hash_id_scope.as_deref().filter(|s| *s != "local") {
            bail!(
                "{}: field `hash_id_scope` is `{scope}`: only `local` (ids are the file's own) is published",
                file.display()
            );
        }
        // Hash ids are local to a file: a file's space is apart from every other's.
        let space = f as u64;
        add_weka_session(
            &session.requests,
            "requests",
            0.0,
            session.block_size,
            space,
            &mut sessions,
            &mut rows,
        )
        .with_context(|| format!("{}", file.display()))?;
    }
    rows.sort_by(|a, b| {
        a.timestamp_ms
            .partial_cmp(&b.timestamp_ms)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(rows)
}

/// The requests of one session starting at `start` s; its sub-agents become sessions too.
fn add_weka_session(
    requests: &[WekaRequest],
    path: &str,
    start: f64,
    block: u32,
    space: u64,
    sessions: &mut u64,
    rows: &mut Vec<TraceRow>,
) -> Result<()> {
    let session = *sessions;
    *sessions += 1;
    let mut turn = 0;
    for (i, r) in requests.iter().enumerate() {
        let field = |name: &str| format!("{path}[{i}].{name}");
        match r.kind.as_str() {
            "subagent" => {
                let inner = format!("{path}[{i}].requests");
                add_weka_session(
                    &r.requests,
                    &inner,
                    start + r.t,
                    block,
                    space,
                    sessions,
                    rows,
                )?;
                continue;
            }
            "s" | "n" => {}
            other => bail!(
                "field `{}`: `{other}` is not `s`, `n` or `subagent`",
                field("type")
            ),
        }
        if !r.requests.is_empty() {
            bail!(
                "field `{}`: only a `subagent` entry has requests",
                field("requests")
            );
        }
        let input = r
            .input
            .with_context(|| format!("field `{}` is missing", field("in")))?;
        let output = r
            .out
            .with_context(|| format!("field `{}` is missing", field("out")))?;
        if r.hash_ids.len() != (input / block) as usize {
            bail!(
                "field `{}`: {} ids for in {input} ({block}-token blocks, full ones only: {})",
                field("hash_ids"),
                r.hash_ids.len(),
                input / block
            );
        }
        turn += 1;
        rows.push(TraceRow {
            timestamp_ms: Some((start + r.t) * 1000.0),
            input_len: input,
            output_len: output,
            hash_ids: r.hash_ids.iter().map(|&h| mix(space, h)).collect(),
            hash_block: block,
            class: r.model.clone(),
            session: Some(TraceTurn { session, turn }),
            ..TraceRow::default()
        });
    }
    Ok(())
}
