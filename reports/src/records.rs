//! The raw data of a run: one [`RequestRecord`] per request (a line of `records.jsonl`,
//! appended as each request ends) and one [`RunMeta`] per run (`meta.json`, beside it).
//!
//! All times are milliseconds (f64, microsecond resolution) on the client's monotonic clock,
//! measured from the run's origin instant; `RunMeta::start_time` gives that origin in wall-clock time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Version of the records / meta / summary schemas; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Which part of the run a request belongs to, decided by its scheduled send time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Warmup,
    Measured,
    Cooldown,
    /// In flight when the run was stopped (SIGTERM, Ctrl-C): kept with its partial timings,
    /// never counted in the metrics.
    Interrupted,
}

/// Where a token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountSource {
    /// The server's `usage` object.
    Usage,
    /// Counted by the client (content chunks / words); flagged because it may be wrong.
    Counted,
    /// Not observed: the value is the length the client asked for.
    Requested,
}

/// How the number of tokens in each streamed chunk was determined (for token-true ITL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkTokensSource {
    /// Usage on every chunk (vLLM `continuous_usage_stats`): exact per-chunk deltas.
    ContinuousUsage,
    /// The final `usage.completion_tokens` spread evenly over the chunks.
    UsageSpread,
    /// Neither was available: one token per chunk.
    OnePerChunk,
}

/// Why a request failed. Failed requests are counted by kind and excluded from latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// TCP connect failed (refused, unreachable).
    Connect,
    /// HTTP 429 Too Many Requests.
    Http429,
    /// HTTP 5xx.
    Http5xx,
    /// Any other non-2xx status.
    HttpOther,
    /// The request exceeded the client timeout.
    Timeout,
    /// The stream ended (or broke) before `[DONE]` / a finish reason.
    StreamCut,
    /// The response could not be parsed, or carried no content at all.
    Protocol,
    /// The run was stopped while the request was in flight.
    Interrupted,
    /// The request body could not be built (nothing was sent).
    RequestBody,
    /// The answer made a tool call the client cannot run (no id or name, or arguments that
    /// are not a JSON object): an agent session ends there.
    ToolCall,
}

impl ErrorKind {
    /// The snake_case name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Http429 => "http_429",
            ErrorKind::Http5xx => "http_5xx",
            ErrorKind::HttpOther => "http_other",
            ErrorKind::Timeout => "timeout",
            ErrorKind::StreamCut => "stream_cut",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::RequestBody => "request_body",
            ErrorKind::ToolCall => "tool_call",
        }
    }
}

/// A request's place in a multi-turn session. Its send instant (turns after the first) and
/// its history depend on the server's earlier answers, so they are not in the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionTurn {
    pub session: u64,
    /// 1 for the session's first turn.
    pub turn: u32,
    /// Messages sent before this turn's new ones (its user message, or an agent turn's tool
    /// results): an agent's system prompt, the earlier turns' messages and the answers.
    pub history_messages: u32,
    /// The session's phase (that of its first turn's scheduled send), which a turn cut in
    /// flight keeps although its own record says interrupted.
    #[serde(default = "measured")]
    pub window: Phase,
    /// How the session ended, on its last record only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<SessionEnd>,
    /// The wait between the previous answer's end and this turn's send, as drawn: the
    /// user's think time, or the tools' latency after an answer that called tools (0 for
    /// the first turn).
    #[serde(default)]
    pub wait_ms: f64,
    /// Tools this turn offered the model (an agent session's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tools_offered: u32,
    /// Tool calls this turn's answer made.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tool_calls: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionEnd {
    /// Every drawn turn was answered.
    Completed,
    /// Its next turn would have passed `--max-session-turns` or `--max-history-tokens`.
    Capped,
    /// A turn failed; the session stopped there.
    Failed,
    /// The run's drain limit passed, or the run was stopped, before its next turn.
    Cut,
}

