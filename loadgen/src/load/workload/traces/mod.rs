//! Trace file loaders. Every loader returns rows in file order (TraceLab's and WEKA's in
//! time order); timestamps are ms from the file's origin (its first row, or for Bailian and
//! WEKA the start the file counts from). A malformed line is an error naming the file, the
//! line and the field.
//!
//! Formats:
//! - project JSONL: `{"timestamp_ms", "input_len", "output_len", "prefix_group"?, "prefix_len"?, "prompt"?}`
//!   (see `traces/README.md`);
//! - Mooncake JSONL: `{"timestamp" (ms), "input_length", "output_length", "hash_ids"}`, each
//!   hash id a 512-token prefix block;
//! - Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens` with wall-clock text
//!   (any number of fractional digits, optional `+HH:MM` / `Z`);
//! - BurstGPT CSV: `Timestamp` (s), `Request tokens`, `Response tokens`, selected by name;
//! - ShareGPT JSON: `[{"conversations": [{"from", "value"}, …]}]`, first human turn → first reply;
//! - the ShareGPT length table CSV: `num_prefill_tokens,num_decode_tokens` (no timestamps);
//! - the traces that link turns into sessions (Bailian, TraceLab, WEKA): `session_formats`.
//!
//! Mooncake's `conversation`, `toolagent` and `synthetic` files share its one format, which
//! links no turns (no session, user or parent field); Azure's 2024 week has the 2023 columns.

use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{bail, Context, Result};
use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};

mod session_formats;
pub use session_formats::BAILIAN_BLOCK;

use super::{hash_id_blocks, prefixed_blocks, PromptSource, RequestSpec};

/// Mooncake prefix blocks are 512 tokens.
pub const MOONCAKE_BLOCK: u32 = 512;

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    Jsonl,
    Mooncake,
    Azure,
    Burstgpt,
    Sharegpt,
    SharegptTable,
    Bailian,
    Tracelab,
    Weka,
}

impl TraceFormat {
    pub const ALL: [TraceFormat; 9] = [
        TraceFormat::Jsonl,
        TraceFormat::Mooncake,
        TraceFormat::Azure,
        TraceFormat::Burstgpt,
        TraceFormat::Sharegpt,
        TraceFormat::SharegptTable,
        TraceFormat::Bailian,
        TraceFormat::Tracelab,
        TraceFormat::Weka,
    ];

    /// The format's name, as `--trace-format` and `meta.json` write it.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Jsonl => "jsonl",
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Azure => "azure",
            TraceFormat::Burstgpt => "burstgpt",
            TraceFormat::Sharegpt => "sharegpt",
            TraceFormat::SharegptTable => "sharegpt-table",
            TraceFormat::Bailian => "bailian",
            TraceFormat::Tracelab => "tracelab",
            TraceFormat::Weka => "weka",
        }
    }
}

/// One request of a trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceRow {
    /// ms from the file's origin, if the format has times.
    pub timestamp_ms: Option<f64>,
    pub input_len: u32,
    pub output_len: u32,
    /// Project JSONL: group sharing the first `prefix_len` tokens.
    pub prefix: Option<(u64, u32)>,
    /// Prefix block hashes (Mooncake, Bailian, WEKA), each `hash_block` tokens: equal ids
    /// are equal blocks.
    pub hash_ids: Vec<u64>,
    pub hash_block: u32,
    /// Literal prompt text (ShareGPT, project JSONL).
    pub prompt: Option<String>,
    /// Its session and its place in it, where the trace links turns.
    pub session: Option<TraceTurn>,
    /// The trace's model or service column (Bailian `type`, TraceLab and WEKA `model`).
    pub class: Option<String>,
    /// Tokens its prompt shares with its session's previous turn's (TraceLab, which has no
    /// block hashes).
    pub shared_prefix: Option<u32>,
}

