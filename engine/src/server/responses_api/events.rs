//! A chat stream's payloads turned into the Responses API's events, as vLLM streams them
//! (`vllm/entrypoints/openai/responses/streaming_events.py`): `response.created` and
//! `response.in_progress`; per output item (reasoning, message, function call)
//! `response.output_item.added`, its content part, its deltas
//! (`response.reasoning_text.delta`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`), then its done events; and last
//! `response.completed`, or `response.incomplete` when the answer stopped at
//! `max_output_tokens`, or `response.failed` after an `error` event. The final event's
//! response is the whole response (what a non-streamed request gets), with usage and the
//! engine's `timings`.

use serde_json::{json, Value};

use super::request::Echo;

/// One Responses event: its type and its data (which repeats the type).
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesEvent {
    pub kind: &'static str,
    pub data: Value,
}

/// An output item being built.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Item {
    /// The item as the response lists it, with `status`.
    fn value(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text } => json!({"id": id, "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": status}),
            Item::Message { id, text } => json!({"id": id, "type": "message", "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({"id": id, "type": "function_call",
                "call_id": call_id, "name": name, "arguments": arguments, "status": status}),
        }
    }

    fn id(&self) -> &str {
        match self {
            Item::Reasoning { id, .. } | Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }
}

/// Builds one response's events from its chat payloads.
pub struct ResponseBuilder {
    id: String,
    created_at: u64,
    model: String,
    echo: Echo,
    sequence: u64,
    /// Output items so far.
    items: Vec<Item>,
    /// The open items: one reasoning or message item, or the calls whose arguments may
    /// still grow (a server may interleave parallel calls' pieces); each closes when output
    /// of another kind starts, or at the end.
    open: Vec<usize>,
    /// Chat tool-call index → its item.
    calls: Vec<(u64, usize)>,
    finish: Option<String>,
    usage: Option<Value>,
    timings: Option<Value>,
    error: Option<Value>,
    ended: bool,
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

impl ResponseBuilder {
    pub fn new(model: String, echo: Echo, created_at: u64) -> ResponseBuilder {
        ResponseBuilder {
            id: new_id("resp"),
            created_at,
            model,
            echo,
            sequence: 0,
            items: Vec::new(),
            open: Vec::new(),
            calls: Vec::new(),
            finish: None,
            usage: None,
            timings: None,
            error: None,
            ended: false,
        }
    }

    fn event(&mut self, kind: &'static str, mut data: Value) -> ResponsesEvent {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        ResponsesEvent { kind, data }
    }