/// A failed request's reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestError {
    pub kind: ErrorKind,
    pub message: String,
}

/// One request, as measured by the client. Derived metrics (TTFT, ITL, …) live in `metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Index of the request in the pre-generated request list.
    pub id: u64,
    pub phase: Phase,
    /// When the schedule said to send it.
    pub scheduled_ms: f64,
    /// Time spent waiting for a `--max-concurrency` slot (0 without a cap).
    pub queue_ms: f64,
    /// When the HTTP request actually started (after any queueing).
    /// Schedule lag = `sent_ms - queue_ms - scheduled_ms`.
    pub sent_ms: f64,
    /// Time to open the connection the request went over, when it was the first request
    /// on a connection opened during the run (inside its TTFT); `None` on a pooled one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_ms: Option<f64>,
    /// Arrival of the first chunk carrying output of any kind (answer text, reasoning text,
    /// a tool call or tokens); `None` if none arrived.
    pub first_token_ms: Option<f64>,
    /// Arrival of the first chunk carrying answer output (text or a tool call, not
    /// reasoning); `None` if none arrived. Records written before loadgen told reasoning
    /// apart lack it, and carried no reasoning (see [`RequestRecord::first_answer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_answer_ms: Option<f64>,
    /// Arrival of the last content chunk for a success; time of the failure otherwise.
    pub end_ms: f64,
    /// Arrival time of every content chunk, in order.
    pub chunk_ms: Vec<f64>,
    /// Tokens carried by each content chunk (same length as `chunk_ms`).
    pub chunk_tokens: Vec<u32>,
    pub chunk_tokens_source: ChunkTokensSource,
    pub prompt_tokens: u64,
    pub prompt_tokens_source: CountSource,
    /// Prompt tokens the server served from its prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`), when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// The server's own timing of the request, when its response says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_timing: Option<ServerTiming>,
    pub output_tokens: u64,
    pub output_tokens_source: CountSource,
    /// Output tokens spent reasoning (`delta.reasoning` / `reasoning_content`): the server's
    /// `usage.completion_tokens_details.reasoning_tokens` when given, else the tokens of the
    /// chunks that carried reasoning only. The answer's tokens are the rest
    /// ([`RequestRecord::answer_tokens`]).
    #[serde(default)]
    pub reasoning_tokens: u64,
    #[serde(default = "counted")]
    pub reasoning_tokens_source: CountSource,
    /// `max_tokens` sent with the request.
    pub requested_output_tokens: u64,
    /// The server returned fewer tokens than requested (with `ignore_eos` set).
    pub short_output: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_group: Option<u64>,
    /// The request's place in a multi-turn session (`--turns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionTurn>,
    /// Its class (`--class-by`): a trace's model or service, the model of a `--model-mix`,
    /// a session turn's kind, or its prefix group; `summary.json` has each class's numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    pub http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RequestError>,
}

/// The server's own timing of a request, in ms, from its response: ours and llama.cpp's
/// `timings` (`queue_ms` ours only, `prompt_ms`, `predicted_ms`), or vLLM's `metrics`
/// (`--enable-per-request-metrics`: `queue_time_ms`, `time_to_first_token_ms` from first
/// scheduled, `generation_time_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServerTiming {
    /// Arrival to first scheduled; `None` where the server does not say (llama.cpp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// First scheduled to first token.
    pub prefill_ms: f64,
    /// First token to last.
    pub decode_ms: f64,
}

impl ServerTiming {
    /// The server's time with the request: queue (where known), prefill and decode.
    pub fn total_ms(&self) -> f64 {
        self.queue_ms.unwrap_or(0.0) + self.prefill_ms + self.decode_ms
    }
}

impl RequestRecord {
    /// True when the request completed without error.
    pub fn is_success(&self) -> bool {
        self.error.is_none()
    }

