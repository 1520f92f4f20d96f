//! OpenAI `POST /v1/responses`, as current vLLM and OpenAI stream it: typed events
//! (`event:` and `data:` lines, the data's `type` says which), no `[DONE]`; the stream ends
//! with `response.completed`, or `response.incomplete` when the answer stopped at
//! `max_output_tokens`, whose `response.usage` has the counts. Text arrives in
//! `response.output_text.delta`, reasoning in `response.reasoning_text.delta`, a function call
//! as `response.output_item.added` (its name) then `response.function_call_arguments.delta`s.
//! A conversation is sent as input items: messages, `function_call` and
//! `function_call_output`; a leading system message as `instructions`.

use std::borrow::Cow;

use anyhow::{bail, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{one_message_body, openai, Api, CallPiece, Conversation, Message, StreamEvent};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::RequestSpec;
use crate::wire::target::Target;

pub(super) struct Responses;

impl Api for Responses {
    fn path(&self) -> &'static str {
        "/v1/responses"
    }

    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value> {
        one_message_body(self, target, spec, prompts)
    }

    fn conversation_body(
        &self,
        target: &Target,
        spec: &RequestSpec,
        conversation: Conversation<'_>,
    ) -> Result<Value> {
        if target.prompt_ids {
            bail!("--prompt-ids needs the completions backend");
        }
        if target.min_tokens {
            bail!("--min-tokens: the Responses API has no `min_tokens` (vLLM's request takes `ignore_eos` only)");
        }
        // `store: false`: OpenAI keeps a response by default, a benchmark's need not be kept.
        let mut body = json!({
            "model": spec.model.as_deref().unwrap_or(&target.model),
            "max_output_tokens": spec.output_len,
            "stream": true,
            "store": false,
        });
        // vLLM's `ResponsesRequest` takes `ignore_eos`, as its chat request does.
        if target.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        let mut messages = conversation.messages;
        if let Some((Message::System(text), rest)) = messages.split_first() {
            body["instructions"] = json!(text);
            messages = rest;
        }
        body["input"] = messages.iter().flat_map(items).collect();
        if !conversation.tools.is_empty() {
            body["tools"] = conversation
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "name": t.name, "description": t.description,
                        "parameters": t.parameters})
                })
                .collect();
            body["tool_choice"] = json!(if conversation.require_call {
                "required"
            } else {
                "auto"
            });
        }
        Ok(body)
    }

    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String> {
        event(data)
    }
}

