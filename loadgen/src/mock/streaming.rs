//! A mock answer streamed on its timing: the chunks' deadlines, reasoning before content, a
//! tool call instead of text when one is due, usage, and the injected faults; in the event
//! format of each API (completions, chat, responses, TGI).

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use super::ask::{error_response, Ask, Format};
use super::*;

pub(super) struct Timing {
    /// When the request came in (it waits for a slot until `start`).
    pub(super) arrival: Instant,
    pub(super) start: Instant,
    pub(super) ttft: Duration,
    pub(super) itl: Duration,
    pub(super) per_chunk: u32,
    pub(super) total: u32,
    pub(super) cut_after: Option<u32>,
}

impl Timing {
    pub(super) fn deadline(&self, chunk: u32) -> Instant {
        self.start + self.ttft + self.itl * chunk
    }

    /// The server's timing of a request whose last chunk was `last`, as our engine's
    /// `timings` names it: the wait for a slot, the time to the first chunk, and the rest.
    pub(super) fn server_timings(&self, last: u32) -> Value {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        json!({
            "queue_ms": ms(self.start.saturating_duration_since(self.arrival)),
            "prefill_ms": ms(self.ttft),
            "decode_ms": ms(self.deadline(last) - self.deadline(0)),
        })
    }
}

pub(super) fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// How a chat stream's answer starts with reasoning.
pub(super) struct Reasoning {
    /// The answer's first this many tokens.
    pub(super) tokens: u32,
    pub(super) field: ReasoningField,
    /// Usage objects carry `completion_tokens_details.reasoning_tokens`.
    pub(super) usage: bool,
    /// A chat answer's first word, `r<request id> `, so that a client sending the answer
    /// back (a session's history) can be checked to send this answer.
    pub(super) answer_tag: String,
}

/// A tool call the answer makes instead of text, over [`CALL_TOKENS`] tokens of one chunk
/// each: the first opens the call (id and name), the next ones carry its arguments' text in
/// pieces, as vLLM streams them.
pub(super) struct MockCall {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// Tokens of each tool call of an answer.
pub(super) const CALL_TOKENS: u32 = 4;

impl MockCall {
    /// The arguments' piece of the call's token `token` (the first carries none).
    fn piece(&self, token: u32) -> &str {
        let pieces = (CALL_TOKENS - 1) as usize;
        let n = self.arguments.len();
        let cut = |k: usize| {
            let mut at = n * k / pieces;
            while !self.arguments.is_char_boundary(at) {
                at += 1;
            }
            at
        };
        match token {
            0 => "",
            t => &self.arguments[cut(t as usize - 1)..cut(t as usize)],
        }
    }
}

/// Which call, and which of its tokens, the chunk after `sent` tokens carries.
fn call_token(sent: u32) -> (usize, u32) {
    ((sent / CALL_TOKENS) as usize, sent % CALL_TOKENS)
}

impl Reasoning {
    /// Writes the usage object after `sent` tokens to `out` (no allocation of its own: the
    /// mock's CPU per event is what a calibration must keep small).
    fn write_usage(&self, out: &mut String, prompt: u64, sent: u32) {
        let c = u64::from(sent);
        let _ = write!(
            out,
            r#"{{"prompt_tokens":{prompt},"completion_tokens":{c},"total_tokens":{}"#,
            prompt + c
        );
        if self.usage {
            let _ = write!(
                out,
                r#","completion_tokens_details":{{"reasoning_tokens":{}}}"#,
                sent.min(self.tokens)
            );
        }
        out.push('}');
    }
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// State of one streaming response.
struct StreamState {
    model: String,
    ask: Ask,
    timing: Timing,
    reasoning: Reasoning,
    /// The tool calls the answer makes instead of text (one token per chunk).
    calls: Vec<MockCall>,
    chunk: u32,
    sent_tokens: u32,
    prelude_sent: bool,
    finished: bool,
    _permit: Option<OwnedSemaphorePermit>,
    /// A content event's text up to its choice's fields.
    chunk_prefix: String,
    /// The Responses API's events so far, and its open output item (index, kind).
    sequence: u64,
    item: Option<(u32, Item)>,
    /// The Responses API's items so far.
    items: u32,
    /// Where to log the first chunk's lateness: the log, the request id, its arrival.
    log: Option<(MockLog, Option<u64>, (Instant, SystemTime))>,
}

/// The kind of a Responses output item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Reasoning,
    Message,
    /// The answer's call of this index.
    Call(usize),
}

impl StreamState {
    /// One Responses event: `event:` and `data:` lines, the data with its `type` and
    /// sequence number.
    fn responses_event(&mut self, out: &mut String, kind: &str, fields: &str) {
        let _ = write!(
            out,
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":{}{}{fields}}}\n\n",
            self.sequence,
            if fields.is_empty() { "" } else { "," }
        );
        self.sequence += 1;
    }