impl TraceRow {
    /// The request of this row, index `index` of its trace: its prompt its literal text, or
    /// blocks from its hash ids (equal ids, equal blocks), or its prefix group's shared
    /// tokens then tokens of its own.
    pub fn spec(&self, seed: u64, index: u64) -> RequestSpec {
        let prompt = match (&self.prompt, self.hash_ids.is_empty()) {
            (Some(text), _) => PromptSource::Text(text.clone()),
            (None, false) => PromptSource::Blocks(hash_id_blocks(
                seed,
                index,
                &self.hash_ids,
                self.input_len,
                self.hash_block,
            )),
            (None, true) => {
                PromptSource::Blocks(prefixed_blocks(seed, index, self.input_len, self.prefix))
            }
        };
        RequestSpec {
            input_len: self.input_len,
            output_len: self.output_len,
            prefix_group: self.prefix.map(|(g, _)| g),
            prompt,
            model: None,
            class: self.class.clone(),
        }
    }
}

/// A trace row's session and its place in it (turns are ordered by `turn`, then time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceTurn {
    pub session: u64,
    pub turn: u32,
}

/// Guesses the format from the extension and the first line.
pub fn detect_format(path: &Path) -> Result<TraceFormat> {
    if path.is_dir() {
        return Ok(TraceFormat::Weka);
    }
    // TraceLab's release is the one gzipped format.
    if path.to_string_lossy().ends_with(".jsonl.gz") {
        return Ok(TraceFormat::Tracelab);
    }
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut first = String::new();
    BufReader::new(file)
        .read_line(&mut first)
        .with_context(|| format!("reading {}", path.display()))?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    Ok(match ext {
        "jsonl" if first.contains("\"parent_chat_id\"") => TraceFormat::Bailian,
        "jsonl" if first.contains("\"round_index\"") => TraceFormat::Tracelab,
        "jsonl" if first.contains("\"hash_ids\"") || first.contains("\"input_length\"") => {
            TraceFormat::Mooncake
        }
        "json" if first.contains("\"block_size\"") => TraceFormat::Weka,
        "jsonl" => TraceFormat::Jsonl,
        "json" => TraceFormat::Sharegpt,
        "csv" if first.contains("TIMESTAMP") => TraceFormat::Azure,
        "csv" if first.contains("Request tokens") => TraceFormat::Burstgpt,
        "csv" if first.contains("num_prefill_tokens") => TraceFormat::SharegptTable,
        _ => bail!(
            "{}: cannot tell the trace format; pass --trace-format",
            path.display()
        ),
    })
}

/// Loads `path` in `format`. `count_tokens` measures literal prompts (ShareGPT).
pub fn load(
    path: &Path,
    format: TraceFormat,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Result<Vec<TraceRow>> {
    match format {
        TraceFormat::Jsonl => load_jsonl(path),
        TraceFormat::Mooncake => load_mooncake(path),
        TraceFormat::Azure => load_azure(path),
        TraceFormat::Burstgpt => load_burstgpt(path),
        TraceFormat::Sharegpt => load_sharegpt(path, count_tokens),
        TraceFormat::SharegptTable => load_sharegpt_table(path),
        TraceFormat::Bailian => session_formats::load_bailian(path),
        TraceFormat::Tracelab => session_formats::load_tracelab(path),
        TraceFormat::Weka => session_formats::load_weka(path),
    }
}

/// Calls `parse` on every non-empty line with its 1-based number, adding file:line to errors.
fn for_each_line(path: &Path, parse: impl FnMut(&str) -> Result<()>) -> Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    for_each_line_of(path, BufReader::new(file), parse)
}

/// [`for_each_line`] over `reader`, the content of `path`.
fn for_each_line_of(
    path: &Path,
    reader: impl BufRead,
    mut parse: impl FnMut(&str) -> Result<()>,
) -> Result<()> {
    for (i, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: read error", path.display(), i + 1))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        parse(line).with_context(|| format!("{}:{}: malformed line", path.display(), i + 1))?;
    }
    Ok(())
}

