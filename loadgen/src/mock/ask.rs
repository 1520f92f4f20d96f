//! What a request asks the mock for (lengths, stream options, reasoning, tools), read from
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
    pub(super) format: Format,
    pub(super) prompt_tokens: u64,
    pub(super) max_tokens: u32,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) continuous_usage: bool,
    /// `chat_template_kwargs.enable_thinking` is not `false` (Qwen3's thinking switch).
    pub(super) thinking: bool,
    /// The first tool offered, when tools are offered and `tool_choice` is not `none`.
    pub(super) tool: Option<String>,
    /// `tool_choice: "required"`.
    pub(super) require_call: bool,
    /// Tool results in the conversation (`tool` messages, `function_call_output` items).
    pub(super) tool_results: u32,
}

impl Ask {
    pub(super) fn chat(&self) -> bool {
        self.format == Format::Chat
    }

    /// Whether the answer has reasoning and text sides (chat and responses do).
    pub(super) fn conversational(&self) -> bool {
        matches!(self.format, Format::Chat | Format::Responses)
    }
}

/// The API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Completions,
    Chat,
    Responses,
    Tgi,
}

/// Words of a message's `content`: a string, or a list of parts with `text`.
fn content_words(content: &Value) -> u64 {
    match content {
        Value::Array(parts) => parts.iter().map(|p| words(&p["text"])).sum(),
        other => words(other),
    }
}

pub(super) fn parse_ask(body: &Value, format: Format) -> Ask {
    let mut ask = Ask {
        format,
        prompt_tokens: 0,
        max_tokens: 16,
        stream: body["stream"].as_bool().unwrap_or(false),
        include_usage: body["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        continuous_usage: body["stream_options"]["continuous_usage_stats"]
            .as_bool()
            .unwrap_or(false),
        thinking: body["chat_template_kwargs"]["enable_thinking"] != false,
        tool: None,
        require_call: body["tool_choice"] == "required",
        tool_results: 0,
    };
    let max_tokens = match format {
        Format::Tgi => {
            ask.prompt_tokens = words(&body["inputs"]);
            ask.stream = true;
            ask.thinking = false;
            body["parameters"]["max_new_tokens"].as_u64().unwrap_or(20)
        }
        Format::Completions => {
            ask.prompt_tokens = match &body["prompt"] {
                Value::Array(items) if items.iter().all(Value::is_number) => items.len() as u64,
                Value::Array(items) => items.first().map_or(0, words),
                other => words(other),
            };
            body["max_tokens"].as_u64().unwrap_or(16)
        }
        Format::Chat => {
            let messages = body["messages"].as_array().map_or(&[][..], Vec::as_slice);
            ask.prompt_tokens = messages.iter().map(|m| content_words(&m["content"])).sum();
            ask.tool_results = messages.iter().filter(|m| m["role"] == "tool").count() as u32;
            ask.tool = body["tools"][0]["function"]["name"]
                .as_str()
                .map(str::to_string);
            body["max_tokens"]
                .as_u64()
                .or_else(|| body["max_completion_tokens"].as_u64())
                .unwrap_or(16)
        }
        Format::Responses => {
            let items = match &body["input"] {
                Value::Array(items) => items.clone(),
                text => vec![json!({"role": "user", "content": text})],
            };
            ask.prompt_tokens = words(&body["instructions"])
                + items
                    .iter()
                    .map(|i| content_words(&i["content"]) + words(&i["output"]))
                    .sum::<u64>();
            ask.tool_results = items
                .iter()
                .filter(|i| i["type"] == "function_call_output")
                .count() as u32;
            ask.tool = body["tools"][0]["name"].as_str().map(str::to_string);
            // Responses always report usage, at the end.
            ask.include_usage = true;
            body["max_output_tokens"].as_u64().unwrap_or(16)
        }
    };
    if body["tool_choice"] == "none" {
        ask.tool = None;
    }
    ask.max_tokens = (max_tokens as u32).max(1);
    ask
}