    /// The Responses API's response object as of now.
    fn response_object(&self, status: &str, usage: Option<&str>) -> String {
        let mut out = format!(
            r#"{{"id":"resp_mock","object":"response","created_at":0,"model":{},"status":"{status}","output":[],"parallel_tool_calls":true,"tool_choice":"auto","tools":[]"#,
            Value::from(self.model.as_str())
        );
        if status == "incomplete" {
            out.push_str(r#","incomplete_details":{"reason":"max_output_tokens"}"#);
        }
        if let Some(usage) = usage {
            let _ = write!(
                out,
                r#","usage":{usage},"timings":{}"#,
                self.timing.server_timings(self.chunk.saturating_sub(1))
            );
        }
        out.push('}');
        out
    }

    /// Opens an output item of `kind` (closing the open one) unless it is open.
    fn open_item(&mut self, out: &mut String, kind: Item) {
        if self.item.is_some_and(|(_, k)| k == kind) {
            return;
        }
        self.close_item(out);
        let index = self.items;
        self.items += 1;
        self.item = Some((index, kind));
        let item = match kind {
            Item::Reasoning => format!(
                r#"{{"id":"rs_{index}","type":"reasoning","summary":[],"status":"in_progress"}}"#
            ),
            Item::Message => format!(
                r#"{{"id":"msg_{index}","type":"message","role":"assistant","content":[],"status":"in_progress"}}"#
            ),
            Item::Call(c) => {
                let (call_id, name) = self.calls.get(c).map_or((Value::Null, Value::Null), |c| {
                    (Value::from(c.id.as_str()), Value::from(c.name.as_str()))
                });
                format!(
                    r#"{{"id":"fc_{index}","type":"function_call","call_id":{call_id},"name":{name},"arguments":"","status":"in_progress"}}"#
                )
            }
        };
        self.responses_event(
            out,
            "response.output_item.added",
            &format!(r#""output_index":{index},"item":{item}"#),
        );
        let part = match kind {
            Item::Reasoning => r#"{"type":"reasoning_text","text":""}"#,
            Item::Message => r#"{"type":"output_text","text":"","annotations":[],"logprobs":[]}"#,
            Item::Call(_) => return,
        };
        let prefix = if kind == Item::Reasoning { "rs" } else { "msg" };
        self.responses_event(
            out,
            "response.content_part.added",
            &format!(r#""item_id":"{prefix}_{index}","output_index":{index},"content_index":0,"part":{part}"#),
        );
    }

    /// Closes the open output item.
    fn close_item(&mut self, out: &mut String) {
        let Some((index, kind)) = self.item.take() else {
            return;
        };
        let (id, item, part) = match kind {
            Item::Reasoning => (
                format!("rs_{index}"),
                format!(
                    r#"{{"id":"rs_{index}","type":"reasoning","summary":[],"status":"completed"}}"#
                ),
                r#"{"type":"reasoning_text","text":""}"#,
            ),
            Item::Message => (
                format!("msg_{index}"),
                format!(
                    r#"{{"id":"msg_{index}","type":"message","role":"assistant","content":[],"status":"completed"}}"#
                ),
                r#"{"type":"output_text","text":"","annotations":[]}"#,
            ),
            Item::Call(c) => {
                let (call_id, name, arguments) =
                    self.calls.get(c).map_or_else(Default::default, |c| {
                        (
                            Value::from(c.id.as_str()),
                            Value::from(c.name.as_str()),
                            Value::from(c.arguments.as_str()),
                        )
                    });
                self.responses_event(out, "response.function_call_arguments.done", &format!(r#""item_id":"fc_{index}","output_index":{index},"name":{name},"arguments":{arguments}"#));
                (
                    format!("fc_{index}"),
                    format!(
                        r#"{{"id":"fc_{index}","type":"function_call","call_id":{call_id},"name":{name},"arguments":{arguments},"status":"completed"}}"#
                    ),
                    "",
                )
            }
        };
        // The mock's done events carry no text: a client reads the deltas.
        let fields = format!(r#""item_id":"{id}","output_index":{index},"content_index":0"#);
        match kind {
            Item::Reasoning => {
                self.responses_event(
                    out,
                    "response.reasoning_text.done",
                    &format!(r#"{fields},"text":"""#),
                );
            }
            Item::Message => {
                self.responses_event(
                    out,
                    "response.output_text.done",
                    &format!(r#"{fields},"text":"","logprobs":[]"#),
                );
            }
            Item::Call(_) => {}
        }
        if !part.is_empty() {
            self.responses_event(
                out,
                "response.content_part.done",
                &format!(r#"{fields},"part":{part}"#),
            );
        }
        self.responses_event(
            out,
            "response.output_item.done",
            &format!(r#""output_index":{index},"item":{item}"#),
        );
    }

    /// The Responses events of one chunk of `k` tokens, `thinking` of them reasoning.
    fn responses_chunk(
        &mut self,
        k: u32,
        thinking: u32,
        first_answer_token: Option<u32>,
    ) -> String {
        let mut out = String::new();
        if !self.calls.is_empty() {
            let (c, token) = call_token(self.sent_tokens - k);
            self.open_item(&mut out, Item::Call(c));
            let piece = self
                .calls
                .get(c)
                .map(|call| call.piece(token).to_string())
                .unwrap_or_default();
            if !piece.is_empty() {
                let index = self.item.map_or(0, |(i, _)| i);
                self.responses_event(
                    &mut out,
                    "response.function_call_arguments.delta",
                    &format!(
                        r#""item_id":"fc_{index}","output_index":{index},"delta":{}"#,
                        Value::from(piece)
                    ),
                );
            }
            return out;
        }
        if thinking > 0 {
            self.open_item(&mut out, Item::Reasoning);
            let index = self.item.map_or(0, |(i, _)| i);
            self.responses_event(
                &mut out,
                "response.reasoning_text.delta",
                &format!(r#""item_id":"rs_{index}","output_index":{index},"content_index":0,"delta":"{}""#, "think ".repeat(thinking as usize)),
            );
        }
        if k > thinking {
            self.open_item(&mut out, Item::Message);
            let index = self.item.map_or(0, |(i, _)| i);
            let mut text = String::new();
            for i in thinking..k {
                if first_answer_token == Some(i) {
                    text.push_str(&self.reasoning.answer_tag);
                } else {
                    text.push_str("tok ");
                }
            }
            self.responses_event(
                &mut out,
                "response.output_text.delta",
                &format!(r#""item_id":"msg_{index}","output_index":{index},"content_index":0,"delta":"{text}","logprobs":[]"#),
            );
        }
        out
    }

    /// A chat or completions content event of one chunk of `k` tokens, `thinking` of them
    /// reasoning.
    fn openai_chunk(&mut self, k: u32, thinking: u32, first_answer_token: Option<u32>) -> String {
        // Written from a template rather than a JSON tree: at thousands of events per second
        // the mock's own CPU time is what a calibration must keep small.
        let last = self.sent_tokens == self.timing.total;
        let finish = match (last, self.calls.is_empty()) {
            (false, _) => "null",
            (true, false) => r#""tool_calls""#,
            (true, true) => r#""length""#,
        };
        let mut event = String::with_capacity(self.chunk_prefix.len() + 160);
        event.push_str(&self.chunk_prefix);
        let (c, token) = call_token(self.sent_tokens - k);
        if let (true, Some(call)) = (self.ask.chat(), self.calls.get(c)) {
            let piece = Value::from(call.piece(token));
            if token == 0 {
                let _ = write!(
                    event,
                    r#""delta":{{"tool_calls":[{{"index":{c},"id":{},"type":"function","function":{{"name":{},"arguments":{piece}}}}}]}}"#,
                    Value::from(call.id.as_str()),
                    Value::from(call.name.as_str())
                );
            } else {
                let _ = write!(
                    event,
                    r#""delta":{{"tool_calls":[{{"index":{c},"function":{{"arguments":{piece}}}}}]}}"#
                );
            }
        } else if self.ask.chat() {
            event.push_str(r#""delta":{"#);
            if thinking > 0 {
                let _ = write!(event, r#""{}":""#, self.reasoning.field.name());
                for _ in 0..thinking {
                    event.push_str("think ");
                }
                event.push('"');
            }
            if k > thinking {
                if thinking > 0 {
                    event.push(',');
                }
                event.push_str(r#""content":""#);
                for i in thinking..k {
                    if first_answer_token == Some(i) {
                        event.push_str(&self.reasoning.answer_tag);
                    } else {
                        event.push_str("tok ");
                    }
                }
                event.push('"');
            }
            event.push('}');
        } else {
            event.push_str(r#""text":""#);
            for _ in 0..k {
                event.push_str("tok ");
            }
            event.push_str(r#"","logprobs":null"#);
        }
        let _ = write!(event, r#","finish_reason":{finish}}}]"#);
        if self.ask.include_usage && self.ask.continuous_usage {
            event.push_str(r#","usage":"#);
            self.reasoning
                .write_usage(&mut event, self.ask.prompt_tokens, self.sent_tokens);
        }
        event.push_str("}\n\n");
        event
    }

    /// What follows the last chunk: the usage chunk and `[DONE]`, or the Responses API's
    /// closing events.
    fn tail(&mut self) -> String {
        let mut out = String::new();
        if self.ask.format == Format::Responses {
            self.close_item(&mut out);
            let mut usage = String::new();
            self.reasoning
                .write_usage(&mut usage, self.ask.prompt_tokens, self.sent_tokens);
            let usage = responses_usage(&usage);
            let (kind, status) = if !self.calls.is_empty() {
                ("response.completed", "completed")
            } else {
                ("response.incomplete", "incomplete")
            };
            let response = self.response_object(status, Some(&usage));
            self.responses_event(&mut out, kind, &format!(r#""response":{response}"#));
            return out;
        }
        let object = if self.ask.chat() {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        if self.ask.include_usage {
            let _ = write!(
                out,
                r#"data: {{"id":"mock","object":"{object}","model":{},"choices":[],"usage":"#,
                Value::from(self.model.as_str()),
            );
            self.reasoning
                .write_usage(&mut out, self.ask.prompt_tokens, self.sent_tokens);
            let _ = write!(
                out,
                r#","timings":{}}}"#,
                self.timing.server_timings(self.chunk.saturating_sub(1))
            );
            out.push_str("\n\n");
        }
        out.push_str("data: [DONE]\n\n");
        out
    }
}

/// A chat usage object in the Responses API's names.
fn responses_usage(chat: &str) -> String {
    let usage: Value = serde_json::from_str(chat).unwrap_or_default();
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (input, output) = (n(&usage["prompt_tokens"]), n(&usage["completion_tokens"]));
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": n(&usage["completion_tokens_details"]["reasoning_tokens"])},
        "total_tokens": input + output})
    .to_string()
}

pub(super) fn stream_response(
    model: String,
    ask: Ask,
    timing: Timing,
    reasoning: Reasoning,
    calls: Vec<MockCall>,
    permit: Option<OwnedSemaphorePermit>,
    log: Option<(MockLog, Option<u64>, (Instant, SystemTime))>,
) -> Response {
    let object = if ask.chat() {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk_prefix = format!(
        r#"data: {{"id":"mock","object":"{object}","model":{},"choices":[{{"index":0,"#,
        Value::from(model.as_str())
    );
    let state = StreamState {
        chunk_prefix,
        log,
        prelude_sent: !ask.conversational(),
        model,
        ask,
        timing,
        reasoning,
        calls,
        chunk: 0,
        sent_tokens: 0,
        finished: false,
        sequence: 0,
        item: None,
        items: 0,
        _permit: permit,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.finished {
            return None;
        }
        if !st.prelude_sent {
            st.prelude_sent = true;
            if st.ask.format == Format::Responses {
                let mut out = String::new();
                let response = st.response_object("in_progress", None);
                st.responses_event(
                    &mut out,
                    "response.created",
                    &format!(r#""response":{response}"#),
                );
                st.responses_event(
                    &mut out,
                    "response.in_progress",
                    &format!(r#""response":{response}"#),
                );
                return Some((Ok(Bytes::from(out)), st));
            }
            let v = json!({"id": "mock", "object": "chat.completion.chunk", "model": st.model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
            return Some((Ok(sse(&v)), st));
        }
        if st.sent_tokens >= st.timing.total {
            st.finished = true;
            if st.ask.format == Format::Tgi {
                // TGI ends the stream after the event that carries `details`.
                return None;
            }
            return Some((Ok(Bytes::from(st.tail())), st));
        }
        if st.timing.cut_after.is_some_and(|c| st.sent_tokens >= c) {
            // Cut when the next chunk would be due, so the chunks before it are flushed.
            tokio::time::sleep_until(st.timing.deadline(st.chunk).into()).await;
            st.finished = true;
            return Some((Err(std::io::Error::other("mock: stream cut")), st));
        }
        tokio::time::sleep_until(st.timing.deadline(st.chunk).into()).await;
        if st.chunk == 0 {
            if let Some((log, id, arrival)) = st.log.take() {
                let late = Instant::now().saturating_duration_since(st.timing.deadline(0));
                log.push(MockEvent {
                    id,
                    arrival: arrival.0,
                    arrival_wall: arrival.1,
                    first_chunk_lateness_ms: late.as_secs_f64() * 1000.0,
                });
            }
        }
        let k = st.timing.per_chunk.min(st.timing.total - st.sent_tokens);
        // Of this chunk's tokens, those before the reasoning ends are reasoning (none in a
        // tool call).
        let reasoning_left = if !st.calls.is_empty() {
            0
        } else {
            st.reasoning.tokens
        };
        let thinking = reasoning_left.saturating_sub(st.sent_tokens).min(k);
        let first_answer_token = reasoning_left.checked_sub(st.sent_tokens);
        st.sent_tokens += k;
        st.chunk += 1;
        let event = match st.ask.format {
            Format::Tgi => {
                let last = st.sent_tokens == st.timing.total;
                let text = "tok ".repeat(k as usize);
                let (generated, details) = if last {
                    (
                        Value::from("tok ".repeat(st.sent_tokens as usize)),
                        json!({"finish_reason": "length", "generated_tokens": st.sent_tokens, "seed": null}),
                    )
                } else {
                    (Value::Null, Value::Null)
                };
                let v = json!({"index": st.sent_tokens,
                    "token": {"id": 1, "text": text, "logprob": 0.0, "special": false},
                    "generated_text": generated, "details": details});
                return Some((Ok(sse(&v)), st));
            }
            Format::Responses => st.responses_chunk(k, thinking, first_answer_token),
            Format::Chat | Format::Completions => st.openai_chunk(k, thinking, first_answer_token),
        };
        Some((Ok::<Bytes, std::io::Error>(Bytes::from(event)), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            error_response(StatusCode::INTERNAL_SERVER_ERROR, "response build failed")
        })
}
