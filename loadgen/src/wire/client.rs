//! The OpenAI-compatible HTTP client: request bodies, the streaming response reader that
//! timestamps every SSE chunk on arrival (monotonic clock), and the per-request record.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reports::records::{
    ChunkTokensSource, CountSource, ErrorKind, Phase, RequestError, RequestRecord,
};
use serde_json::Value;
use tokio::sync::watch;

use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::RequestSpec;
use crate::wire::api::{self, Api, CallPiece, Conversation, ToolCall};
use crate::wire::connections::{HttpClient, OpenedConnection};
use crate::wire::sse::SseParser;
use crate::wire::target::Target;

/// Header carrying the request's id in the plan, so that a server's log (the mock's
/// calibration log, for one) can be matched with the records.
pub const REQUEST_ID_HEADER: &str = "x-loadgen-request-id";

/// `GET /v1/models` of the server at `base_url`.
fn models_url(base_url: &str) -> String {
    format!("{}/v1/models", base_url.trim_end_matches('/'))
}

/// How long the warm-up waits for each answer's headers, then for its body.
const WARM_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens up to `connections` pooled connections to `target` before a run, so that measured
/// requests do not pay connection set-up (or a listen backlog's overflow) inside their TTFT:
/// all requests are held open together (each on its own connection), then their bodies are
/// read so the connections return to the pool, their connect times claimed. Answers do not
/// matter; failures are ignored and the run reports its own errors. Returns the connections
/// that answered.
pub async fn warm_pool(client: &HttpClient, target: &Target, connections: usize) -> usize {
    let url = models_url(&target.base_url);
    let responses = futures::future::join_all((0..connections).map(|_| async {
        let request = http_request(
            http::Method::GET,
            &url,
            &target.headers,
            target.api_key.as_deref(),
            Bytes::new(),
        )
        .ok()?;
        tokio::time::timeout(WARM_TIMEOUT, client.request(request))
            .await
            .ok()?
            .ok()
    }))
    .await;
    let answered: Vec<_> = responses.into_iter().flatten().collect();
    let count = answered.len();
    futures::future::join_all(answered.into_iter().map(|response| {
        if let Some(conn) = response.extensions().get::<OpenedConnection>() {
            conn.claim_connect_ms(Instant::now());
        }
        tokio::time::timeout(WARM_TIMEOUT, response.into_body().collect())
    }))
    .await;
    count
}

/// The JSON body of `spec`, serialised: built before the request's send instant.
pub fn encoded_body(target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Bytes> {
    let body = request_body(target, spec, prompts)?;
    Ok(serde_json::to_vec(&body)
        .context("serialising the request body")?
        .into())
}

/// The body of one turn of a conversation (a session's, with its history and tools), in
/// the format of `target.backend`, `--extra-body` merged in, serialised.
pub fn conversation_body(
    target: &Target,
    spec: &RequestSpec,
    conversation: Conversation<'_>,
) -> Result<Bytes> {
    let api = api::of(target.backend);
    let mut body = api.conversation_body(target, spec, conversation)?;
    if let Some(extra) = &target.extra_body {
        extra.merge_into(api.fields_of(&mut body));
    }
    Ok(serde_json::to_vec(&body)
        .context("serialising the request body")?
        .into())
}

/// What an answer said: its text (not its reasoning) and the tool calls it made, in the
/// order their first pieces came.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub text: String,
    pub calls: Vec<ToolCall>,
}

