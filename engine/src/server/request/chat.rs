//! `/v1/chat/completions`: the messages checked, then rendered, constrained and read by the
//! model's chat format.

use serde_json::{json, Map, Value};

use super::constraints::{request_constraint, with_tool_choice, Constraint};
use super::fields::{ChatFields, MessageBody};
use super::sampling::{check_unsupported_values, sampling_params};
use super::{
    check_model, choices, count, encode, read_generation_body, read_streaming, room_after,
    GenerateRequest, ModelInfo, RequestFields, Streaming,
};
use crate::sampler::SamplingParams;
use crate::server::error::ApiError;
use crate::server::formats::{ChatFormat, Conversation, Reading, ReasoningSplit};
use crate::server::tools;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Validates a `/v1/chat/completions` body.
pub fn chat_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<GenerateRequest, ApiError> {
    let (shared, own, constraint_fields) = read_generation_body::<ChatFields>(body)?;
    for (given, field, successor) in [
        (&own.functions, "functions", "tools"),
        (&own.function_call, "function_call", "tool_choice"),
    ] {
        if given.is_some() {
            return Err(ApiError::invalid(
                field,
                format!(
                    "`{field}` is OpenAI's deprecated form of `{successor}`: use `{successor}`"
                ),
            ));
        }
    }
    check_unsupported_values(&shared)?;
    let model = check_model(shared.model.clone(), info)?;
    let mut params = sampling_params(&shared)?;
    let want_logprobs = own.logprobs.unwrap_or(false);
    if own.top_logprobs.is_some() && !want_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        ));
    }
    params.logprobs = want_logprobs.then(|| count(own.top_logprobs));
    let streaming = read_streaming(shared.stream, shared.stream_options.as_ref())?;
    let n = choices(shared.n)?;
    let messages = chat_messages(own.messages)?;
    let tools = tools::parse_tools(
        own.tools.as_ref(),
        own.tool_choice.as_ref(),
        own.parallel_tool_calls,
    )?;
    let format = &info.format;
    let constraint = request_constraint(&constraint_fields)?;
    let reading = format.reading(tools.as_ref())?;
    let conversation = |add_generation_prompt| Conversation {
        messages: &messages,
        tools: tools.as_ref(),
        template_kwargs: own.chat_template_kwargs.as_ref(),
        reasoning_effort: own.reasoning_effort.as_deref(),
        add_generation_prompt,
    };
    let text = format.render(conversation(true), tokenizer)?;
    let prompt = encode(tokenizer, &text, "messages", false)?;
    if info.checkpoints_history {
        // A hint: a conversation whose history alone does not render takes none.
        params.history_tokens =
            history_tokens(format.as_ref(), conversation(false), tokenizer, &prompt).ok();
    }
    if format.reads_markers() {
        if shared.skip_special_tokens == Some(false) {
            return Err(ApiError::invalid(
                "skip_special_tokens",
                format!(
                    "this model answers in {}, whose markers the server reads out of the \
                     answer: `skip_special_tokens: false` has no markers to keep",
                    format.name()
                ),
            ));
        }
        params.skip_special_tokens = false;
    }
    let mut constraint = constraint
        .map(|c| {
            let spec = format
                .answer_grammar(c.spec)
                .map_err(|message| ApiError::invalid(&c.param, message))?;
            Ok::<_, ApiError>(Constraint { spec, ..c })
        })
        .transpose()?;
    if let Some(spec) = tools.as_ref().and_then(|t| format.tool_grammar(t)) {
        constraint = Some(with_tool_choice(spec, constraint.as_ref())?);
    }
    params.split_reasoning = matches!(format.reasoning_split(), ReasoningSplit::ThinkMarkers(_));
    Ok(chat_job(
        model,
        vec![prompt],
        params,
        (n, streaming),
        constraint,
        reading,
        (own.max_completion_tokens, shared.max_tokens),
        info,
    ))
}

/// The leading tokens of `prompt` that the conversation renders to without its generation
/// prompt: what the next turn, re-sending this history, shares with it (a template may
/// render the generation prompt otherwise than an answer in the history, as Qwen3.5's
/// `<think>` block, so the prompt's own end is not shared).
fn history_tokens(
    format: &dyn ChatFormat,
    history: Conversation<'_>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
) -> Result<usize, ApiError> {
    let text = format.render(history, tokenizer)?;
    let tokens = encode(tokenizer, &text, "messages", false)?;
    Ok(tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count())
}