/// The input items of one message.
fn items(m: &Message) -> Vec<Value> {
    match m {
        Message::System(text) => {
            vec![json!({"type": "message", "role": "system", "content": text})]
        }
        Message::User(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        Message::Assistant { text, calls } => {
            let mut out = Vec::with_capacity(calls.len() + 1);
            if !text.is_empty() || calls.is_empty() {
                out.push(json!({"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}));
            }
            out.extend(calls.iter().map(|c| {
                json!({"type": "function_call", "call_id": c.id, "name": c.name,
                    "arguments": c.arguments})
            }));
            out
        }
        Message::ToolResult { call_id, output } => {
            vec![json!({"type": "function_call_output", "call_id": call_id, "output": output})]
        }
    }
}

/// The fields of the events read (each event has a few of them).
#[derive(Deserialize)]
struct Event<'a> {
    /// Absent on a bare error object.
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
    #[serde(default)]
    output_index: Option<u32>,
    #[serde(default, borrow)]
    item: Option<Item<'a>>,
    #[serde(default)]
    response: Option<FinalResponse>,
    /// An `error` event's message.
    #[serde(default)]
    message: Option<String>,
    /// An error object sent as the data (vLLM's streamed generation error).
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    call_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// The response object of the final event: its usage, error and our engine's timings.
#[derive(Deserialize)]
struct FinalResponse {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    timings: Option<Value>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// One Responses stream event.
fn event(data: &str) -> Result<StreamEvent<'_>, String> {
    // Some gateways end the stream with chat's `[DONE]` after the final event.
    if data.trim() == "[DONE]" {
        return Ok(StreamEvent {
            done: true,
            ..StreamEvent::default()
        });
    }
    let event: Event = serde_json::from_str(data).map_err(|e| e.to_string())?;
    let mut parsed = StreamEvent::default();
    if let Some(error) = event.error.filter(|e| !e.is_null()) {
        parsed.error = Some(error.to_string());
        return Ok(parsed);
    }
    let index = event.output_index.unwrap_or(0);
    let kind = event.kind.as_deref().unwrap_or_default();
    match kind {
        "response.output_text.delta" => {
            parsed.has_choice = true;
            parsed.text = Some(event.delta.unwrap_or_default());
        }
        "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
            parsed.has_choice = true;
            parsed.reasoning = Some(event.delta.unwrap_or_default());
        }
        "response.output_item.added" | "response.output_item.done" => {
            let Some(item) = event
                .item
                .filter(|i| i.kind.as_deref() == Some("function_call"))
            else {
                return Ok(parsed);
            };
            // The call's name opens it (output); its whole arguments at `done` replace the
            // pieces, for a server that sent none, and are no new output.
            let done = kind == "response.output_item.done";
            parsed.has_choice = !done;
            parsed.tool_calls.push(CallPiece {
                index,
                id: item.call_id,
                name: item.name,
                arguments: item.arguments.filter(|a| done || !a.is_empty()),
                whole: done,
            });
        }
        "response.function_call_arguments.delta" => {
            parsed.has_choice = true;
            parsed.tool_calls.push(CallPiece {
                index,
                arguments: event.delta,
                ..CallPiece::default()
            });
        }
        "response.completed" | "response.incomplete" => {
            parsed.done = true;
            parsed.finished = true;
            if let Some(response) = event.response {
                if let Some(usage) = response.usage {
                    parsed.prompt_tokens = usage.input_tokens;
                    parsed.completion_tokens = usage.output_tokens;
                    parsed.cached_tokens = usage.input_tokens_details.and_then(|d| d.cached_tokens);
                    parsed.reasoning_tokens =
                        usage.output_tokens_details.and_then(|d| d.reasoning_tokens);
                }
                parsed.server_timing = openai::server_timing(response.timings.as_ref(), None);
            }
        }
        "response.failed" => {
            let why = event
                .response
                .and_then(|r| r.error)
                .map_or_else(|| "response.failed".to_string(), |e| e.to_string());
            parsed.error = Some(why);
        }
        "error" => {
            parsed.error = Some(event.message.unwrap_or_else(|| data.to_string()));
        }
        _ => {}
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_reasoning_calls_and_the_end_are_read() {
        let text = event(r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"Hi","logprobs":[],"sequence_number":5}"#).unwrap();
        assert_eq!(text.text.as_deref(), Some("Hi"));
        let thinking = event(r#"{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"Hm","sequence_number":3}"#).unwrap();
        assert_eq!(thinking.reasoning.as_deref(), Some("Hm"));
        // Events that carry no output: the stream's opening, an item's parts and ends.
        for quiet in [
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","usage":null}}"#,
            r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","content":[],"status":"in_progress"},"sequence_number":2}"#,
            r#"{"type":"response.output_text.done","item_id":"msg_1","output_index":0,"content_index":0,"text":"Hi","logprobs":[],"sequence_number":9}"#,
        ] {
            let e = event(quiet).unwrap();
            assert!(
                e.text.is_none() && e.tool_calls.is_empty() && !e.has_choice && !e.done,
                "{quiet}"
            );
        }
        let open = event(r#"{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","id":"fc_1","call_id":"call_9","name":"f","arguments":"","status":"in_progress"},"sequence_number":7}"#).unwrap();
        assert_eq!(
            open.tool_calls,
            [CallPiece {
                index: 2,
                id: Some("call_9".into()),
                name: Some("f".into()),
                arguments: None,
                whole: false,
            }]
        );
        assert!(open.has_choice);
        let piece = event(r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":2,"delta":"{\"a\"","sequence_number":8}"#).unwrap();
        assert_eq!(piece.tool_calls[0].arguments.as_deref(), Some("{\"a\""));
        let done = event(r#"{"type":"response.output_item.done","output_index":2,"item":{"type":"function_call","id":"fc_1","call_id":"call_9","name":"f","arguments":"{\"a\":1}","status":"completed"},"sequence_number":9}"#).unwrap();
        assert!(done.tool_calls[0].whole && !done.has_choice);
        let end = event(r#"{"type":"response.incomplete","sequence_number":12,"response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":12}}}"#).unwrap();
        assert!(end.done && end.finished);
        assert_eq!(
            (
                end.prompt_tokens,
                end.completion_tokens,
                end.cached_tokens,
                end.reasoning_tokens
            ),
            (Some(7), Some(5), Some(4), Some(2))
        );
        assert!(event("[DONE]").unwrap().done);
        let failed = event(r#"{"type":"error","message":"boom","sequence_number":3}"#).unwrap();
        assert_eq!(failed.error.as_deref(), Some("boom"));
        let vllm =
            event(r#"{"error":{"message":"bad","type":"BadRequestError","code":400}}"#).unwrap();
        assert!(vllm.error.unwrap().contains("bad"));
    }
}