impl Answer {
    /// Adds a streamed piece of call `piece.index`.
    fn add_piece(&mut self, piece: &CallPiece<'_>, slots: &mut Vec<u32>) {
        let at = match slots.iter().position(|&i| i == piece.index) {
            Some(at) => at,
            None => {
                slots.push(piece.index);
                self.calls.push(ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[at];
        if let Some(id) = piece.id.as_deref().filter(|id| !id.is_empty()) {
            call.id = id.to_string();
        }
        if let Some(name) = piece.name.as_deref().filter(|n| !n.is_empty()) {
            call.name = name.to_string();
        }
        match (&piece.arguments, piece.whole) {
            (Some(whole), true) => call.arguments = whole.to_string(),
            (Some(more), false) => call.arguments.push_str(more),
            (None, _) => {}
        }
    }
}

/// A request to `url` with the target's extra headers and credentials.
fn http_request(
    method: http::Method,
    url: &str,
    headers: &[(String, String)],
    api_key: Option<&str>,
    body: Bytes,
) -> Result<http::Request<Full<Bytes>>, http::Error> {
    let mut request = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    if let Some(key) = api_key {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    request.body(Full::new(body))
}

/// The first model id listed by `GET /v1/models`.
pub async fn first_model(
    client: &HttpClient,
    base_url: &str,
    headers: &[(String, String)],
    api_key: Option<&str>,
) -> Result<String> {
    let url = models_url(base_url);
    let request = http_request(http::Method::GET, &url, headers, api_key, Bytes::new())
        .with_context(|| format!("GET {url}: building the request"))?;
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 30 s"))
        .and_then(|answer| answer)
        .with_context(|| format!("GET {url}"))?;
    let body: Value = serde_json::from_slice(&body)
        .with_context(|| format!("GET {url}: response is not JSON"))?;
    if !status.is_success() {
        bail!("GET {url}: HTTP {status}: {body}");
    }
    body["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("GET {url}: no model listed; pass --model"))
}

/// The JSON body of one request, in the format of `target.backend`, with `--extra-body`
/// merged in.
pub fn request_body(target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value> {
    let api = api::of(target.backend);
    let mut body = api.body(target, spec, prompts)?;
    if let Some(extra) = &target.extra_body {
        extra.merge_into(api.fields_of(&mut body));
    }
    Ok(body)
}

/// What the run loop knows about a request before it is sent.
#[derive(Debug, Clone)]
pub struct RequestStub {
    pub id: u64,
    pub phase: Phase,
    pub scheduled_ms: f64,
    pub queue_ms: f64,
    pub input_len: u32,
    pub output_len: u32,
    pub prefix_group: Option<u64>,
}

fn ms_since(origin: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(origin).as_secs_f64() * 1000.0
}

/// Accumulates a streamed response.
#[derive(Default)]
struct StreamState {
    chunk_ms: Vec<f64>,
    chunk_tokens: Vec<u32>,
    /// Whether each content chunk carried reasoning only (no answer output).
    chunk_reasoning: Vec<bool>,
    /// A chunk has said which side (reasoning or answer) its output is on.
    sided: bool,
    first_answer_ms: Option<f64>,
    /// Every content chunk carried a usage object.
    continuous: bool,
    last_usage_completion: Option<u64>,
    last_usage_reasoning: Option<u64>,
    usage_prompt: Option<u64>,
    usage_cached: Option<u64>,
    server_timing: Option<reports::records::ServerTiming>,
    /// The answer, when kept (a session sends it back in the next turn's history).
    answer: Option<Answer>,
    /// The server's index of each call in `answer`, in order.
    call_slots: Vec<u32>,
    done: bool,
    finished: bool,
    error: Option<String>,
}

impl StreamState {
    fn on_event(&mut self, data: &str, at_ms: f64, api: &dyn Api) {
        let event = match api.event(data) {
            Ok(event) => event,
            Err(e) => {
                self.error = Some(format!("unparsable SSE data ({e}): {}", truncate(data)));
                return;
            }
        };
        // `[DONE]` carries nothing else; the Responses API's final event carries the usage.
        if event.done {
            self.done = true;
        }
        if let Some(detail) = event.error {
            self.error = Some(format!("error event: {}", truncate(&detail)));
            return;
        }
        let usage_completion = event.completion_tokens;
        if let Some(p) = event.prompt_tokens {
            self.usage_prompt = Some(p);
        }
        if let Some(r) = event.reasoning_tokens {
            self.last_usage_reasoning = Some(r);
        }
        if let Some(c) = event.cached_tokens {
            self.usage_cached = Some(c);
        }
        if let Some(t) = event.server_timing {
            self.server_timing = Some(t);
        }
        if let Some(answer) = self.answer.as_mut() {
            if let Some(text) = event.text.as_deref() {
                answer.text.push_str(text);
            }
            for piece in &event.tool_calls {
                answer.add_piece(piece, &mut self.call_slots);
            }
        }
        if event.finished {
            self.finished = true;
        }
        let delta = match (usage_completion, self.last_usage_completion) {
            (Some(now), prev) => Some(now.saturating_sub(prev.unwrap_or(0))),
            (None, _) => None,
        };
        if let Some(now) = usage_completion {
            self.last_usage_completion = Some(now);
        }
        // A call's whole text at its end is no new output.
        let answer = event.text.as_deref().is_some_and(|t| !t.is_empty())
            || event.tool_calls.iter().any(|p| !p.whole);
        let reasoning = event.reasoning.as_deref().is_some_and(|t| !t.is_empty());
        // A content chunk carries output, or tokens whose text is still held back (vLLM sends
        // an empty text for a partial UTF-8 character, with its usage delta); a usage-only
        // chunk has no choice and never counts.
        let carries_tokens = event.has_choice && delta.is_some_and(|d| d > 0);
        if answer || reasoning || carries_tokens {
            // Held-back tokens belong to the one field their chunk has, else to the output
            // before them; tokens with no field before any output that says its side (a
            // think marker's chunk) take the side of the first chunk that does.
            let side = if answer || reasoning {
                Some(!answer)
            } else if event.text.is_some() != event.reasoning.is_some() {
                Some(event.reasoning.is_some())
            } else if self.sided {
                self.chunk_reasoning.last().copied()
            } else {
                None
            };
            if self.chunk_ms.is_empty() {
                self.continuous = true;
            }
            self.continuous &= delta.is_some();
            self.chunk_ms.push(at_ms);
            self.chunk_reasoning.push(side.unwrap_or(false));
            if let (Some(reasoning_only), false) = (side, self.sided) {
                self.sided = true;
                self.chunk_reasoning.fill(reasoning_only);
            }
            if side == Some(false) && self.first_answer_ms.is_none() {
                self.first_answer_ms = self
                    .chunk_reasoning
                    .iter()
                    .position(|&r| !r)
                    .map(|i| self.chunk_ms[i]);
            }
            self.chunk_tokens
                .push(delta.map_or(1, |d| u32::try_from(d).unwrap_or(u32::MAX)));
        } else if let (Some(d), Some(last)) = (delta, self.chunk_tokens.last_mut()) {
            // Tokens reported without text (e.g. a trailing usage chunk) belong to the last chunk.
            if self.continuous {
                *last += u32::try_from(d).unwrap_or(0);
            }
        }
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(300).collect()
}

/// What kind of failure sending a request (before any answer) is.
fn classify_send(e: &hyper_util::client::legacy::Error) -> ErrorKind {
    if e.is_connect() {
        ErrorKind::Connect
    } else {
        ErrorKind::Protocol
    }
}

/// `e` and its sources, joined.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// Sends one request and measures it: `sent` is the instant the request is handed to the
/// HTTP client, each chunk's time its arrival at this host ([`OpenedConnection::latest_arrival`]).
/// Never fails: errors become the record's `error`. When `stop` fires while the request is in
/// flight, the record keeps what arrived so far and says `Phase::Interrupted`.
pub async fn execute(
    client: &HttpClient,
    target: &Target,
    stub: RequestStub,
    body: Bytes,
    origin: Instant,
    stop: watch::Receiver<bool>,
) -> RequestRecord {
    exchange(client, target, stub, body, origin, stop, false)
        .await
        .0
}

/// [`execute`]; with `keep_answer`, also the answer (its text, not its reasoning, and its
/// tool calls), which a session's next turn sends back as history. Without it nothing is kept.
pub async fn exchange(
    client: &HttpClient,
    target: &Target,
    mut stub: RequestStub,
    body: Bytes,
    origin: Instant,
    stop: watch::Receiver<bool>,
    keep_answer: bool,
) -> (RequestRecord, Option<Answer>) {
    let url = format!(
        "{}{}",
        target.base_url.trim_end_matches('/'),
        api::of(target.backend).path()
    );
    let api = api::of(target.backend);
    let request = http_request(
        http::Method::POST,
        &url,
        &target.headers,
        target.api_key.as_deref(),
        body,
    )
    .map(|mut request| {
        let headers = request.headers_mut();
        headers.insert(REQUEST_ID_HEADER, stub.id.into());
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        request
    });
    let request = match request {
        Ok(request) => request,
        Err(e) => {
            let record = unsent_record(stub, target, origin, format!("building the request: {e}"));
            return (record, None);
        }
    };
    let sent = Instant::now();
    let mut st = StreamState {
        answer: keep_answer.then(Answer::default),
        ..StreamState::default()
    };
    let mut status = None;
    let mut connect_ms = None;
    let mut failure: Option<(ErrorKind, String)> = None;
    let exchange = async {
        let response = match client.request(request).await {
            Ok(response) => response,
            Err(e) => {
                failure = Some((classify_send(&e), error_chain(&e)));
                return;
            }
        };
        let code = response.status();
        status = Some(code.as_u16());
        let conn = response.extensions().get::<OpenedConnection>().cloned();
        connect_ms = conn.as_ref().and_then(|c| c.claim_connect_ms(sent));
        let mut body = response.into_body();
        if !code.is_success() {
            let kind = match code.as_u16() {
                429 => ErrorKind::Http429,
                500..=599 => ErrorKind::Http5xx,
                _ => ErrorKind::HttpOther,
            };
            let text = body
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            failure = Some((kind, format!("HTTP {code}: {}", truncate(&text))));
            return;
        }
        let mut parser = SseParser::new();
        while let Some(frame) = body.frame().await {
            let now = Instant::now();
            let arrived = conn
                .as_ref()
                .and_then(OpenedConnection::latest_arrival)
                .map_or(now, |at| at.min(now));
            let at_ms = ms_since(origin, arrived);
            match frame {
                Ok(frame) => {
                    if let Some(bytes) = frame.data_ref() {
                        for data in parser.push(bytes) {
                            st.on_event(&data, at_ms, api);
                        }
                    }
                }
                Err(e) => {
                    failure = Some((ErrorKind::StreamCut, error_chain(&e)));
                    break;
                }
            }
            if st.error.is_some() {
                break;
            }
        }
        if failure.is_none() {
            if let Some(msg) = st.error.take() {
                failure = Some((ErrorKind::Protocol, msg));
            } else if !st.done && !st.finished {
                failure = Some((
                    ErrorKind::StreamCut,
                    "stream ended before its end ([DONE], or response.completed)".into(),
                ));
            } else if st.chunk_ms.is_empty() {
                failure = Some((ErrorKind::Protocol, "no content in the response".into()));
            }
        }
    };
    let cut_short = tokio::select! {
        () = exchange => None,
        () = stopped(stop) => Some(ErrorKind::Interrupted),
        () = tokio::time::sleep(target.timeout) => Some(ErrorKind::Timeout),
    };
    match cut_short {
        Some(ErrorKind::Interrupted) => {
            stub.phase = Phase::Interrupted;
            failure = Some((
                ErrorKind::Interrupted,
                "the run was stopped while the request was in flight".into(),
            ));
        }
        Some(kind) => {
            failure = Some((
                kind,
                format!(
                    "no complete answer within the timeout ({:?})",
                    target.timeout
                ),
            ));
        }
        None => {}
    }
    let end = Instant::now();
    // Output that never said its side is the answer's.
    if !st.sided && st.first_answer_ms.is_none() {
        st.first_answer_ms = st.chunk_ms.first().copied();
    }
    let answer = st.answer.take();
    let mut record = finish_record(stub, target, sent, end, origin, st, status, failure);
    record.connect_ms = connect_ms;
    (record, answer)
}

/// The record of a request that was never sent because its body could not be built.
pub fn unsent_record(
    stub: RequestStub,
    target: &Target,
    origin: Instant,
    message: String,
) -> RequestRecord {
    let now = Instant::now();
    let failure = Some((ErrorKind::RequestBody, message));
    finish_record(
        stub,
        target,
        now,
        now,
        origin,
        StreamState::default(),
        None,
        failure,
    )
}

#[allow(clippy::too_many_arguments)]
fn finish_record(
    stub: RequestStub,
    target: &Target,
    sent: Instant,
    end: Instant,
    origin: Instant,
    st: StreamState,
    status: Option<u16>,
    failure: Option<(ErrorKind, String)>,
) -> RequestRecord {
    let n_chunks = st.chunk_ms.len() as u64;
    let (output_tokens, output_source) = match st.last_usage_completion {
        Some(n) => (n, CountSource::Usage),
        None => (n_chunks, CountSource::Counted),
    };
    let (chunk_tokens, chunk_source) = if st.continuous && !st.chunk_tokens.is_empty() {
        (st.chunk_tokens, ChunkTokensSource::ContinuousUsage)
    } else if let (Some(total), true) = (st.last_usage_completion, n_chunks > 0) {
        // Spread the total over the chunks; the first `total % n` chunks get one more.
        let base = total / n_chunks;
        let extra = total % n_chunks;
        let spread = (0..n_chunks)
            .map(|i| u32::try_from(base + u64::from(i < extra)).unwrap_or(u32::MAX))
            .collect();
        (spread, ChunkTokensSource::UsageSpread)
    } else {
        (vec![1; st.chunk_ms.len()], ChunkTokensSource::OnePerChunk)
    };
    let (reasoning_tokens, reasoning_source) = match st.last_usage_reasoning {
        Some(n) => (n, CountSource::Usage),
        None => (
            chunk_tokens
                .iter()
                .zip(&st.chunk_reasoning)
                .filter(|(_, &reasoning)| reasoning)
                .map(|(&k, _)| u64::from(k))
                .sum(),
            CountSource::Counted,
        ),
    };
    let (prompt_tokens, prompt_source) = match st.usage_prompt {
        Some(p) => (p, CountSource::Usage),
        None => (u64::from(stub.input_len), CountSource::Requested),
    };
    let requested = u64::from(stub.output_len);
    let success = failure.is_none();
    let end_ms = if success {
        st.chunk_ms
            .last()
            .copied()
            .unwrap_or_else(|| ms_since(origin, end))
    } else {
        ms_since(origin, end)
    };
    RequestRecord {
        id: stub.id,
        phase: stub.phase,
        scheduled_ms: stub.scheduled_ms,
        queue_ms: stub.queue_ms,
        sent_ms: ms_since(origin, sent),
        connect_ms: None,
        first_token_ms: st.chunk_ms.first().copied(),
        first_answer_ms: st.first_answer_ms,
        end_ms,
        chunk_ms: st.chunk_ms,
        chunk_tokens,
        chunk_tokens_source: chunk_source,
        prompt_tokens,
        prompt_tokens_source: prompt_source,
        output_tokens,
        output_tokens_source: output_source,
        reasoning_tokens,
        reasoning_tokens_source: reasoning_source,
        requested_output_tokens: requested,
        short_output: success && target.ignore_eos && output_tokens < requested,
        prefix_group: stub.prefix_group,
        session: None,
        class: None,
        cached_tokens: st.usage_cached,
        server_timing: st.server_timing,
        http_status: status,
        error: failure.map(|(kind, message)| RequestError { kind, message }),
    }
}

/// Resolves once `stop` says so (never, if its sender is gone without saying so).
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::backend::Backend;

    #[test]
    fn stream_state_counts_tokens_per_chunk() {
        let mut st = StreamState::default();
        st.on_event(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            1.0,
            api::of(Backend::Chat),
        );
        st.on_event(r#"{"choices":[{"delta":{"content":"a b"},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#, 2.0, api::of(Backend::Chat));
        st.on_event(r#"{"choices":[{"delta":{"content":"c"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#, 3.0, api::of(Backend::Chat));
        st.on_event(
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#,
            3.5,
            api::of(Backend::Chat),
        );
        st.on_event("[DONE]", 3.5, api::of(Backend::Chat));
        assert_eq!(st.chunk_ms, vec![2.0, 3.0], "role prelude is not content");
        assert_eq!(st.chunk_tokens, vec![2, 1]);
        assert!(st.continuous && st.done && st.finished);
        assert_eq!(
            (st.usage_prompt, st.last_usage_completion),
            (Some(5), Some(3))
        );
    }

    #[test]
    fn reasoning_chunks_are_told_from_answer_chunks() {
        let chat = api::of(Backend::Chat);
        let mut st = StreamState::default();
        let usage = |n: u32| format!(r#","usage":{{"prompt_tokens":3,"completion_tokens":{n}}}"#);
        st.on_event(
            &format!(
                r#"{{"choices":[{{"delta":{{"reasoning":"a"}}}}]{}}}"#,
                usage(1)
            ),
            1.0,
            chat,
        );
        // Tokens held back (half a UTF-8 character) in the reasoning field are reasoning.
        st.on_event(
            &format!(
                r#"{{"choices":[{{"delta":{{"reasoning":""}}}}]{}}}"#,
                usage(2)
            ),
            2.0,
            chat,
        );
        // Reasoning ends and the answer starts inside one chunk: an answer chunk.
        st.on_event(
            &format!(
                r#"{{"choices":[{{"delta":{{"reasoning":"b","content":"c"}}}}]{}}}"#,
                usage(4)
            ),
            3.0,
            chat,
        );
        st.on_event(
            &format!(
                r#"{{"choices":[{{"delta":{{"content":"d"}},"finish_reason":"stop"}}]{}}}"#,
                usage(5)
            ),
            4.0,
            chat,
        );
        st.on_event("[DONE]", 4.0, chat);
        assert_eq!(st.chunk_reasoning, [true, true, false, false]);
        assert_eq!(st.first_answer_ms, Some(3.0));
        let stub = RequestStub {
            id: 0,
            phase: Phase::Measured,
            scheduled_ms: 0.0,
            queue_ms: 0.0,
            input_len: 3,
            output_len: 5,
            prefix_group: None,
        };
        let target = Target {
            base_url: String::new(),
            backend: Backend::Chat,
            model: String::new(),
            headers: Vec::new(),
            api_key: None,
            timeout: Duration::from_secs(1),
            ignore_eos: true,
            min_tokens: false,
            prompt_ids: false,
            continuous_usage: true,
            extra_body: None,
            tls: None,
        };
        let origin = Instant::now();
        let r = finish_record(stub, &target, origin, origin, origin, st, Some(200), None);
        assert_eq!(r.chunk_tokens, [1, 1, 2, 1]);
        assert_eq!(
            (r.output_tokens, r.reasoning_tokens, r.answer_tokens()),
            (5, 2, 3)
        );
        assert_eq!(r.reasoning_tokens_source, CountSource::Counted);
        assert_eq!(
            (r.first_token_ms, r.first_answer_ms),
            (Some(1.0), Some(3.0))
        );
    }

    #[test]
    fn a_chunk_without_a_field_takes_the_side_of_the_first_that_has_one() {
        let chat = api::of(Backend::Chat);
        let usage = |n: u32| format!(r#","usage":{{"prompt_tokens":3,"completion_tokens":{n}}}"#);
        let chunk =
            |delta: &str, n: u32| format!(r#"{{"choices":[{{"delta":{delta}}}]{}}}"#, usage(n));
        // A server that sends its opening think marker as a token without text.
        let mut st = StreamState::default();
        st.on_event(&chunk("{}", 1), 1.0, chat);
        st.on_event(&chunk(r#"{"reasoning":"a"}"#, 2), 2.0, chat);
        st.on_event(&chunk(r#"{"content":"b"}"#, 3), 3.0, chat);
        assert_eq!(st.chunk_reasoning, [true, true, false]);
        assert_eq!(st.first_answer_ms, Some(3.0));
        // Half a character first, then the answer: the answer started with the first token.
        let mut st = StreamState::default();
        st.on_event(&chunk("{}", 1), 1.0, chat);
        st.on_event(&chunk(r#"{"content":"é"}"#, 2), 2.0, chat);
        assert_eq!(st.chunk_reasoning, [false, false]);
        assert_eq!(st.first_answer_ms, Some(1.0));
    }

    #[test]
    fn tool_calls_are_assembled_whole_or_from_pieces() {
        let chat = api::of(Backend::Chat);
        let mut st = StreamState {
            answer: Some(Answer::default()),
            ..StreamState::default()
        };
        // vLLM: id and name first, then the arguments in pieces; a second call at index 1
        // sent whole in one delta (as a server that buffers a call does).
        st.on_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}}]}"#, 1.0, chat);
        st.on_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"x\":"}}]}}]}"#, 2.0, chat);
        st.on_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}},{"index":1,"id":"call_b","type":"function","function":{"name":"g","arguments":"{}"}}]}}]}"#, 3.0, chat);
        let answer = st.answer.take().unwrap();
        assert_eq!(
            answer.calls,
            [
                ToolCall {
                    id: "call_a".into(),
                    name: "f".into(),
                    arguments: r#"{"x":1}"#.into()
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "g".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(st.chunk_ms, [1.0, 2.0, 3.0], "every call event is output");
        // Responses: the item's `done` gives the whole arguments, which replace the pieces
        // and are no new output.
        let responses = api::of(Backend::Responses);
        let mut st = StreamState {
            answer: Some(Answer::default()),
            ..StreamState::default()
        };
        st.on_event(r#"{"type":"response.output_item.added","output_index":3,"item":{"type":"function_call","call_id":"call_c","name":"h","arguments":""}}"#, 1.0, responses);
        st.on_event(r#"{"type":"response.function_call_arguments.delta","output_index":3,"delta":"{\"y\""}"#, 2.0, responses);
        st.on_event(r#"{"type":"response.output_item.done","output_index":3,"item":{"type":"function_call","call_id":"call_c","name":"h","arguments":"{\"y\":2}"}}"#, 3.0, responses);
        let answer = st.answer.take().unwrap();
        assert_eq!(answer.calls[0].arguments, r#"{"y":2}"#);
        assert_eq!(answer.calls[0].id, "call_c");
        assert_eq!(st.chunk_ms, [1.0, 2.0]);
    }

    #[test]
    fn token_without_text_is_content_but_usage_only_chunk_is_not() {
        // Continuous usage: the first token is half a UTF-8 character (empty text).
        let mut st = StreamState::default();
        st.on_event(
            r#"{"choices":[{"text":"","finish_reason":null}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#,
            1.0, api::of(Backend::Completions));
        st.on_event(
            r#"{"choices":[{"text":"é","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}"#,
            2.0, api::of(Backend::Completions));
        assert_eq!(
            st.chunk_ms,
            vec![1.0, 2.0],
            "TTFT starts at the first token"
        );
        assert_eq!(st.chunk_tokens, vec![1, 1]);
        // Usage only at the end (include_usage without continuous stats): not a content chunk.
        let mut st = StreamState::default();
        st.on_event(
            r#"{"choices":[{"text":"ab"}]}"#,
            1.0,
            api::of(Backend::Completions),
        );
        st.on_event(
            r#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}"#,
            5.0,
            api::of(Backend::Completions),
        );
        assert_eq!(st.chunk_ms, vec![1.0], "E2E ends at the last content chunk");
    }
}
