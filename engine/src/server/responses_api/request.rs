//! A `/v1/responses` body read into the chat request it is served as: `instructions` as the
//! system message, `input` items as chat messages (a `function_call` joins the assistant
//! message before it as one of its `tool_calls`, a `function_call_output` is a `tool`
//! message, a `reasoning` item the next assistant message's reasoning), flat function tools
//! nested as chat's, `max_output_tokens` as `max_tokens`, `reasoning.effort` as
//! `reasoning_effort`, `text.format` as `response_format`. The chat request is then
//! validated as any other, and its errors name the Responses fields they came from.

use serde_json::{json, Map, Value};

use crate::server::error::ApiError;
use crate::server::request::body::Body;
use crate::server::request::fields::ResponsesBody;

/// What the response echoes of its request.
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    /// The tools as the request sent them (flat).
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<u64>,
    pub metadata: Map<String, Value>,
    pub text_format: Value,
    pub reasoning_effort: Option<String>,
}

/// A Responses request as the chat request that serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The chat body: always streamed with usage; the route answers in the request's way.
    pub chat_body: Value,
    pub stream: bool,
    pub echo: Echo,
}

/// Reads a `/v1/responses` body.
pub fn read(bytes: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let mut body = Body::parse(bytes)?;
    let fields: ResponsesBody = body.read()?;
    body.finish()?;
    if fields.store == Some(true) {
        return Err(ApiError::invalid(
            "store",
            "this server keeps no responses (it is stateless): send `store: false` or leave it out",
        ));
    }
    if fields.previous_response_id.is_some() {
        return Err(ApiError::invalid(
            "previous_response_id",
            "this server keeps no responses (it is stateless): send the whole conversation in `input`",
        ));
    }
    let input = fields
        .input
        .ok_or_else(|| ApiError::invalid("input", "`input` is required"))?;
    let mut messages = Vec::new();
    if let Some(instructions) = &fields.instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match input {
        Value::String(text) => messages.push(json!({"role": "user", "content": text})),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                add_item(&mut messages, item, i)?;
            }
        }
        _ => {
            return Err(ApiError::wrong_type(
                "input",
                "a string or a list of input items",
            ))
        }
    }
    let mut chat = json!({
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let set = |chat: &mut Value, key: &str, value: Option<Value>| {
        if let Some(v) = value {
            chat[key] = v;
        }
    };
    set(&mut chat, "model", fields.model.clone().map(Value::from));
    set(
        &mut chat,
        "max_tokens",
        fields.max_output_tokens.map(Value::from),
    );
    set(
        &mut chat,
        "temperature",
        fields.temperature.map(Value::from),
    );
    set(&mut chat, "top_p", fields.top_p.map(Value::from));
    set(
        &mut chat,
        "parallel_tool_calls",
        fields.parallel_tool_calls.map(Value::from),
    );
    set(&mut chat, "ignore_eos", fields.ignore_eos.map(Value::from));
    set(&mut chat, "seed", fields.seed.map(Value::Number));
    set(&mut chat, "top_k", fields.top_k.map(Value::from));
    set(&mut chat, "min_p", fields.min_p.map(Value::from));
    set(&mut chat, "stop", fields.stop);
    set(
        &mut chat,
        "chat_template_kwargs",
        fields.chat_template_kwargs.map(Value::Object),
    );
    let tools = fields.tools.unwrap_or_default();
    if !tools.is_empty() {
        chat["tools"] = tools
            .iter()
            .enumerate()
            .map(|(i, t)| chat_tool(t, i))
            .collect::<Result<Vec<_>, _>>()?
            .into();
    }
    let tool_choice = fields.tool_choice.unwrap_or(Value::Null);
    if !tool_choice.is_null() {
        chat["tool_choice"] = chat_tool_choice(&tool_choice)?;
    }
    let mut reasoning_effort = None;
    if let Some(reasoning) = fields.reasoning {
        if reasoning.summary.is_some() {
            return Err(ApiError::invalid(
                "reasoning.summary",
                "this server streams the reasoning itself (`reasoning_text`), not a summary: leave `reasoning.summary` out",
            ));
        }
        if let Some(effort) = reasoning.effort {
            chat["reasoning_effort"] = json!(effort);
            reasoning_effort = Some(effort);
        }
    }
    let mut text_format = json!({"type": "text"});
    if let Some(format) = fields.text.and_then(|t| t.format) {
        if let Some(response_format) = chat_response_format(&format)? {
            chat["response_format"] = response_format;
        }
        text_format = format;
    }
    // As vLLM echoes it: `auto` with tools, `none` without.
    let echoed_choice = match (tool_choice.is_null(), tools.is_empty()) {
        (false, _) => tool_choice,
        (true, false) => json!("auto"),
        (true, true) => json!("none"),
    };
    Ok(ResponsesRequest {
        chat_body: chat,
        stream: fields.stream.unwrap_or(false),
        echo: Echo {
            instructions: fields.instructions,
            tools,
            tool_choice: echoed_choice,
            parallel_tool_calls: fields.parallel_tool_calls.unwrap_or(true),
            temperature: fields.temperature,
            top_p: fields.top_p,
            max_output_tokens: fields.max_output_tokens,
            metadata: fields.metadata.unwrap_or_default(),
            text_format,
            reasoning_effort,
        },
    })
}

/// The Responses field a chat request's error `param` came from.
pub fn responses_param(chat_param: &str) -> String {
    let renamed = [
        ("messages", "input"),
        ("max_tokens", "max_output_tokens"),
        ("reasoning_effort", "reasoning.effort"),
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
    ];
    for (chat, responses) in renamed {
        if chat_param == chat
            || chat_param.starts_with(&format!("{chat}."))
            || chat_param.starts_with(&format!("{chat}["))
        {
            // Chat messages are not the input items one for one: name the whole input.
            return if chat == "messages" {
                responses.to_string()
            } else {
                format!("{responses}{}", &chat_param[chat.len()..])
            };
        }
    }
    // `tools[0].function.name` was `tools[0].name`.
    if let Some(rest) = chat_param.strip_prefix("tools[") {
        if let Some((index, field)) = rest.split_once("].function") {
            return format!("tools[{index}]{field}");
        }
    }
    chat_param.to_string()
}

/// The keys `item` may have beyond `type`; another is refused, naming it.
fn check_keys(item: &Map<String, Value>, allowed: &[&str], path: &str) -> Result<(), ApiError> {
    match item
        .iter()
        .find(|(k, v)| k.as_str() != "type" && !allowed.contains(&k.as_str()) && !v.is_null())
    {
        Some((key, _)) => Err(ApiError::invalid(
            &format!("{path}.{key}"),
            format!("Unrecognized request argument supplied: {path}.{key}"),
        )),
        None => Ok(()),
    }
}

/// A string field of an item, required.
fn string_field<'a>(
    item: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a str, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::wrong_type(&format!("{path}.{key}"), "a string"))
}

