//! A mock answer streamed on its timing: the chunks' deadlines, reasoning before content,
//! usage, and the injected faults.

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use super::ask::{error_response, Ask};
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
    chunk: u32,
    sent_tokens: u32,
    prelude_sent: bool,
    finished: bool,
    _permit: Option<OwnedSemaphorePermit>,
    /// A content event's text up to its choice's fields.
    chunk_prefix: String,
    /// Where to log the first chunk's lateness: the log, the request id, its arrival.
    log: Option<(MockLog, Option<u64>, (Instant, SystemTime))>,
}

pub(super) fn stream_response(
    model: String,
    ask: Ask,
    timing: Timing,
    reasoning: Reasoning,
    permit: Option<OwnedSemaphorePermit>,
    log: Option<(MockLog, Option<u64>, (Instant, SystemTime))>,
) -> Response {
    let object = if ask.chat {
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
        prelude_sent: !ask.chat,
        model,
        ask,
        timing,
        reasoning,
        chunk: 0,
        sent_tokens: 0,
        finished: false,
        _permit: permit,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.finished {
            return None;
        }
        let object = if st.ask.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        if !st.prelude_sent {
            st.prelude_sent = true;
            let v = json!({"id": "mock", "object": object, "model": st.model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
            return Some((Ok(sse(&v)), st));
        }
        if st.sent_tokens >= st.timing.total {
            st.finished = true;
            if st.ask.tgi {
                // TGI ends the stream after the event that carries `details`.
                return None;
            }
            let mut out = String::new();
            if st.ask.include_usage {
                let _ = write!(
                    out,
                    r#"data: {{"id":"mock","object":"{object}","model":{},"choices":[],"usage":"#,
                    Value::from(st.model.as_str()),
                );
                st.reasoning
                    .write_usage(&mut out, st.ask.prompt_tokens, st.sent_tokens);
                let _ = write!(
                    out,
                    r#","timings":{}}}"#,
                    st.timing.server_timings(st.chunk.saturating_sub(1))
                );
                out.push_str("\n\n");
            }
            out.push_str("data: [DONE]\n\n");
            return Some((Ok(Bytes::from(out)), st));
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
        // Of this chunk's tokens, those before the reasoning ends are reasoning.
        let thinking = st.reasoning.tokens.saturating_sub(st.sent_tokens).min(k);
        let first_answer_token = st.reasoning.tokens.checked_sub(st.sent_tokens);
        st.sent_tokens += k;
        st.chunk += 1;
        if st.ask.tgi {
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
        // Written from a template rather than a JSON tree: at thousands of events per second
        // the mock's own CPU time is what a calibration must keep small.
        let finish = if st.sent_tokens == st.timing.total {
            r#""length""#
        } else {
            "null"
        };
        let mut event = String::with_capacity(st.chunk_prefix.len() + 160);
        event.push_str(&st.chunk_prefix);
        if st.ask.chat {
            event.push_str(r#""delta":{"#);
            if thinking > 0 {
                let _ = write!(event, r#""{}":""#, st.reasoning.field.name());
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
                        event.push_str(&st.reasoning.answer_tag);
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
        if st.ask.include_usage && st.ask.continuous_usage {
            event.push_str(r#","usage":"#);
            st.reasoning
                .write_usage(&mut event, st.ask.prompt_tokens, st.sent_tokens);
        }
        event.push_str("}\n\n");
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
