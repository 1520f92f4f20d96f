//! What the two OpenAI formats share: the streamed request's common fields and the event
//! parse (a typed borrowed parse, not a JSON tree, per event).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{CallPiece, StreamEvent};
use crate::load::workload::RequestSpec;
use crate::wire::target::Target;
use reports::records::ServerTiming;

/// `model` (the request's own, from `--model-mix`, else the run's), `max_tokens`, streaming
/// with usage, and the length-forcing extensions asked for.
pub(super) fn common_body(target: &Target, spec: &RequestSpec) -> Value {
    let mut body = json!({
        "model": spec.model.as_deref().unwrap_or(&target.model),
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
    /// The server's timing: ours and llama.cpp's.
    #[serde(default)]
    timings: Option<Value>,
    /// The server's timing: vLLM's, with `--enable-per-request-metrics`.
    #[serde(default)]
    metrics: Option<Value>,
}

/// The server's timing of a request from a response's `timings` (ours: `queue_ms`,
/// `prefill_ms`, `decode_ms`; llama.cpp: `prompt_ms`, `predicted_ms`, no queue) or vLLM's
/// `metrics` (`queue_time_ms`, `time_to_first_token_ms` from first scheduled,
/// `generation_time_ms`); `None` when neither has the numbers (vLLM's fields are `null`
/// without their data).
pub(super) fn server_timing(
    timings: Option<&Value>,
    metrics: Option<&Value>,
) -> Option<ServerTiming> {
    let number = |v: &Value, key: &str| v.get(key).and_then(Value::as_f64);
    if let Some(t) = timings {
        let prefill = number(t, "prefill_ms").or_else(|| number(t, "prompt_ms"));
        let decode = number(t, "decode_ms").or_else(|| number(t, "predicted_ms"));
        if let (Some(prefill_ms), Some(decode_ms)) = (prefill, decode) {
            return Some(ServerTiming {
                queue_ms: number(t, "queue_ms"),
                prefill_ms,
                decode_ms,
            });
        }
    }
    let m = metrics?;
    Some(ServerTiming {
        queue_ms: number(m, "queue_time_ms"),
        prefill_ms: number(m, "time_to_first_token_ms")?,
        decode_ms: number(m, "generation_time_ms")?,
    })
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionTokensDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
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

/// A chat delta. Reasoning comes as `reasoning` (vLLM since it renamed the field) or
/// `reasoning_content` (SGLang, llama.cpp, DeepSeek's API, older vLLM); a server in between
/// sends both with the same text, which counts once.
#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<CallDelta<'a>>>,
}

/// One piece of a streamed chat tool call: the first of a call usually carries its `id` and
/// name (vLLM, llama.cpp), later ones more of its arguments; a server may send it whole.
#[derive(Deserialize)]
struct CallDelta<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// One OpenAI stream event; `chat` reads the choice's `delta` instead of its `text`.
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
    let choice = event.choices.into_iter().next();
    let mut parsed = StreamEvent {
        has_choice: choice.is_some(),
        finished: choice.as_ref().is_some_and(|c| c.finish_reason.is_some()),
        server_timing: server_timing(event.timings.as_ref(), event.metrics.as_ref()),
        ..StreamEvent::default()
    };
    if let Some(usage) = event.usage {
        parsed.prompt_tokens = usage.prompt_tokens;
        parsed.completion_tokens = usage.completion_tokens;
        parsed.reasoning_tokens = usage
            .completion_tokens_details
            .and_then(|d| d.reasoning_tokens);
        parsed.cached_tokens = usage.prompt_tokens_details.and_then(|d| d.cached_tokens);
    }
    match choice {
        Some(Choice {
            delta: Some(delta), ..
        }) if chat => {
            parsed.text = delta.content;
            parsed.reasoning = delta.reasoning.or(delta.reasoning_content);
            parsed.tool_calls = delta
                .tool_calls
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(k, call)| {
                    let function = call.function;
                    let (name, arguments) =
                        function.map_or((None, None), |f| (f.name, f.arguments));
                    CallPiece {
                        index: call.index.unwrap_or(k as u32),
                        id: call.id,
                        name,
                        arguments,
                        whole: false,
                    }
                })
                .collect();
        }
        Some(choice) if !chat => parsed.text = choice.text,
        _ => {}
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_in_either_field_counts_once() {
        let vllm = event(
            r#"{"choices":[{"index":0,"delta":{"reasoning":"Let me"},"finish_reason":null}]}"#,
            true,
        )
        .unwrap();
        assert_eq!(vllm.reasoning.as_deref(), Some("Let me"));
        assert_eq!(vllm.text, None);
        let sglang = event(
            r#"{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Let me"}}]}"#,
            true,
        )
        .unwrap();
        assert_eq!(sglang.reasoning.as_deref(), Some("Let me"));
        assert_eq!(sglang.text, None);
        let both = event(
            r#"{"choices":[{"delta":{"reasoning":"x","reasoning_content":"x"}}]}"#,
            true,
        )
        .unwrap();
        assert_eq!(both.reasoning.as_deref(), Some("x"));
        let answer = event(r#"{"choices":[{"delta":{"content":"Paris"}}],"usage":{"prompt_tokens":3,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":7}}}"#, true).unwrap();
        assert_eq!(answer.text.as_deref(), Some("Paris"));
        assert_eq!(
            (answer.completion_tokens, answer.reasoning_tokens),
            (Some(9), Some(7))
        );
        let call = event(r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"a\""}}]}}]}"#, true).unwrap();
        assert!(call.text.is_none());
        assert_eq!(
            call.tool_calls,
            [CallPiece {
                index: 1,
                arguments: Some("{\"a\"".into()),
                ..CallPiece::default()
            }]
        );
        let start = event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}"#, true).unwrap();
        assert_eq!(
            start.tool_calls,
            [CallPiece {
                index: 0,
                id: Some("call_1".into()),
                name: Some("f".into()),
                arguments: Some("".into()),
                whole: false,
            }]
        );
        let none = event(r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#, true).unwrap();
        assert!(none.tool_calls.is_empty());
        // A completions choice has no delta: its reasoning, if any, is in the text.
        let text = event(
            r#"{"choices":[{"text":"a","finish_reason":"length"}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(text.text.as_deref(), Some("a"));
        assert!(text.finished);
    }
}