/// A chat request's job: `max_tokens` from OpenAI's newer name or the old one (without
/// either, the answer may fill the context).
#[allow(clippy::too_many_arguments)]
fn chat_job(
    model: String,
    prompts: Vec<Vec<u32>>,
    mut params: SamplingParams,
    (n, streaming): (usize, Streaming),
    constraint: Option<Constraint>,
    reading: Option<Reading>,
    (max_completion_tokens, max_tokens): (Option<u64>, Option<u64>),
    info: &ModelInfo,
) -> GenerateRequest {
    let (max_tokens_field, max_tokens) = match (max_completion_tokens, max_tokens) {
        (Some(n), _) => ("max_completion_tokens", count(Some(n))),
        (None, Some(n)) => ("max_tokens", count(Some(n))),
        (None, None) => ("max_tokens", room_after(&prompts, info)),
    };
    params.max_tokens = max_tokens;
    GenerateRequest {
        model,
        prompts,
        params,
        n,
        streaming,
        constraint,
        reading,
        fields: RequestFields {
            max_tokens: max_tokens_field,
            ..RequestFields::CHAT
        },
    }
}

/// `messages`, checked message by message.
pub fn chat_messages(messages: Option<Vec<MessageBody>>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match messages {
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(items) if items.is_empty() => {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ))
        }
        Some(items) => items,
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, m)| chat_message(m, &format!("messages[{i}]")))
        .collect()
}

/// One message at `path` (`messages[2]`).
fn chat_message(m: MessageBody, path: &str) -> Result<ChatMessage, ApiError> {
    if m.function_call.is_some() {
        let param = format!("{path}.function_call");
        return Err(ApiError::invalid(
            &param,
            format!("`{param}` is OpenAI's deprecated form of `{path}.tool_calls`: use `{path}.tool_calls`"),
        ));
    }
    let role_param = format!("{path}.role");
    let role = m
        .role
        .ok_or_else(|| ApiError::invalid(&role_param, "every message needs a `role`"))?;
    if !["system", "developer", "user", "assistant", "tool"].contains(&role.as_str()) {
        return Err(ApiError::invalid(
            &role_param,
            format!("unknown role `{role}`"),
        ));
    }
    let content_param = format!("{path}.content");
    let content = match m.content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => text_parts(&parts, &content_param)?,
        Some(_) => {
            return Err(ApiError::wrong_type(
                &content_param,
                "a string or a list of text parts",
            ))
        }
    };
    let reasoning_content = match (m.reasoning_content, m.reasoning) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                &format!("{path}.reasoning"),
                "`reasoning` and `reasoning_content` are the same field under two names; \
                 they differ here",
            ))
        }
        (a, b) => a.or(b),
    };
    if reasoning_content.is_some() && role != "assistant" {
        return Err(ApiError::invalid(
            &format!("{path}.reasoning_content"),
            "only an assistant message carries reasoning",
        ));
    }
    let calls_param = format!("{path}.tool_calls");
    let tool_calls = match m.tool_calls {
        None => None,
        Some(_) if role != "assistant" => {
            return Err(ApiError::invalid(
                &calls_param,
                "only an assistant message carries tool calls",
            ))
        }
        Some(calls) => Some(message_tool_calls(&calls, &calls_param)?),
    };
    if m.tool_call_id.is_some() && role != "tool" {
        return Err(ApiError::invalid(
            &format!("{path}.tool_call_id"),
            "only a `tool` message answers a tool call",
        ));
    }
    Ok(ChatMessage {
        role,
        content,
        reasoning_content,
        tool_calls,
        tool_call_id: m.tool_call_id,
    })
}

/// Concatenates `[{"type": "text", "text": ...}, ...]`.
fn text_parts(parts: &[Value], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for part in parts {
        match (
            part.get("type").and_then(Value::as_str),
            part.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => {
                return Err(ApiError::invalid(
                    param,
                    "only `{\"type\": \"text\", \"text\": ...}` content parts are supported",
                ))
            }
        }
    }
    Ok(text)
}

/// An assistant message's `tool_calls`, checked, with `arguments` parsed into JSON (as
/// templates read them).
fn message_tool_calls(value: &Value, path: &str) -> Result<Vec<Value>, ApiError> {
    let Value::Array(calls) = value else {
        return Err(ApiError::wrong_type(path, "a list of tool calls"));
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let at = format!("{path}[{j}]");
            let function = call
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    ApiError::invalid(&at, format!("`{at}` needs a `function` object"))
                })?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(&format!("{at}.function.name"), "a tool call needs a `name`")
                })?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    ApiError::invalid(
                        &format!("{at}.function.arguments"),
                        format!("`{at}.function.arguments` is not valid JSON: {e}"),
                    )
                })?,
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => {
                    return Err(ApiError::wrong_type(
                        &format!("{at}.function.arguments"),
                        "a JSON string",
                    ))
                }
            };
            let mut out = json!({
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            });
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                out["id"] = json!(id);
            }
            Ok(out)
        })
        .collect()
}