    /// Output tokens of the answer: all but the reasoning ones.
    pub fn answer_tokens(&self) -> u64 {
        self.output_tokens.saturating_sub(self.reasoning_tokens)
    }

    /// Arrival of the first answer chunk. A record without one but with no reasoning either
    /// (written before loadgen told reasoning apart) answered from its first token.
    pub fn first_answer(&self) -> Option<f64> {
        self.first_answer_ms
            .or_else(|| self.first_token_ms.filter(|_| self.reasoning_tokens == 0))
    }

    /// Actual send − scheduled send, excluding time queued for a concurrency slot.
    pub fn schedule_lag_ms(&self) -> f64 {
        self.sent_ms - self.queue_ms - self.scheduled_ms
    }
}

/// Host the load generator ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub cpu_model: String,
    pub cores: usize,
    pub os: String,
}

/// Client-added error measured against the built-in mock (`loadgen calibrate`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Offered rate (open loop) or `None` for closed loop.
    pub rate: Option<f64>,
    /// Closed-loop concurrency, if that mode was used.
    pub concurrency: Option<usize>,
    pub mock_ttft_ms: f64,
    pub mock_itl_ms: f64,
    /// The load, in words: streams or rate, tokens, ITL, SSE events per second.
    #[serde(default)]
    pub load: String,
    pub requests: u64,
    /// The client's own TTFT error, p50 / p99: measured TTFT minus the mock's TTFT minus the
    /// mock's own lateness on that request (which the mock logs).
    pub added_ttft_p50_ms: f64,
    pub added_ttft_p99_ms: f64,
    /// Measured TTFT minus the mock's TTFT, the mock's lateness included, p99.
    #[serde(default)]
    pub raw_added_ttft_p99_ms: f64,
    /// How late the mock itself sent first chunks against its configured TTFT, p99.
    #[serde(default)]
    pub mock_lateness_p99_ms: f64,
    /// Measured chunk-ITL p50 / p99 minus the mock's ITL.
    pub added_itl_p50_ms: f64,
    pub added_itl_p99_ms: f64,
    pub schedule_lag_p99_ms: f64,
    /// Streamed output tokens per second sustained over the run.
    pub output_tokens_per_s: f64,
}

/// `meta.json`: the conditions of a run. Every report carries them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub schema_version: u32,
    pub loadgen_version: String,
    pub command_line: Vec<String>,
    pub seed: u64,
    /// Workload description (source, profile, length parameters), free-form JSON.
    pub workload: serde_json::Value,
    /// Schedule description (arrival process, rate, phases, concurrency), free-form JSON.
    pub schedule: serde_json::Value,
    pub url: String,
    /// `completions` or `chat`.
    pub backend: String,
    pub model: String,
    /// Server version, if the server reports one.
    #[serde(default)]
    pub server_version: Option<String>,
    pub host: HostInfo,
    /// RFC 3339 wall-clock time of the run origin (t = 0 ms in the records).
    pub start_time: String,
    /// Prompt lengths are approximate (no tokenizer given: ~1 token per word).
    pub approximate_lengths: bool,
    /// Requests in the pre-generated list.
    pub planned_requests: u64,
    #[serde(default)]
    pub calibration: Option<Calibration>,
    /// Free-form extra information (e.g. options specific to one source).
    #[serde(default)]
    pub extra: BTreeMap<String, serde_json::Value>,
    /// False in the copy written when the run starts; true once the run has ended (a run
    /// killed hard leaves the start copy, so its folder still says what it was).
    #[serde(default = "ended_by_default")]
    pub complete: bool,
    /// This run is one worker's share of a schedule sent by several (`--shard I/K`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardInfo>,
    /// This run was merged (`loadgen merge`) from these shards, in shard order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<MergedShard>,
    /// The fields merged into every request body (`--extra-body`), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_body: Option<serde_json::Value>,
}