fn rebase(rows: &mut [TraceRow]) {
    if let Some(origin) = rows.first().and_then(|r| r.timestamp_ms) {
        for r in rows.iter_mut() {
            r.timestamp_ms = r.timestamp_ms.map(|t| t - origin);
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectLine {
    timestamp_ms: Option<f64>,
    input_len: u32,
    output_len: u32,
    prefix_group: Option<u64>,
    prefix_len: Option<u32>,
    prompt: Option<String>,
}

fn load_jsonl(path: &Path) -> Result<Vec<TraceRow>> {
    let mut rows = Vec::new();
    for_each_line(path, |line| {
        let l: ProjectLine = serde_json::from_str(line)?;
        let prefix = match (l.prefix_group, l.prefix_len) {
            (Some(g), Some(len)) => Some((g, len)),
            (None, None) => None,
            _ => bail!("prefix_group and prefix_len go together"),
        };
        rows.push(TraceRow {
            timestamp_ms: l.timestamp_ms,
            input_len: l.input_len,
            output_len: l.output_len,
            prefix,
            prompt: l.prompt,
            ..TraceRow::default()
        });
        Ok(())
    })?;
    rebase(&mut rows);
    Ok(rows)
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

fn load_mooncake(path: &Path) -> Result<Vec<TraceRow>> {
    let mut rows = Vec::new();
    for_each_line(path, |line| {
        let l: MooncakeLine = serde_json::from_str(line)?;
        rows.push(TraceRow {
            timestamp_ms: Some(l.timestamp),
            input_len: l.input_length,
            output_len: l.output_length,
            hash_ids: l.hash_ids,
            hash_block: MOONCAKE_BLOCK,
            ..TraceRow::default()
        });
        Ok(())
    })?;
    rebase(&mut rows);
    Ok(rows)
}

/// Parses Azure's `2023-11-16 18:17:03.9799600` (also without fraction, with `T`, and with a
/// `+HH:MM` / `-HH:MM` / `Z` suffix) to nanoseconds since the Unix epoch (UTC when an offset is given).
pub fn parse_azure_timestamp(text: &str) -> Result<i64> {
    let t = text.trim();
    let (body, offset_s) = if let Some(b) = t.strip_suffix('Z') {
        (b, 0i64)
    } else if t.len() > 6
        && matches!(&t[t.len() - 6..t.len() - 5], "+" | "-")
        && &t[t.len() - 3..t.len() - 2] == ":"
    {
        let (b, off) = t.split_at(t.len() - 6);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let h: i64 = off[1..3]
            .parse()
            .with_context(|| format!("bad offset in `{text}`"))?;
        let m: i64 = off[4..6]
            .parse()
            .with_context(|| format!("bad offset in `{text}`"))?;
        (b, sign * (h * 3600 + m * 60))
    } else {
        (t, 0)
    };
    let dt = NaiveDateTime::parse_from_str(body, "%Y-%m-%d %H:%M:%S%.f")
        .or_else(|_| NaiveDateTime::parse_from_str(body, "%Y-%m-%dT%H:%M:%S%.f"))
        .with_context(|| {
            format!("bad timestamp `{text}` (expected YYYY-MM-DD HH:MM:SS[.fffffff][+HH:MM])")
        })?;
    let utc = dt.and_utc();
    let ns = utc.timestamp() * 1_000_000_000 + i64::from(utc.timestamp_subsec_nanos());
    Ok(ns - offset_s * 1_000_000_000)
}

/// Reads a CSV with headers, giving each record to `row` with its line number and the
/// header-index lookup.
fn for_each_csv(
    path: &Path,
    required: &[&str],
    mut row: impl FnMut(&csv::StringRecord, &[usize]) -> Result<()>,
) -> Result<()> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_path(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let headers = reader
        .headers()
        .with_context(|| format!("{}:1: bad header", path.display()))?
        .clone();
    let columns = required
        .iter()
        .map(|name| {
            headers
                .iter()
                .position(|h| h == *name)
                .with_context(|| format!("{}:1: no column `{name}`", path.display()))
        })
        .collect::<Result<Vec<usize>>>()?;
    // Line numbers assume one line per record (no quoted newlines), true of every trace format.
    for (i, record) in reader.records().enumerate() {
        let line = i + 2;
        let record = record.with_context(|| format!("{}:{line}: malformed CSV", path.display()))?;
        if record.len() != headers.len() {
            bail!(
                "{}:{line}: expected {} fields, found {}",
                path.display(),
                headers.len(),
                record.len()
            );
        }
        row(&record, &columns)
            .with_context(|| format!("{}:{line}: malformed line", path.display()))?;
    }
    Ok(())
}

fn field<T: std::str::FromStr>(record: &csv::StringRecord, index: usize, name: &str) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text = record.get(index).unwrap_or("");
    text.parse()
        .with_context(|| format!("column `{name}`: bad value `{text}`"))
}

fn load_azure(path: &Path) -> Result<Vec<TraceRow>> {
    let names = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];
    let mut first_ns = None;
    let mut rows = Vec::new();
    for_each_csv(path, &names, |r, c| {
        let ns = parse_azure_timestamp(r.get(c[0]).unwrap_or(""))?;
        let origin = *first_ns.get_or_insert(ns);
        rows.push(TraceRow {
            timestamp_ms: Some((ns - origin) as f64 / 1e6),
            input_len: field(r, c[1], names[1])?,
            output_len: field(r, c[2], names[2])?,
            ..TraceRow::default()
        });
        Ok(())
    })?;
    Ok(rows)
}

fn load_burstgpt(path: &Path) -> Result<Vec<TraceRow>> {
    let names = ["Timestamp", "Request tokens", "Response tokens"];
    let mut rows = Vec::new();
    for_each_csv(path, &names, |r, c| {
        let seconds: f64 = field(r, c[0], names[0])?;
        rows.push(TraceRow {
            timestamp_ms: Some(seconds * 1000.0),
            input_len: field(r, c[1], names[1])?,
            output_len: field(r, c[2], names[2])?,
            ..TraceRow::default()
        });
        Ok(())
    })?;
    rebase(&mut rows);
    Ok(rows)
}

fn load_sharegpt_table(path: &Path) -> Result<Vec<TraceRow>> {
    let names = ["num_prefill_tokens", "num_decode_tokens"];
    let mut rows = Vec::new();
    for_each_csv(path, &names, |r, c| {
        rows.push(TraceRow {
            input_len: field(r, c[0], names[0])?,
            output_len: field(r, c[1], names[1])?,
            ..TraceRow::default()
        });
        Ok(())
    })?;
    Ok(rows)
}

#[derive(Deserialize)]
struct ShareGptTurn {
    from: String,
    value: String,
}

#[derive(Deserialize)]
struct ShareGptConversation {
    #[serde(default)]
    conversations: Vec<ShareGptTurn>,
}

/// The conversations of a ShareGPT JSON file; a parse error names the file and line.
fn read_sharegpt(path: &Path) -> Result<Vec<ShareGptConversation>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}:{}: malformed ShareGPT JSON: {e}",
            path.display(),
            e.line()
        )
    })
}