/// The text of a message's `content`: a string, or text parts (`input_text`, `output_text`).
fn content_text(content: &Value, path: &str) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let part_path = format!("{path}[{j}]");
                let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
                if !matches!(kind, "input_text" | "output_text" | "text") {
                    return Err(ApiError::invalid(
                        &format!("{part_path}.type"),
                        format!("content part `{kind}`: this server takes text parts only (`input_text`, `output_text`)"),
                    ));
                }
                let obj = part.as_object().map_or_else(Map::new, Clone::clone);
                check_keys(&obj, &["text", "annotations", "logprobs"], &part_path)?;
                text.push_str(string_field(&obj, "text", &part_path)?);
            }
            Ok(text)
        }
        _ => Err(ApiError::wrong_type(
            path,
            "a string or a list of text parts",
        )),
    }
}

/// The last message, when it is an assistant message (a call or reasoning joins it).
fn open_assistant(messages: &mut Vec<Value>) -> &mut Value {
    if messages.last().is_none_or(|m| m["role"] != "assistant") {
        messages.push(json!({"role": "assistant", "content": null}));
    }
    let last = messages.len() - 1;
    &mut messages[last]
}

/// Adds input item `i` to the chat messages.
fn add_item(messages: &mut Vec<Value>, item: &Value, i: usize) -> Result<(), ApiError> {
    let path = format!("input[{i}]");
    let obj = item
        .as_object()
        .ok_or_else(|| ApiError::wrong_type(&path, "an input item (an object)"))?;
    let kind = match obj.get("type") {
        None | Some(Value::Null) => "message",
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(ApiError::wrong_type(&format!("{path}.type"), "a string")),
    };
    match kind {
        "message" => {
            check_keys(obj, &["role", "content", "id", "status"], &path)?;
            let role = string_field(obj, "role", &path)?;
            if !["user", "system", "developer", "assistant"].contains(&role) {
                return Err(ApiError::invalid(
                    &format!("{path}.role"),
                    format!("role `{role}`: a message is from `user`, `system`, `developer` or `assistant`"),
                ));
            }
            let text = content_text(obj.get("content").unwrap_or(&Value::Null), &format!("{path}.content"))?;
            if role == "assistant" {
                // After reasoning of its own, the message is that turn's answer.
                let open = messages
                    .last()
                    .is_some_and(|m| m["role"] == "assistant" && m["content"].is_null() && m.get("tool_calls").is_none());
                if open {
                    open_assistant(messages)["content"] = json!(text);
                    return Ok(());
                }
            }
            messages.push(json!({"role": role, "content": text}));
        }
        "function_call" => {
            check_keys(obj, &["call_id", "name", "arguments", "id", "status"], &path)?;
            let call = json!({"id": string_field(obj, "call_id", &path)?, "type": "function",
                "function": {"name": string_field(obj, "name", &path)?,
                             "arguments": string_field(obj, "arguments", &path)?}});
            let message = open_assistant(messages);
            match message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                Some(calls) => calls.push(call),
                None => message["tool_calls"] = json!([call]),
            }
        }
        "function_call_output" => {
            check_keys(obj, &["call_id", "output", "id", "status"], &path)?;
            let output = content_text(obj.get("output").unwrap_or(&Value::Null), &format!("{path}.output"))?;
            messages.push(json!({"role": "tool", "tool_call_id": string_field(obj, "call_id", &path)?,
                "content": output}));
        }
        "reasoning" => {
            check_keys(obj, &["content", "summary", "id", "status"], &path)?;
            // Its summary is what OpenAI's models send instead of the text: none here.
            if obj
                .get("summary")
                .is_some_and(|s| !s.is_null() && s.as_array().is_none_or(|a| !a.is_empty()))
            {
                return Err(ApiError::invalid(
                    &format!("{path}.summary"),
                    "a reasoning item's summary is not read here: send its text as `content` \
                     (`reasoning_text` parts) and an empty `summary`",
                ));
            }
            let mut text = String::new();
            let parts = match obj.get("content") {
                None | Some(Value::Null) => &[][..],
                Some(Value::Array(parts)) => parts.as_slice(),
                Some(_) => {
                    return Err(ApiError::wrong_type(
                        &format!("{path}.content"),
                        "a list of reasoning_text parts",
                    ))
                }
            };
            for (j, part) in parts.iter().enumerate() {
                let part_path = format!("{path}.content[{j}]");
                let empty = Map::new();
                let part_obj = part.as_object().unwrap_or(&empty);
                if part_obj.get("type").and_then(Value::as_str) != Some("reasoning_text") {
                    return Err(ApiError::invalid(
                        &format!("{part_path}.type"),
                        "a reasoning item's content is `reasoning_text` parts",
                    ));
                }
                check_keys(part_obj, &["text"], &part_path)?;
                text.push_str(string_field(part_obj, "text", &part_path)?);
            }
            messages.push(json!({"role": "assistant", "content": null, "reasoning_content": text}));
        }
        other => {
            return Err(ApiError::invalid(
                &format!("{path}.type"),
                format!("input item `{other}`: this server takes `message`, `function_call`, `function_call_output` and `reasoning` items"),
            ))
        }
    }
    Ok(())
}