/// One worker's share of a seeded schedule: the requests whose id (in a session run, whose
/// session id) ≡ `index` (mod `count`), each sent at `start_at` + its scheduled offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub index: u64,
    pub count: u64,
    /// Requests in the whole schedule, every shard's.
    pub schedule_requests: u64,
    /// FNV-1a digest of the whole request list (ids, send times, lengths, prompts) and the
    /// options that shape each request: equal on every shard of one schedule.
    #[serde(default)]
    pub schedule_digest: String,
    /// The common start instant of every shard (RFC 3339): t = 0 ms of the records.
    pub start_at: String,
    /// How long before `start_at` this worker was ready to send (ms); `None` until it was.
    pub ready_before_start_ms: Option<f64>,
    /// The system clock's synchronisation as the kernel reports it, where it does.
    pub clock: Option<ClockSync>,
}

/// The kernel's account of the system clock's synchronisation (Linux `adjtimex`), which
/// bounds how far apart the workers' common start instant really was.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClockSync {
    /// An NTP/PTP daemon disciplines the clock (the kernel's STA_UNSYNC is clear).
    pub synchronized: bool,
    /// Offset still being corrected, µs.
    pub offset_us: f64,
    /// Estimated error, µs.
    pub est_error_us: f64,
    /// Maximum error, µs.
    pub max_error_us: f64,
}

/// One shard of a merged run, as its worker saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergedShard {
    pub folder: String,
    /// The worker's own command line.
    #[serde(default)]
    pub command_line: Vec<String>,
    pub shard: ShardInfo,
    pub host: HostInfo,
    pub records: u64,
    /// The worker's CPU share (its client-bound rule).
    pub client_cpu: Option<f64>,
}

fn measured() -> Phase {
    Phase::Measured
}

fn counted() -> CountSource {
    CountSource::Counted
}

/// Run folders written before `complete` existed were written at the end of their run.
fn ended_by_default() -> bool {
    true
}

/// Reads a `records.jsonl` file; an unparsable line is an error naming the file and line.
pub fn read_records(path: &Path) -> Result<Vec<RequestRecord>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut records = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: read error", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: invalid record", path.display(), i + 1))?;
        records.push(record);
    }
    Ok(records)
}

/// Reads a `meta.json` file.
pub fn read_meta(path: &Path) -> Result<RunMeta> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: invalid run metadata", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_reader_names_bad_line() {
        let record = RequestRecord {
            id: 3,
            phase: Phase::Measured,
            scheduled_ms: 10.0,
            queue_ms: 1.0,
            sent_ms: 11.5,
            first_token_ms: Some(61.5),
            first_answer_ms: Some(71.5),
            end_ms: 81.5,
            chunk_ms: vec![61.5, 71.5, 81.5],
            chunk_tokens: vec![1, 1, 1],
            chunk_tokens_source: ChunkTokensSource::ContinuousUsage,
            prompt_tokens: 12,
            prompt_tokens_source: CountSource::Usage,
            output_tokens: 3,
            output_tokens_source: CountSource::Usage,
            reasoning_tokens: 1,
            reasoning_tokens_source: CountSource::Counted,
            requested_output_tokens: 3,
            short_output: false,
            prefix_group: None,
            cached_tokens: None,
            server_timing: None,
            session: None,
            class: None,
            connect_ms: None,
            http_status: Some(200),
            error: None,
        };
        assert!((record.schedule_lag_ms() - 0.5).abs() < 1e-12);
        assert_eq!(record.answer_tokens(), 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.jsonl");
        let line = serde_json::to_string(&record).unwrap();
        std::fs::write(&path, format!("{line}\n{line}\n")).unwrap();
        assert_eq!(read_records(&path).unwrap(), vec![record.clone(), record]);
        std::fs::write(&path, format!("{line}\n{{\"id\": 1}}\n")).unwrap();
        let err = format!("{:#}", read_records(&path).unwrap_err());
        assert!(err.contains("records.jsonl:2"), "{err}");
    }
}
