//! What the two OpenAI formats share: the streamed request's common fields and the event
//! parse (a typed borrowed parse, not a JSON tree, per event).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::StreamEvent;
use crate::client::Target;
use crate::workload::RequestSpec;

/// `model`, `max_tokens`, streaming with usage, and the length-forcing extensions asked for.
pub(super) fn common_body(target: &Target, spec: &RequestSpec) -> Value {
    let mut body = json!({
        "model": target.model,
        "max_tokens": spec.output_len,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if target.continuous_usage {
        body["stream_options"]["continuous_usage_stats"] = json!(true);
    }
    if target.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if target.min_tokens {
        body["min_tokens"] = json!(spec.output_len);
    }
    body
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    finish_reason: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
}

/// One OpenAI stream event; `chat` reads `delta.content` (or `reasoning_content`) instead of
/// `text`.
pub(super) fn event(data: &str, chat: bool) -> Result<StreamEvent<'_>, String> {
    if data.trim() == "[DONE]" {
        return Ok(StreamEvent {
            done: true,
            ..StreamEvent::default()
        });
    }
    let event: Event = serde_json::from_str(data).map_err(|e| e.to_string())?;
    if event.error.is_some() {
        let detail = serde_json::from_str::<Value>(data)
            .map(|v| v["error"].to_string())
            .unwrap_or_default();
        return Ok(StreamEvent {
            error: Some(detail),
            ..StreamEvent::default()
        });
    }
    let mut choices = event.choices.into_iter();
    let choice = choices.next();
    let finished = choice.as_ref().is_some_and(|c| c.finish_reason.is_some());
    let has_choice = choice.is_some();
    let text = choice.and_then(|c| {
        if chat {
            c.delta.and_then(|d| d.content.or(d.reasoning_content))
        } else {
            c.text
        }
    });
    Ok(StreamEvent {
        done: false,
        error: None,
        text,
        has_choice,
        finished,
        prompt_tokens: event.usage.as_ref().and_then(|u| u.prompt_tokens),
        completion_tokens: event.usage.as_ref().and_then(|u| u.completion_tokens),
    })
}