/// A flat Responses function tool as chat's nested one.
fn chat_tool(tool: &Value, i: usize) -> Result<Value, ApiError> {
    let path = format!("tools[{i}]");
    let obj = tool
        .as_object()
        .ok_or_else(|| ApiError::wrong_type(&path, "a tool (an object)"))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                &format!("{path}.type"),
                format!(
                "`{other}` is a hosted tool, which this server does not run: only `function` tools"
            ),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                &format!("{path}.type"),
                "a tool needs `type: \"function\"`",
            ))
        }
    }
    let function: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| k.as_str() != "type")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(json!({"type": "function", "function": function}))
}

/// A Responses `tool_choice` as chat's.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(obj) if obj.get("type") == Some(&json!("function")) => {
            check_keys(obj, &["name"], "tool_choice")?;
            Ok(json!({"type": "function", "function": {"name": string_field(obj, "name", "tool_choice")?}}))
        }
        _ => Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` is `none`, `auto`, `required` or `{\"type\": \"function\", \"name\": ...}` here",
        )),
    }
}

/// A Responses `text.format` as chat's `response_format` (`None` for plain text).
fn chat_response_format(format: &Value) -> Result<Option<Value>, ApiError> {
    let obj = format
        .as_object()
        .ok_or_else(|| ApiError::wrong_type("text.format", "an object"))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => {
            check_keys(obj, &[], "text.format")?;
            Ok(None)
        }
        Some("json_object") => {
            check_keys(obj, &[], "text.format")?;
            Ok(Some(json!({"type": "json_object"})))
        }
        Some("json_schema") => {
            check_keys(
                obj,
                &["name", "schema", "strict", "description"],
                "text.format",
            )?;
            let schema: Map<String, Value> = obj
                .iter()
                .filter(|(k, _)| k.as_str() != "type")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(ApiError::invalid(
            "text.format.type",
            "`text.format.type` is `text`, `json_object` or `json_schema`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(body: Value) -> Result<ResponsesRequest, ApiError> {
        read(body.to_string().as_bytes())
    }

    #[test]
    fn items_become_chat_messages() {
        let request = read_json(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 20,
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it up."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{\"tz\":\"CET\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "12:00"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        }))
        .unwrap();
        let chat = &request.chat_body;
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "reasoning_content": "Look it up.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":\"CET\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
                {"role": "assistant", "content": "Sunny."},
            ])
        );
        assert_eq!(chat["max_tokens"], 20);
        assert_eq!(chat["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["response_format"]["json_schema"]["name"], "w");
        assert_eq!(chat["stream_options"]["include_usage"], true);
        assert!(!request.stream);
        let plain = read_json(json!({"input": "hi"})).unwrap();
        assert_eq!(
            plain.chat_body["messages"],
            json!([{"role": "user", "content": "hi"}])
        );
    }

    #[test]
    fn what_is_not_served_is_refused_by_field() {
        for (body, param) in [
            (json!({"input": "hi", "store": true}), "store"),
            (
                json!({"input": "hi", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (json!({"input": "hi", "background": true}), "background"),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "input[0].type",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0].type",
            ),
            (
                json!({"input": [{"role": "user", "content": "x", "colour": 1}]}),
                "input[0].colour",
            ),
            (
                json!({"input": "hi", "reasoning": {"summary": "auto"}}),
                "reasoning.summary",
            ),
            (
                json!({"input": "hi", "text": {"format": {"type": "xml"}}}),
                "text.format.type",
            ),
            (json!({}), "input"),
        ] {
            let e = read_json(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        assert!(read_json(json!({"input": "hi", "store": false})).is_ok());
    }

    #[test]
    fn chat_errors_name_the_responses_fields() {
        assert_eq!(responses_param("max_tokens"), "max_output_tokens");
        assert_eq!(responses_param("messages[3].content"), "input");
        assert_eq!(
            responses_param("tools[1].function.parameters"),
            "tools[1].parameters"
        );
        assert_eq!(responses_param("reasoning_effort"), "reasoning.effort");
        assert_eq!(
            responses_param("response_format.json_schema.schema"),
            "text.format.schema"
        );
        assert_eq!(responses_param("temperature"), "temperature");
    }
}