/// ShareGPT JSON: the first human turn is the prompt and the reply's length is the output
/// length; conversations with fewer than two turns are skipped (as vLLM does).
fn load_sharegpt(path: &Path, count_tokens: &dyn Fn(&str) -> usize) -> Result<Vec<TraceRow>> {
    let mut rows = Vec::new();
    for c in read_sharegpt(path)? {
        let [prompt, reply, ..] = c.conversations.as_slice() else {
            continue;
        };
        if prompt.from == "gpt" {
            continue;
        }
        let input = count_tokens(&prompt.value).max(1);
        let output = count_tokens(&reply.value).max(1);
        rows.push(TraceRow {
            input_len: u32::try_from(input).unwrap_or(u32::MAX),
            output_len: u32::try_from(output).unwrap_or(u32::MAX),
            prompt: Some(prompt.value.clone()),
            ..TraceRow::default()
        });
    }
    Ok(rows)
}

/// A ShareGPT JSON file's conversations, each as its exchanges in order: a human turn (the
/// prompt, its length measured) and the reply after it (its length the output length). A
/// conversation that starts with the model, or a human turn without a reply, ends the
/// exchanges there; conversations without one exchange are skipped.
pub fn load_sharegpt_conversations(
    path: &Path,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Result<Vec<Vec<TraceRow>>> {
    Ok(read_sharegpt(path)?
        .into_iter()
        .map(|c| {
            c.conversations
                .chunks_exact(2)
                .take_while(|pair| pair[0].from != "gpt" && pair[1].from == "gpt")
                .map(|pair| TraceRow {
                    input_len: u32::try_from(count_tokens(&pair[0].value).max(1))
                        .unwrap_or(u32::MAX),
                    output_len: u32::try_from(count_tokens(&pair[1].value).max(1))
                        .unwrap_or(u32::MAX),
                    prompt: Some(pair[0].value.clone()),
                    ..TraceRow::default()
                })
                .collect::<Vec<_>>()
        })
        .filter(|rows| !rows.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn shared(rel: &str) -> PathBuf {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/traces")
            .join(rel);
        assert!(
            p.exists(),
            "{} is missing: the shared data folder ../shared must sit beside the repository",
            p.display()
        );
        p
    }

    fn stats() -> serde_json::Value {
        let text = std::fs::read_to_string(shared("stats.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    fn load_auto(rel: &str) -> Vec<TraceRow> {
        let path = shared(rel);
        let format = detect_format(&path).unwrap();
        load(&path, format, &words).unwrap()
    }

    fn check_lengths(rows: &[TraceRow], s: &serde_json::Value) {
        let n = s["n"].as_u64().unwrap() as usize;
        assert_eq!(rows.len(), n);
        let max_in = rows.iter().map(|r| r.input_len).max().unwrap();
        let max_out = rows.iter().map(|r| r.output_len).max().unwrap();
        assert_eq!(f64::from(max_in), s["in"]["max"].as_f64().unwrap());
        assert_eq!(f64::from(max_out), s["out"]["max"].as_f64().unwrap());
        if let Some(d) = s["duration_s"].as_f64() {
            let last = rows.last().unwrap().timestamp_ms.unwrap() / 1000.0;
            assert!((last - d).abs() < 1e-6, "duration {last} vs {d}");
        }
    }

    #[test]
    fn azure_traces_load_with_exact_counts() {
        let s = stats();
        check_lengths(
            &load_auto("azure_llm_2023/AzureLLMInferenceTrace_code.csv"),
            &s["azure2023_code"],
        );
        check_lengths(
            &load_auto("azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
            &s["azure2023_conv"],
        );
    }

    #[test]
    fn burstgpt_loads_by_column_name() {
        let rows = load_auto("burstgpt/BurstGPT_1_first7days.csv");
        check_lengths(&rows, &stats()["burstgpt1_7d_all"]);
        assert_eq!(rows.iter().filter(|r| r.output_len > 0).count(), 17893);
        // Columns are found by name: a newer schema with extra columns loads the same rows.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b3.csv");
        std::fs::write(
            &p,
            "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
             5,1,0.5,ChatGPT,472,18,490,Conversation log\n",
        )
        .unwrap();
        let rows = load(&p, TraceFormat::Burstgpt, &words).unwrap();
        assert_eq!((rows[0].input_len, rows[0].output_len), (472, 18));
    }

    #[test]
    fn mooncake_traces_load_with_prefix_blocks() {
        let s = stats();
        for (rel, key) in [
            (
                "mooncake/conversation_trace.jsonl",
                "mooncake_conversation_trace",
            ),
            ("mooncake/synthetic_trace.jsonl", "mooncake_synthetic_trace"),
        ] {
            let rows = load_auto(rel);
            check_lengths(&rows, &s[key]);
            let blocks: usize = rows.iter().map(|r| r.hash_ids.len()).sum();
            assert_eq!(blocks as u64, s[key]["total_blocks"].as_u64().unwrap());
            assert!(rows
                .iter()
                .all(|r| r.hash_ids.len() == r.input_len.div_ceil(MOONCAKE_BLOCK) as usize));
        }
    }

    #[test]
    fn sharegpt_table_and_project_jsonl_load() {
        let rows = load_auto("sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv");
        check_lengths(&rows, &stats()["sharegpt_llama2_table_all"]);
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/example.jsonl");
        let rows = load(&example, detect_format(&example).unwrap(), &words).unwrap();
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[3].timestamp_ms, Some(1000.5));
        assert_eq!(rows[1].prefix, Some((1, 256)));
        assert!(rows[4].prompt.is_some());
    }

    #[test]
    fn sharegpt_json_uses_first_exchange() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sg.json");
        std::fs::write(
            &p,
            r#"[{"id":"a","conversations":[{"from":"human","value":"hello there friend"},{"from":"gpt","value":"hi"}]},
                {"id":"b","conversations":[{"from":"human","value":"lonely"}]}]"#,
        )
        .unwrap();
        let rows = load(&p, detect_format(&p).unwrap(), &words).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].input_len, rows[0].output_len), (3, 1));
        assert_eq!(rows[0].prompt.as_deref(), Some("hello there friend"));
    }

    fn sample(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../traces")
            .join(name)
    }

    fn load_sample(name: &str) -> (TraceFormat, Vec<TraceRow>) {
        let path = sample(name);
        let format = detect_format(&path).unwrap();
        (format, load(&path, format, &words).unwrap())
    }

    /// (session, turn) of each row.
    fn turns(rows: &[TraceRow]) -> Vec<(u64, u32)> {
        rows.iter()
            .map(|r| r.session.map(|t| (t.session, t.turn)).unwrap())
            .collect()
    }

    #[test]
    fn bailian_links_turns_by_parent_and_keeps_16_token_blocks() {
        let (format, rows) = load_sample("bailian-sample.jsonl");
        assert_eq!(format, TraceFormat::Bailian);
        // File order: chats 100, 200, 201, 101, 300, 401 (its parent 400 is not in the
        // file: a session of its own), 102.
        assert_eq!(
            turns(&rows),
            [
                (100, 1),
                (200, 1),
                (200, 2),
                (100, 2),
                (300, 1),
                (401, 2),
                (100, 3)
            ]
        );
        let times: Vec<f64> = rows.iter().map(|r| r.timestamp_ms.unwrap()).collect();
        assert_eq!(times, [0.0, 1000.0, 2000.0, 3500.0, 4000.0, 5000.0, 9250.0]);
        let classes: Vec<&str> = rows.iter().map(|r| r.class.as_deref().unwrap()).collect();
        assert_eq!(
            classes,
            ["text", "search", "search", "text", "file", "image", "text"]
        );
        assert!(rows.iter().all(|r| r.hash_block == 16));
        assert_eq!(rows[6].hash_ids, [0, 1, 3, 4, 6, 7, 8]);
    }

    #[test]
    fn tracelab_rounds_are_sent_when_their_input_is_complete() {
        let (format, rows) = load_sample("tracelab-sample.jsonl");
        assert_eq!(format, TraceFormat::Tracelab);
        // Sessions by first appearance: claude 0, codex 1; rows in send order.
        assert_eq!(turns(&rows), [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3)]);
        let times: Vec<f64> = rows.iter().map(|r| r.timestamp_ms.unwrap()).collect();
        // 05:40:20.151 (user message), 25.000, 31.696 (the tool result), 40.250, and the
        // third claude round at its later input event, 45.500 (not its user message, 44.000).
        assert_eq!(times, [0.0, 4849.0, 11545.0, 20099.0, 25349.0]);
        let classes: Vec<&str> = rows.iter().map(|r| r.class.as_deref().unwrap()).collect();
        assert_eq!(
            classes,
            [
                "claude-opus-4-8",
                "gpt-5.4",
                "claude-opus-4-8",
                "gpt-5.4",
                "claude-haiku-4-5"
            ]
        );
        let prefixes: Vec<u32> = rows.iter().map(|r| r.shared_prefix.unwrap()).collect();
        assert_eq!(prefixes, [0, 0, 320, 256, 400]);
        assert_eq!(rows[4].input_len, 480);
        // The released file is gzipped: the same rows.
        let dir = tempfile::tempdir().unwrap();
        let gz = dir.path().join("t.jsonl.gz");
        let mut encoder = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::fast(),
        );
        std::io::Write::write_all(
            &mut encoder,
            &std::fs::read(sample("tracelab-sample.jsonl")).unwrap(),
        )
        .unwrap();
        encoder.finish().unwrap();
        assert_eq!(detect_format(&gz).unwrap(), TraceFormat::Tracelab);
        assert_eq!(load(&gz, TraceFormat::Tracelab, &words).unwrap(), rows);
    }

    #[test]
    fn weka_files_are_sessions_and_subagents_their_own() {
        let (format, rows) = load_sample("weka-sample.json");
        assert_eq!(format, TraceFormat::Weka);
        // The parent at 0, 3.5 and 11 s; its sub-agent from 6 s, its turns 1.5 s apart.
        assert_eq!(turns(&rows), [(0, 1), (0, 2), (1, 1), (1, 2), (0, 3)]);
        let times: Vec<f64> = rows.iter().map(|r| r.timestamp_ms.unwrap()).collect();
        assert_eq!(times, [0.0, 3500.0, 6000.0, 7500.0, 11000.0]);
        assert_eq!(rows[2].class.as_deref(), Some("claude-haiku-4-5-20251001"));
        assert!(rows.iter().all(|r| r.hash_block == 64));
        // The sub-agent's ids are in its parent's space.
        assert_eq!(rows[2].hash_ids[..2], rows[0].hash_ids[..2]);
        // A folder of session files: each file's ids apart from the other's.
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.json", "b.json"] {
            std::fs::copy(sample("weka-sample.json"), dir.path().join(name)).unwrap();
        }
        let both = load(dir.path(), detect_format(dir.path()).unwrap(), &words).unwrap();
        assert_eq!(both.len(), 10);
        let sessions: std::collections::BTreeSet<u64> =
            both.iter().map(|r| r.session.unwrap().session).collect();
        assert_eq!(sessions.len(), 4);
        assert_ne!(
            both[0].hash_ids[0], both[1].hash_ids[0],
            "two files at t = 0, apart"
        );
    }

    #[test]
    fn mooncake_files_and_azure_2024_load_in_their_formats() {
        for (name, shared) in [
            (
                "mooncake-conversation-sample.jsonl",
                [(0, 1, 1), (2, 3, 12)],
            ),
            ("mooncake-toolagent-sample.jsonl", [(0, 1, 4), (1, 2, 0)]),
        ] {
            let (format, rows) = load_sample(name);
            assert_eq!(format, TraceFormat::Mooncake, "{name}");
            // No field links turns: every row is a request of its own.
            assert!(rows
                .iter()
                .all(|r| r.session.is_none() && r.hash_block == 512));
            for (a, b, blocks) in shared {
                let common = rows[a]
                    .hash_ids
                    .iter()
                    .zip(&rows[b].hash_ids)
                    .take_while(|(x, y)| x == y)
                    .count();
                assert_eq!(common, blocks, "{name}: rows {a} and {b}");
            }
        }
        // Azure's 2024 week has the 2023 columns, its times UTC with an offset.
        let (format, rows) = load_sample("azure2024-sample.csv");
        assert_eq!(format, TraceFormat::Azure);
        let times: Vec<f64> = rows.iter().map(|r| r.timestamp_ms.unwrap()).collect();
        assert_eq!(times, [0.0, 7.405, 990.07]);
        assert_eq!((rows[2].input_len, rows[2].output_len), (110, 27));
    }

    #[test]
    fn session_trace_lines_that_break_their_format_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("b.jsonl", TraceFormat::Bailian, "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0, \"input_length\": 40, \"output_length\": 1, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [0, 1]}\n", "b.jsonl:1", "hash_ids"),
            ("c.jsonl", TraceFormat::Bailian, "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"turn\": 1, \"hash_ids\": [0]}\n", "c.jsonl:1", "type"),
            ("t.jsonl", TraceFormat::Tracelab, "{\"session_id\": \"s\", \"round_index\": 0, \"model\": \"m\", \"input_tokens_total\": 10, \"prefix_tokens\": 3, \"newly_append_tokens\": 3, \"output_tokens\": 1, \"timing_events\": [{\"event_type\": \"user_message\", \"timestamp\": \"2026-06-01T05:40:20.151Z\"}]}\n", "t.jsonl:1", "input_tokens_total"),
            ("u.jsonl", TraceFormat::Tracelab, "{\"session_id\": \"s\", \"round_index\": 0, \"model\": \"m\", \"input_tokens_total\": 6, \"prefix_tokens\": 3, \"newly_append_tokens\": 3, \"output_tokens\": 1, \"timing_events\": [{\"event_type\": \"user_message\", \"timestamp\": \"yesterday\"}]}\n", "u.jsonl:1", "timing_events[].timestamp"),
            ("w.json", TraceFormat::Weka, "{\"block_size\": 64, \"requests\": [{\"t\": 0, \"type\": \"n\", \"in\": 130, \"out\": 2, \"hash_ids\": [1]}]}", "w.json", "requests[0].hash_ids"),
            ("x.json", TraceFormat::Weka, "{\"block_size\": 64, \"requests\": [{\"t\": 0, \"type\": \"n\", \"in\": 64, \"out\": 2, \"hash_ids\": [1]}, {\"t\": 1, \"type\": \"subagent\", \"requests\": [{\"t\": 0, \"type\": \"q\", \"in\": 1, \"out\": 1}]}]}", "x.json", "requests[1].requests[0].type"),
            ("y.json", TraceFormat::Weka, "{\"block_size\": 0, \"requests\": []}", "y.json", "block_size"),
            ("d.jsonl", TraceFormat::Bailian, "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [0]}\n{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 1, \"input_length\": 4, \"output_length\": 1, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [0]}\n", "d.jsonl", "rows 1 and 2"),
        ];
        for (name, format, content, place, field) in cases {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            let err = format!("{:#}", load(&p, format, &words).unwrap_err());
            assert!(err.contains(place) && err.contains(field), "{err}");
        }
    }

    #[test]
    fn timestamps_parse_in_all_azure_forms() {
        let a = parse_azure_timestamp("2023-11-16 18:17:03.9799600").unwrap();
        let b = parse_azure_timestamp("2023-11-16 18:17:03").unwrap();
        assert_eq!(a - b, 979_960_000);
        let c = parse_azure_timestamp("2024-05-10 00:00:00.009930+00:00").unwrap();
        let d = parse_azure_timestamp("2024-05-10 00:00:00+00:00").unwrap();
        assert_eq!(c - d, 9_930_000);
        let e = parse_azure_timestamp("2024-05-10 02:00:00+02:00").unwrap();
        assert_eq!(e, d);
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("bad.jsonl", "{\"timestamp_ms\": 0, \"input_len\": 1, \"output_len\": 1}\n{\"input_len\": \"x\"}\n", TraceFormat::Jsonl, "bad.jsonl:2"),
            ("mc.jsonl", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n\n{oops\n", TraceFormat::Mooncake, "mc.jsonl:3"),
            ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n2023-11-16 18:17:03.9799600,4808,10\r\nnot a time,1,2\r\n", TraceFormat::Azure, "az.csv:4"),
            ("bg.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,x,18,490,Conversation log\n", TraceFormat::Burstgpt, "bg.csv:2"),
        ];
        for (name, content, format, expected) in cases {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            let err = format!("{:#}", load(&p, format, &words).unwrap_err());
            assert!(err.contains(expected), "{err}");
        }
    }
}