    /// The response object with `status`, its items so far.
    pub fn response(&self, status: &str) -> Value {
        let item_status = if status == "in_progress" {
            "in_progress"
        } else {
            "completed"
        };
        let output: Vec<Value> = self
            .items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let last = i + 1 == self.items.len();
                item.value(if last && status == "incomplete" {
                    "incomplete"
                } else {
                    item_status
                })
            })
            .collect();
        let e = &self.echo;
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status,
            "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "error": self.error.clone().unwrap_or(Value::Null),
            "model": self.model, "output": output,
            "instructions": e.instructions, "metadata": e.metadata,
            "parallel_tool_calls": e.parallel_tool_calls, "tool_choice": e.tool_choice,
            "tools": e.tools, "temperature": e.temperature, "top_p": e.top_p,
            "max_output_tokens": e.max_output_tokens,
            "reasoning": {"effort": e.reasoning_effort, "summary": null},
            "text": {"format": e.text_format},
            "store": false, "previous_response_id": null, "truncation": "disabled",
            "usage": self.usage, "timings": self.timings,
        })
    }

    /// The opening events.
    pub fn start(&mut self) -> Vec<ResponsesEvent> {
        let response = self.response("in_progress");
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// Closes the open items, in order.
    fn close(&mut self, out: &mut Vec<ResponsesEvent>) {
        for index in std::mem::take(&mut self.open) {
            self.close_item(index, out);
        }
    }

    /// Closes item `index`.
    fn close_item(&mut self, index: usize, out: &mut Vec<ResponsesEvent>) {
        let item = self.items[index].clone();
        let last = index + 1 == self.items.len();
        let status = if last && self.finish.as_deref() == Some("length") {
            "incomplete"
        } else {
            "completed"
        };
        match &item {
            Item::Reasoning { id, text } => {
                out.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0, "text": text}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0,
                    "part": {"type": "reasoning_text", "text": text}}),
                ));
            }
            Item::Message { id, text } => {
                out.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push(self.event("response.content_part.done", json!({"item_id": id,
                    "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}})));
            }
            Item::Call {
                id,
                name,
                arguments,
                ..
            } => {
                out.push(self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id,
                    "output_index": index, "name": name, "arguments": arguments}),
                ));
            }
        }
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index,
            "item": item.value(status)}),
        ));
    }

    /// Opens `item`: after the open items close, unless both are calls.
    fn open(&mut self, item: Item, out: &mut Vec<ResponsesEvent>) {
        let calls_open = self
            .open
            .iter()
            .all(|&i| matches!(self.items[i], Item::Call { .. }));
        if !(matches!(item, Item::Call { .. }) && calls_open) {
            self.close(out);
        }
        let index = self.items.len();
        let id = item.id().to_string();
        let part = match &item {
            Item::Reasoning { .. } => Some(json!({"type": "reasoning_text", "text": ""})),
            Item::Message { .. } => {
                Some(json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
            }
            Item::Call { .. } => None,
        };
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index,
            "item": item.value("in_progress")}),
        ));
        if let Some(part) = part {
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id,
                "output_index": index, "content_index": 0, "part": part}),
            ));
        }
        self.items.push(item);
        self.open.push(index);
    }

    /// Whether the open item is a reasoning item (`reasoning`) or a message.
    fn open_is(&self, reasoning: bool) -> bool {
        matches!(
            (self.open.as_slice(), self.items.last(), reasoning),
            ([_], Some(Item::Reasoning { .. }), true) | ([_], Some(Item::Message { .. }), false)
        )
    }

    /// Reasoning or answer text.
    fn text(&mut self, text: &str, reasoning: bool, out: &mut Vec<ResponsesEvent>) {
        if text.is_empty() {
            return;
        }
        if !self.open_is(reasoning) {
            let item = if reasoning {
                Item::Reasoning {
                    id: new_id("rs"),
                    text: String::new(),
                }
            } else {
                Item::Message {
                    id: new_id("msg"),
                    text: String::new(),
                }
            };
            self.open(item, out);
        }
        let index = self.items.len() - 1;
        let Some(Item::Reasoning { id, text: all } | Item::Message { id, text: all }) =
            self.items.last_mut()
        else {
            return;
        };
        all.push_str(text);
        let id = id.clone();
        let event = if reasoning {
            self.event(
                "response.reasoning_text.delta",
                json!({"item_id": id,
                "output_index": index, "content_index": 0, "delta": text}),
            )
        } else {
            self.event(
                "response.output_text.delta",
                json!({"item_id": id,
                "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
            )
        };
        out.push(event);
    }

    /// A chat tool-call delta.
    fn call(&mut self, delta: &Value, out: &mut Vec<ResponsesEvent>) {
        let chat_index = delta["index"].as_u64().unwrap_or(0);
        let known = self
            .calls
            .iter()
            .find(|(c, _)| *c == chat_index)
            .map(|&(_, item)| item);
        let item = match known {
            Some(item) => item,
            None => {
                self.open(
                    Item::Call {
                        id: new_id("fc"),
                        call_id: delta["id"].as_str().unwrap_or_default().to_string(),
                        name: delta["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        arguments: String::new(),
                    },
                    out,
                );
                let item = self.items.len() - 1;
                self.calls.push((chat_index, item));
                item
            }
        };
        let piece = delta["function"]["arguments"].as_str().unwrap_or_default();
        if piece.is_empty() {
            return;
        }
        let Some(Item::Call { id, arguments, .. }) = self.items.get_mut(item) else {
            return;
        };
        arguments.push_str(piece);
        let id = id.clone();
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id,
            "output_index": item, "delta": piece}),
        ));
    }

    /// The events of one chat stream payload (`[DONE]` ends the response).
    pub fn push(&mut self, payload: &str) -> Vec<ResponsesEvent> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        if payload == "[DONE]" {
            return self.end();
        }
        let Ok(chunk) = serde_json::from_str::<Value>(payload) else {
            return out;
        };
        if let Some(error) = chunk.get("error") {
            self.error = Some(error.clone());
            let message = error["message"].clone();
            let code = error["code"].clone();
            let param = error["param"].clone();
            out.push(self.event(
                "error",
                json!({"message": message, "code": code, "param": param}),
            ));
            return out;
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(responses_usage(usage));
        }
        if let Some(timings) = chunk.get("timings").filter(|t| !t.is_null()) {
            self.timings = Some(timings.clone());
        }
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        let reasoning = delta["reasoning"]
            .as_str()
            .or_else(|| delta["reasoning_content"].as_str())
            .unwrap_or_default();
        self.text(reasoning, true, &mut out);
        self.text(
            delta["content"].as_str().unwrap_or_default(),
            false,
            &mut out,
        );
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.call(call, &mut out);
        }
        if let Some(finish) = choice["finish_reason"].as_str() {
            self.finish = Some(finish.to_string());
        }
        out
    }

    /// The closing events: the open item's end, then the final event.
    pub fn end(&mut self) -> Vec<ResponsesEvent> {
        let mut out = Vec::new();
        if std::mem::replace(&mut self.ended, true) {
            return out;
        }
        self.close(&mut out);
        let (kind, status) = match (&self.error, self.finish.as_deref()) {
            (Some(_), _) | (None, None) => ("response.failed", "failed"),
            (None, Some("length")) => ("response.incomplete", "incomplete"),
            (None, Some(_)) => ("response.completed", "completed"),
        };
        if self.error.is_none() && self.finish.is_none() {
            self.error = Some(
                json!({"code": "server_error", "message": "the answer ended without finishing"}),
            );
        }
        let response = self.response(status);
        out.push(self.event(kind, json!({"response": response})));
        out
    }
}

