//! The mock's routes: `/v1/completions`, `/v1/chat/completions`, `/v1/responses`, TGI's
//! `/generate_stream`, `/v1/models`, `/version` and `/metrics`, each request read into what
//! it asks for.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::Rng;
use serde_json::{json, Value};

use super::*;

use super::ask::{error_response, parse_ask, Format};
use super::streaming::{stream_response, usage, MockCall, Reasoning, Timing, CALL_TOKENS};
use super::transport::ConnectionArrivals;

pub(super) async fn version() -> Json<Value> {
    Json(json!({"version": format!("loadgen-mock {}", env!("CARGO_PKG_VERSION"))}))
}

/// `GET /metrics`: the requests received so far, and the running and waiting gauges under
/// vLLM's names (as the scraper reads them from a real server), in Prometheus text.
pub(super) async fn metrics(State(s): State<Arc<MockState>>) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut text = format!(
        "# TYPE loadgen_mock_requests_total counter\nloadgen_mock_requests_total {}\n",
        s.received.load(Relaxed)
    );
    let model = &s.cfg.model;
    if let Some(sem) = &s.slots {
        let running = s.cfg.slots - sem.available_permits();
        let _ = writeln!(
            text,
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{model}\"}} {running}"
        );
    }
    let _ = writeln!(
        text,
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"{model}\"}} {}",
        s.waiting.load(Relaxed)
    );
    text
}

/// Counts one request as waiting for a slot while it lives (a dropped request stops waiting).
struct Waiting(Arc<std::sync::atomic::AtomicU64>);

impl Waiting {
    fn start(count: &Arc<std::sync::atomic::AtomicU64>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Waiting(count.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

pub(super) async fn models(State(s): State<Arc<MockState>>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": s.cfg.model, "object": "model", "owned_by": "loadgen"}]}),
    )
}

pub(super) async fn completions(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Completions).await
}

pub(super) async fn chat_completions(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Chat).await
}

pub(super) async fn responses(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Responses).await
}

pub(super) async fn generate_stream(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Tgi).await
}

fn request_id(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(crate::wire::client::REQUEST_ID_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

async fn serve(
    s: Arc<MockState>,
    conn: &ConnectionArrivals,
    id: Option<u64>,
    body: Bytes,
    format: Format,
) -> Response {
    // The request's last bytes were the newest its connection had when the handler ran.
    let now = (Instant::now(), SystemTime::now());
    let arrived = conn.0.latest().map_or(now.0, |at| at.min(now.0));
    let arrival = (arrived, now.1 - (now.0 - arrived));
    s.received
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error_response(StatusCode::BAD_REQUEST, "request body is not JSON");
    };
    if let Some(bodies) = &s.cfg.bodies {
        if let Ok(mut bodies) = bodies.lock() {
            bodies.push((id, body.clone()));
        }
    }
    let ask = parse_ask(&body, format);
    let fail = s.cfg.error_rate > 0.0
        && s.rng
            .lock()
            .map(|mut r| r.random::<f64>() < s.cfg.error_rate)
            .unwrap_or(false);
    if fail {
        let status =
            StatusCode::from_u16(s.cfg.error_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error_response(status, "injected failure");
    }
    // Timing starts at the request's arrival, or when it got a slot after waiting for one.
    let (permit, start) = match &s.slots {
        Some(sem) => match sem.clone().try_acquire_owned() {
            Ok(p) => (Some(p), arrival.0),
            Err(_) => {
                let waiting = Waiting::start(&s.waiting);
                let acquired = sem.clone().acquire_owned().await;
                drop(waiting);
                match acquired {
                    Ok(p) => (Some(p), Instant::now()),
                    Err(_) => {
                        return error_response(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                    }
                }
            }
        },
        None => (None, arrival.0),
    };
    // A request that offers tools gets `calls_per_answer` calls while its conversation holds
    // fewer results than `tool_turns` (always, when it requires one), one token per chunk.
    let due = ask.tool.is_some() && (ask.require_call || ask.tool_results < s.cfg.tool_turns);
    let calls: Vec<MockCall> = match (&ask.tool, due) {
        (Some(name), true) => (0..s.cfg.calls_per_answer.max(1))
            .map(|c| MockCall {
                id: format!("call_{}_{}_{c}", id.unwrap_or(0), ask.tool_results),
                name: name.clone(),
                arguments: s.cfg.tool_arguments.clone().unwrap_or_else(|| {
                    format!(
                        r#"{{"query": "r{} t{} c{c}"}}"#,
                        id.unwrap_or(0),
                        ask.tool_results
                    )
                }),
            })
            .collect(),
        _ => Vec::new(),
    };
    let plan = Timing {
        arrival: arrival.0,
        start,
        ttft: s.cfg.ttft.mul_f64(s.cfg.ttft_factor.max(0.0)),
        itl: s.cfg.itl,
        per_chunk: if calls.is_empty() {
            s.cfg.tokens_per_chunk.max(1)
        } else {
            1
        },
        total: if calls.is_empty() {
            ask.max_tokens
        } else {
            ask.max_tokens.min(CALL_TOKENS * calls.len() as u32)
        },
        cut_after: s.cfg.cut_after,
    };
    if ask.stream {
        let log = s.cfg.log.clone().map(|log| (log, id, arrival));
        let reasoning = Reasoning {
            tokens: if ask.conversational() && ask.thinking && calls.is_empty() {
                s.cfg.reasoning_tokens
            } else {
                0
            },
            field: s.cfg.reasoning_field,
            usage: s.cfg.reasoning_usage,
            answer_tag: format!("r{} ", id.unwrap_or(0)),
        };
        stream_response(
            s.cfg.model.clone(),
            ask,
            plan,
            reasoning,
            calls,
            permit,
            log,
        )
    } else {
        let chunks = plan.total.div_ceil(plan.per_chunk);
        tokio::time::sleep_until(plan.deadline(chunks - 1).into()).await;
        drop(permit);
        let text = "tok ".repeat(plan.total as usize);
        if ask.format == Format::Responses {
            let output: Vec<Value> = if calls.is_empty() {
                vec![
                    json!({"id": "msg_0", "type": "message", "role": "assistant",
                    "status": "incomplete",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}),
                ]
            } else {
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        json!({"id": format!("fc_{i}"),
                    "type": "function_call", "call_id": c.id, "name": c.name,
                    "arguments": c.arguments, "status": "completed"})
                    })
                    .collect()
            };
            let (input, out) = (ask.prompt_tokens, u64::from(plan.total));
            return Json(json!({
                "id": "resp_mock", "object": "response", "created_at": 0, "model": s.cfg.model,
                "status": if calls.is_empty() { "incomplete" } else { "completed" },
                "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": input + out},
                "timings": plan.server_timings(chunks - 1),
            }))
            .into_response();
        }
        let choice = if ask.chat() && !calls.is_empty() {
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            json!({"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": tool_calls},
                "finish_reason": "tool_calls"})
        } else if ask.chat() {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": text, "finish_reason": "length"})
        };
        Json(json!({
            "id": "mock", "object": if ask.chat() { "chat.completion" } else { "text_completion" },
            "model": s.cfg.model, "choices": [choice],
            "usage": usage(ask.prompt_tokens, u64::from(plan.total)),
            "timings": plan.server_timings(chunks - 1),
        }))
        .into_response()
    }
}
