//! What a request asks the mock for (lengths, stream options, reasoning, faults), read from
//! its body on each API; and the mock's error response.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub(super) fn error_response(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "mock_error", "param": null, "code": status.as_u16()}});
    let mut resp = (status, Json(body)).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    resp
}

pub(super) fn words(v: &Value) -> u64 {
    v.as_str()
        .map_or(0, |s| s.split_whitespace().count() as u64)
}

/// The parts of a request the mock honours.
pub(super) struct Ask {
    pub(super) chat: bool,
    /// TGI's native stream: one event per chunk with `token`, no `[DONE]`.
    pub(super) tgi: bool,
    pub(super) prompt_tokens: u64,
    pub(super) max_tokens: u32,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) continuous_usage: bool,
    /// `chat_template_kwargs.enable_thinking` is not `false` (Qwen3's thinking switch).
    pub(super) thinking: bool,
}

/// The API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Completions,
    Chat,
    Tgi,
}

pub(super) fn parse_ask(body: &Value, format: Format) -> Ask {
    if format == Format::Tgi {
        let max_tokens = body["parameters"]["max_new_tokens"].as_u64().unwrap_or(20) as u32;
        return Ask {
            chat: false,
            tgi: true,
            prompt_tokens: words(&body["inputs"]),
            max_tokens: max_tokens.max(1),
            stream: true,
            include_usage: false,
            continuous_usage: false,
            thinking: false,
        };
    }
    let chat = format == Format::Chat;
    let prompt_tokens = if chat {
        body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().map(|msg| words(&msg["content"])).sum())
    } else {
        match &body["prompt"] {
            Value::Array(items) if items.iter().all(Value::is_number) => items.len() as u64,
            Value::Array(items) => items.first().map_or(0, words),
            other => words(other),
        }
    };
    let max_tokens = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
        .unwrap_or(16) as u32;
    Ask {
        chat,
        tgi: false,
        prompt_tokens,
        max_tokens: max_tokens.max(1),
        stream: body["stream"].as_bool().unwrap_or(false),
        include_usage: body["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        continuous_usage: body["stream_options"]["continuous_usage_stats"]
            .as_bool()
            .unwrap_or(false),
        thinking: body["chat_template_kwargs"]["enable_thinking"] != false,
    }
}