/// A chat usage object in the Responses API's names.
fn responses_usage(chat: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    json!({
        "input_tokens": n(&chat["prompt_tokens"]),
        "input_tokens_details": {"cached_tokens": n(&chat["prompt_tokens_details"]["cached_tokens"])},
        "output_tokens": n(&chat["completion_tokens"]),
        "output_tokens_details": {"reasoning_tokens": n(&chat["completion_tokens_details"]["reasoning_tokens"])},
        "total_tokens": n(&chat["total_tokens"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> Echo {
        Echo {
            instructions: None,
            tools: Vec::new(),
            tool_choice: json!("auto"),
            parallel_tool_calls: true,
            temperature: None,
            top_p: None,
            max_output_tokens: Some(8),
            metadata: serde_json::Map::new(),
            text_format: json!({"type": "text"}),
            reasoning_effort: None,
        }
    }

    fn kinds(events: &[ResponsesEvent]) -> Vec<&'static str> {
        events.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn reasoning_text_and_calls_become_items_in_order() {
        let mut b = ResponseBuilder::new("m".into(), echo(), 7);
        let mut events = b.start();
        for payload in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"Hm"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Let me check."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}},"timings":{"queue_ms":1.0}}"#,
            "[DONE]",
        ] {
            events.extend(b.push(payload));
        }
        assert_eq!(
            kinds(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .map(|e| e.data["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
        let last = &events.last().unwrap().data["response"];
        assert_eq!(last["status"], "completed");
        assert_eq!(last["output"][2]["call_id"], "call_1");
        assert_eq!(last["output"][2]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(last["output"][1]["content"][0]["text"], "Let me check.");
        assert_eq!(last["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(last["usage"]["total_tokens"], 15);
        assert_eq!(last["timings"]["queue_ms"], 1.0);
        assert_eq!(events[2].data["output_index"], 0);
        assert_eq!(events[14].data["output_index"], 2);
    }

    #[test]
    fn interleaved_parallel_calls_stay_open_until_the_end() {
        let mut b = ResponseBuilder::new("m".into(), echo(), 7);
        let mut events = Vec::new();
        for payload in [
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"f","arguments":"{\"a\""}},{"index":1,"id":"call_b","function":{"name":"g","arguments":"{\"b\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}},{"index":1,"function":{"arguments":":2}"}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ] {
            events.extend(b.push(payload));
        }
        let done: Vec<(u64, String)> = events
            .iter()
            .filter(|e| e.kind == "response.function_call_arguments.done")
            .map(|e| {
                (
                    e.data["output_index"].as_u64().unwrap(),
                    e.data["arguments"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            done,
            [(0, "{\"a\":1}".to_string()), (1, "{\"b\":2}".to_string())]
        );
        let first_done = events
            .iter()
            .position(|e| e.kind == "response.output_item.done")
            .unwrap();
        let last_delta = events
            .iter()
            .rposition(|e| e.kind == "response.function_call_arguments.delta")
            .unwrap();
        assert!(last_delta < first_done, "no piece after its call is done");
    }

    #[test]
    fn a_length_stop_is_incomplete_and_an_error_fails() {
        let mut b = ResponseBuilder::new("m".into(), echo(), 7);
        b.push(r#"{"choices":[{"index":0,"delta":{"content":"a b"},"finish_reason":"length"}]}"#);
        let end = b.push("[DONE]");
        let last = &end.last().unwrap();
        assert_eq!(last.kind, "response.incomplete");
        assert_eq!(
            last.data["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(last.data["response"]["output"][0]["status"], "incomplete");
        let mut b = ResponseBuilder::new("m".into(), echo(), 7);
        let error = b
            .push(r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#);
        assert_eq!(kinds(&error), ["error"]);
        assert_eq!(kinds(&b.push("[DONE]")), ["response.failed"]);
    }
}
