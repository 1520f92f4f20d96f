//! Turns a raw request body into a checked generation job, or an `ApiError` naming the field.

use serde_json::{Map, Value};

use super::constraints::{request_constraint, Constraint, CONSTRAINT_FIELDS};
use super::protocol::ApiError;
use super::tools::{self, CallFormat, ToolCallParser};
use crate::sampler::{SamplingParams, MAX_LOGPROBS};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Most choices (`n`) one request may ask for.
const MAX_N: i64 = 128;
/// Most prompts in one completions request.
const MAX_PROMPTS: usize = 1024;
/// Most stop strings, and the longest one, in bytes.
const MAX_STOP_STRINGS: usize = 16;
const MAX_STOP_LEN: usize = 256;
/// Request fields accepted at the top level of either endpoint that change nothing in the
/// answer here (listed in the README). Any field neither honoured nor listed is a 400 that
/// names it, as OpenAI's API answers an unrecognised argument.
pub const NO_EFFECT_FIELDS: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
];

/// Fields honoured by both endpoints.
const SHARED_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "logit_bias",
    "response_format",
];
/// Fields honoured by `/v1/completions` besides [`SHARED_FIELDS`].
const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo", "suffix"];
/// Fields honoured by `/v1/chat/completions` besides [`SHARED_FIELDS`].
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];
/// OpenAI's deprecated function-calling fields and what replaced them: refused, naming it.
const REPLACED_FIELDS: &[(&str, &str)] =
    &[("functions", "tools"), ("function_call", "tool_choice")];
/// Fields of a message: `name` changes nothing here; `reasoning_content` (or `reasoning`) of
/// an earlier assistant turn reaches the template, as Qwen3's reads it; `tool_calls` of an
/// assistant turn and `tool_call_id` of a tool result too.
const MESSAGE_FIELDS: &[&str] = &[
    "role",
    "content",
    "name",
    "reasoning_content",
    "reasoning",
    "tool_calls",
    "tool_call_id",
];
const REPLACED_MESSAGE_FIELDS: &[(&str, &str)] = &[("function_call", "tool_calls")];
/// Fields of `stream_options`; `include_obfuscation` (OpenAI's padding) changes nothing.
const STREAM_OPTION_FIELDS: &[&str] = &[
    "include_usage",
    "continuous_usage_stats",
    "include_obfuscation",
];

/// Fails on the first field of `obj` (`path` is where it sits, e.g. `messages[2].`) that is
/// neither honoured (`known`) nor without effect (`no_effect`); a `replaced` field names its
/// successor. A field set to `null` counts as absent.
fn check_fields(
    obj: &Map<String, Value>,
    path: &str,
    known: &[&[&str]],
    replaced: &[(&str, &str)],
    no_effect: &[&str],
) -> Result<(), ApiError> {
    for (key, value) in obj {
        if value.is_null() || known.iter().any(|k| k.contains(&key.as_str())) {
            continue;
        }
        let param = format!("{path}{key}");
        if let Some((_, successor)) = replaced.iter().find(|(old, _)| old == key) {
            return Err(ApiError::invalid(
                &param,
                format!("`{param}` is OpenAI's deprecated form of `{path}{successor}`: use `{path}{successor}`"),
            ));
        }
        if !no_effect.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                &param,
                format!("Unrecognized request argument supplied: {param}"),
            ));
        }
    }
    Ok(())
}

/// `best_of` other than 1 and a non-empty `logit_bias` would change the answer: refused.
fn check_unsupported_values(fields: &Fields) -> Result<(), ApiError> {
    if fields.int("best_of", 1, i64::MAX)?.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` other than 1 is not supported",
        ));
    }
    match fields.get("logit_bias") {
        None => Ok(()),
        Some(Value::Object(bias)) if bias.is_empty() => Ok(()),
        Some(Value::Object(_)) => Err(ApiError::invalid(
            "logit_bias",
            "`logit_bias` is not supported",
        )),
        Some(_) => Err(ApiError::wrong_type("logit_bias", "an object")),
    }
}

/// What validation needs to know about the served model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Names accepted in `model`; the first is reported in responses.
    pub served_names: Vec<String>,
    pub vocab_size: usize,
    pub max_model_len: usize,
    /// `--default-chat-template-kwargs`: template variables of every chat request, which a
    /// request's own `chat_template_kwargs` override key by key.
    pub default_chat_template_kwargs: Map<String, Value>,
    /// The server splits chat answers into reasoning and answer (`--reasoning-parser`).
    pub split_reasoning: bool,
    /// How `tool_choice: "auto"` reads the model's calls (`--tool-call-parser`).
    pub tool_call_parser: Option<ToolCallParser>,
    /// The chat template renders `tools` itself (else the Hermes prompt carries them):
    /// decided once, when the template is loaded.
    pub template_reads_tools: bool,
}

/// A checked request: its prompts as token ids and how to sample them.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The model name echoed in responses.
    pub model: String,
    pub prompts: Vec<Vec<u32>>,
    /// Parameters shared by every choice (choice `i > 0` gets `seed + i`).
    pub params: SamplingParams,
    /// Choices per prompt.
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage`: a final chunk with the totals.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`: usage on every chunk.
    pub continuous_usage: bool,
    /// The grammar every answer follows (structured output, or the tool choice's).
    pub constraint: Option<Constraint>,
    /// How answers are read as tool calls (chat requests with tools).
    pub tool_calls: Option<CallFormat>,
}

impl GenerateRequest {
    /// One `(prompt, params)` per choice, in choice-index order (`prompt_index * n + i`).
    pub fn sequences(&self) -> Vec<(Vec<u32>, SamplingParams)> {
        let mut out = Vec::with_capacity(self.prompts.len() * self.n);
        for prompt in &self.prompts {
            for i in 0..self.n {
                let mut params = self.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
                out.push((prompt.clone(), params));
            }
        }
        out
    }
}

/// Typed access to the fields of a JSON object; `null` counts as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| ApiError::wrong_type(key, "a boolean")),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| ApiError::wrong_type(key, "a string")),
        }
    }

    /// An integer within `min..=max`.
    fn int(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = match (v.as_i64(), v.as_u64()) {
            (Some(n), _) => n,
            (None, Some(_)) => i64::MAX,
            _ => return Err(ApiError::wrong_type(key, "an integer")),
        };
        if n < min || n > max {
            return Err(ApiError::invalid(
                key,
                format!("`{key}` must be between {min} and {max}, got {v}"),
            ));
        }
        Ok(Some(n))
    }

    /// A finite number within `min..=max`.
    fn float(&self, key: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let x = v
            .as_f64()
            .ok_or_else(|| ApiError::wrong_type(key, "a number"))?;
        if !(min..=max).contains(&x) {
            return Err(ApiError::invalid(
                key,
                format!("`{key}` must be between {min} and {max}, got {v}"),
            ));
        }
        Ok(Some(x as f32))
    }

    /// A seed: any integer, negative ones wrap to `u64`.
    fn seed(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match (v.as_u64(), v.as_i64()) {
                (Some(n), _) => Ok(Some(n)),
                (None, Some(n)) => Ok(Some(n as u64)),
                _ => Err(ApiError::wrong_type(key, "an integer")),
            },
        }
    }
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("The request body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::malformed(
            "The request body must be a JSON object.",
        )),
    }
}

/// The `model` field: absent means the served model, an unknown name is a 404.
fn check_model(fields: &Fields, info: &ModelInfo) -> Result<String, ApiError> {
    match fields.str("model")? {
        None => Ok(info.served_names[0].clone()),
        Some(name) if info.served_names.iter().any(|n| n == name) => Ok(name.to_string()),
        Some(name) => Err(ApiError::model_not_found(name)),
    }
}

/// `stop`: a string or a list of strings.
fn stop_strings(fields: &Fields) -> Result<Vec<String>, ApiError> {
    let list = match fields.get("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::wrong_type("stop", "a string or a list of strings"))?,
        Some(_) => {
            return Err(ApiError::wrong_type(
                "stop",
                "a string or a list of strings",
            ))
        }
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings are allowed"),
        ));
    }
    if list.iter().any(|s| s.is_empty() || s.len() > MAX_STOP_LEN) {
        return Err(ApiError::invalid(
            "stop",
            format!("stop strings must be 1 to {MAX_STOP_LEN} bytes long"),
        ));
    }
    Ok(list)
}

fn token_id(v: &Value, vocab_size: usize, param: &str) -> Result<u32, ApiError> {
    let id = v
        .as_u64()
        .ok_or_else(|| ApiError::wrong_type(param, "a list of non-negative integer token ids"))?;
    if id >= vocab_size as u64 {
        return Err(ApiError::invalid(
            param,
            format!("token id {id} is out of the vocabulary (size {vocab_size})"),
        ));
    }
    Ok(id as u32)
}

fn token_ids(items: &[Value], vocab_size: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be empty"),
        ));
    }
    items
        .iter()
        .map(|v| token_id(v, vocab_size, param))
        .collect()
}

fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    param: &str,
    add_special: bool,
) -> Result<Vec<u32>, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be empty"),
        ));
    }
    let ids = tokenizer
        .encode(text, add_special)
        .map_err(|e| ApiError::invalid(param, format!("cannot tokenize `{param}`: {e:#}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` encodes to no tokens"),
        ));
    }
    Ok(ids)
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
fn completion_prompts(
    fields: &Fields,
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<Vec<Vec<u32>>, ApiError> {
    const EXPECTED: &str =
        "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let prompts = match fields.get("prompt") {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(text)) => vec![encode(tokenizer, text, "prompt", true)?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("prompt", "`prompt` must not be empty"))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|v| match v {
                    Value::String(text) => encode(tokenizer, text, "prompt", true),
                    _ => Err(ApiError::wrong_type("prompt", EXPECTED)),
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![token_ids(items, info.vocab_size, "prompt")?],
            Value::Array(_) => items
                .iter()
                .map(|v| match v {
                    Value::Array(ids) => token_ids(ids, info.vocab_size, "prompt"),
                    _ => Err(ApiError::wrong_type("prompt", EXPECTED)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(ApiError::wrong_type("prompt", EXPECTED)),
        },
        Some(_) => return Err(ApiError::wrong_type("prompt", EXPECTED)),
    };
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    Ok(prompts)
}

/// `messages`, checked field by field.
fn chat_messages(fields: &Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match fields.get("messages") {
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ))
        }
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::wrong_type(
                "messages",
                "a list of message objects",
            ))
        }
    };
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(obj) = item else {
            return Err(ApiError::wrong_type(&format!("messages[{i}]"), "an object"));
        };
        check_fields(
            obj,
            &format!("messages[{i}]."),
            &[MESSAGE_FIELDS],
            REPLACED_MESSAGE_FIELDS,
            &[],
        )?;
        let msg = Fields(obj);
        let role_param = format!("messages[{i}].role");
        let role = match msg.get("role") {
            Some(Value::String(r)) => r.clone(),
            Some(_) => return Err(ApiError::wrong_type(&role_param, "a string")),
            None => {
                return Err(ApiError::invalid(
                    &role_param,
                    "every message needs a `role`",
                ))
            }
        };
        if !["system", "developer", "user", "assistant", "tool"].contains(&role.as_str()) {
            return Err(ApiError::invalid(
                &role_param,
                format!("unknown role `{role}`"),
            ));
        }
        let content_param = format!("messages[{i}].content");
        let content = match msg.get("content") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(parts, &content_param)?,
            Some(_) => {
                return Err(ApiError::wrong_type(
                    &content_param,
                    "a string or a list of text parts",
                ))
            }
        };
        let reasoning_content = match (msg.str("reasoning_content"), msg.str("reasoning")) {
            (Err(e), _) | (_, Err(e)) => return Err(prefixed(e, &format!("messages[{i}]."))),
            (Ok(Some(a)), Ok(Some(b))) if a != b => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].reasoning"),
                    "`reasoning` and `reasoning_content` are the same field under two names; \
                     they differ here",
                ))
            }
            (Ok(a), Ok(b)) => a.or(b).map(str::to_string),
        };
        if reasoning_content.is_some() && role != "assistant" {
            return Err(ApiError::invalid(
                &format!("messages[{i}].reasoning_content"),
                "only an assistant message carries reasoning",
            ));
        }
        let tool_calls = match msg.get("tool_calls") {
            None => None,
            Some(_) if role != "assistant" => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].tool_calls"),
                    "only an assistant message carries tool calls",
                ))
            }
            Some(calls) => Some(tools::message_tool_calls(
                calls,
                &format!("messages[{i}].tool_calls"),
            )?),
        };
        let tool_call_id = match msg.get("tool_call_id") {
            None => None,
            Some(_) if role != "tool" => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].tool_call_id"),
                    "only a `tool` message answers a tool call",
                ))
            }
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => {
                return Err(ApiError::wrong_type(
                    &format!("messages[{i}].tool_call_id"),
                    "a string",
                ))
            }
        };
        messages.push(ChatMessage {
            role,
            content,
            reasoning_content,
            tool_calls,
            tool_call_id,
        });
    }
    Ok(messages)
}

/// `e` with its parameter placed under `path` (e.g. `messages[2].`).
fn prefixed(mut e: ApiError, path: &str) -> ApiError {
    if let Some(param) = e.param.take() {
        e.message = e
            .message
            .replace(&format!("`{param}`"), &format!("`{path}{param}`"));
        e.param = Some(format!("{path}{param}"));
    }
    e
}

/// Template variables the server sets itself, which `chat_template_kwargs` may not replace.
pub const SERVER_TEMPLATE_VARIABLES: [&str; 4] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// The template variables of a chat request: the server's defaults, overridden key by key
/// by the request's `chat_template_kwargs`.
fn template_kwargs(fields: &Fields, info: &ModelInfo) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = info.default_chat_template_kwargs.clone();
    match fields.get("chat_template_kwargs") {
        None => {}
        Some(Value::Object(own)) => {
            if let Some(key) = SERVER_TEMPLATE_VARIABLES
                .iter()
                .find(|k| own.contains_key(**k))
            {
                return Err(ApiError::invalid(
                    &format!("chat_template_kwargs.{key}"),
                    format!("`{key}` is set by the server, not by chat_template_kwargs"),
                ));
            }
            kwargs.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Some(_) => return Err(ApiError::wrong_type("chat_template_kwargs", "an object")),
    }
    Ok(kwargs)
}

/// `messages` rendered with the chat template and tokenized.
fn render_chat(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    kwargs: &Map<String, Value>,
    add_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let text = tokenizer
        .apply_chat_template(messages, add_generation_prompt, kwargs)
        .map_err(|e| {
            ApiError::invalid("messages", format!("cannot apply the chat template: {e:#}"))
        })?;
    encode(tokenizer, &text, "messages", add_special)
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

/// Sampling fields shared by both endpoints (everything but `max_tokens` and logprobs).
fn sampling_params(fields: &Fields, vocab_size: usize) -> Result<SamplingParams, ApiError> {
    let mut p = SamplingParams::default();
    if let Some(t) = fields.float("temperature", 0.0, 100.0)? {
        p.temperature = t;
    }
    if let Some(v) = fields.float("top_p", 0.0, 1.0)? {
        if v <= 0.0 {
            return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
        }
        p.top_p = v;
    }
    if let Some(k) = fields.int("top_k", -1, vocab_size as i64)? {
        p.top_k = k.max(0) as usize;
    }
    if let Some(v) = fields.float("min_p", 0.0, 1.0)? {
        p.min_p = v;
    }
    if let Some(v) = fields.float("presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = v;
    }
    if let Some(v) = fields.float("frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = v;
    }
    if let Some(v) = fields.float("repetition_penalty", 0.0, 10.0)? {
        if v <= 0.0 {
            return Err(ApiError::invalid(
                "repetition_penalty",
                "`repetition_penalty` must be > 0",
            ));
        }
        p.repetition_penalty = v;
    }
    p.seed = fields.seed("seed")?;
    p.stop = stop_strings(fields)?;
    if let Some(v) = fields.get("stop_token_ids") {
        let Value::Array(items) = v else {
            return Err(ApiError::wrong_type(
                "stop_token_ids",
                "a list of token ids",
            ));
        };
        p.stop_token_ids = items
            .iter()
            .map(|v| token_id(v, vocab_size, "stop_token_ids"))
            .collect::<Result<_, _>>()?;
    }
    p.ignore_eos = fields.bool("ignore_eos")?.unwrap_or(false);
    p.skip_special_tokens = fields.bool("skip_special_tokens")?.unwrap_or(true);
    Ok(p)
}

/// Stream flags; `stream_options` only with `stream: true`.
fn stream_options(fields: &Fields) -> Result<(bool, bool, bool), ApiError> {
    let stream = fields.bool("stream")?.unwrap_or(false);
    let Some(options) = fields.get("stream_options") else {
        return Ok((stream, false, false));
    };
    let Value::Object(obj) = options else {
        return Err(ApiError::wrong_type("stream_options", "an object"));
    };
    if !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    check_fields(obj, "stream_options.", &[STREAM_OPTION_FIELDS], &[], &[])?;
    let opts = Fields(obj);
    let include_usage = opts
        .bool("include_usage")
        .map_err(|_| ApiError::wrong_type("stream_options.include_usage", "a boolean"))?
        .unwrap_or(false);
    let continuous = opts
        .bool("continuous_usage_stats")
        .map_err(|_| ApiError::wrong_type("stream_options.continuous_usage_stats", "a boolean"))?
        .unwrap_or(false);
    Ok((stream, include_usage, continuous))
}

/// `max_tokens` against the context window; `default_rest` fills the context when absent (chat).
fn max_tokens(
    fields: &Fields,
    keys: &[&str],
    prompts: &[Vec<u32>],
    prompt_param: &str,
    info: &ModelInfo,
    default_rest: bool,
) -> Result<usize, ApiError> {
    let limit = info.max_model_len;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest >= limit {
        return Err(ApiError::context_length(
            prompt_param,
            format!("This model's maximum context length is {limit} tokens, but the prompt has {longest} tokens."),
        ));
    }
    let mut requested = None;
    for key in keys {
        if let Some(v) = fields.int(key, 1, i64::MAX)? {
            requested = Some((*key, v as usize));
            break;
        }
    }
    match requested {
        Some((key, n)) if longest.saturating_add(n) > limit => Err(ApiError::context_length(
            key,
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({longest} in the prompt, {n} in the completion).",
                longest.saturating_add(n)
            ),
        )),
        Some((_, n)) => Ok(n),
        None if default_rest => Ok(limit - longest),
        None => Ok(16.min(limit - longest)),
    }
}

/// Validates a `/v1/completions` body.
pub fn completion_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<GenerateRequest, ApiError> {
    let map = parse_object(body)?;
    check_fields(
        &map,
        "",
        &[SHARED_FIELDS, COMPLETION_FIELDS, CONSTRAINT_FIELDS],
        &[],
        NO_EFFECT_FIELDS,
    )?;
    let fields = Fields(&map);
    check_unsupported_values(&fields)?;
    let model = check_model(&fields, info)?;
    if fields.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::invalid("echo", "`echo: true` is not supported"));
    }
    if fields.get("suffix").is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    let mut params = sampling_params(&fields, info.vocab_size)?;
    params.logprobs = fields
        .int("logprobs", 0, MAX_LOGPROBS as i64)?
        .map(|k| k as usize);
    let (stream, include_usage, continuous_usage) = stream_options(&fields)?;
    let n = fields.int("n", 1, MAX_N)?.unwrap_or(1) as usize;
    let prompts = completion_prompts(&fields, info, tokenizer)?;
    params.max_tokens = max_tokens(&fields, &["max_tokens"], &prompts, "prompt", info, false)?;
    params.min_tokens = min_tokens(&fields, params.max_tokens)?;
    Ok(GenerateRequest {
        model,
        prompts,
        params,
        n,
        stream,
        include_usage,
        continuous_usage,
        constraint: request_constraint(&map)?,
        tool_calls: None,
    })
}

/// Validates a `/v1/chat/completions` body.
pub fn chat_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<GenerateRequest, ApiError> {
    let map = parse_object(body)?;
    check_fields(
        &map,
        "",
        &[SHARED_FIELDS, CHAT_FIELDS, CONSTRAINT_FIELDS],
        REPLACED_FIELDS,
        NO_EFFECT_FIELDS,
    )?;
    let fields = Fields(&map);
    check_unsupported_values(&fields)?;
    let model = check_model(&fields, info)?;
    let mut params = sampling_params(&fields, info.vocab_size)?;
    let want_logprobs = fields.bool("logprobs")?.unwrap_or(false);
    let top = fields.int("top_logprobs", 0, MAX_LOGPROBS as i64)?;
    if top.is_some() && !want_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        ));
    }
    params.logprobs = want_logprobs.then(|| top.unwrap_or(0) as usize);
    let (stream, include_usage, continuous_usage) = stream_options(&fields)?;
    let n = fields.int("n", 1, MAX_N)?.unwrap_or(1) as usize;
    let mut messages = chat_messages(&fields)?;
    let mut kwargs = template_kwargs(&fields, info)?;
    let tools = tools::parse_tools(
        fields.get("tools"),
        fields.get("tool_choice"),
        fields.get("parallel_tool_calls"),
    )?;
    let mut constraint = request_constraint(&map)?;
    let mut tool_calls = None;
    if let Some(tools) = &tools {
        tool_calls = tools.call_format(info.tool_call_parser)?;
        if let Some(spec) = tools.grammar() {
            if let Some(other) = &constraint {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` \"required\" or a named function constrains the answer, and so does `{}`: give one",
                        other.param
                    ),
                ));
            }
            constraint = Some(Constraint {
                spec,
                param: "tools".into(),
            });
        }
    }
    if info.template_reads_tools {
        if let Some(tools) = &tools {
            if kwargs.contains_key("tools") {
                return Err(ApiError::invalid(
                    "chat_template_kwargs.tools",
                    "the request's `tools` reach the template as `tools`; give them once",
                ));
            }
            kwargs.insert("tools".into(), tools.template_value());
        }
    } else {
        messages = tools::hermes_messages(&messages, tools.as_ref());
    }
    let prompts = vec![render_chat(tokenizer, &messages, true, &kwargs, false)?];
    params.split_reasoning = info.split_reasoning;
    params.max_tokens = max_tokens(
        &fields,
        &["max_completion_tokens", "max_tokens"],
        &prompts,
        "messages",
        info,
        true,
    )?;
    params.min_tokens = min_tokens(&fields, params.max_tokens)?;
    Ok(GenerateRequest {
        model,
        prompts,
        params,
        n,
        stream,
        include_usage,
        continuous_usage,
        constraint,
        tool_calls,
    })
}

/// Whether the chat template renders `tools` itself (else the Hermes prompt carries them).
pub fn template_reads_tools(tokenizer: &Tokenizer) -> bool {
    tokenizer
        .chat_template()
        .is_some_and(|source| source.contains("tools"))
}

/// Fields of a `/tokenize` body (vLLM's shapes: a `prompt`, or chat `messages`).
const TOKENIZE_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "add_special_tokens",
    "add_generation_prompt",
    "chat_template_kwargs",
    "return_token_strs",
];

/// A checked `/tokenize` body.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    pub tokens: Vec<u32>,
    /// `return_token_strs`: answer each token's string too.
    pub token_strs: bool,
}

/// Validates a `/tokenize` body: `prompt` (special tokens added unless
/// `add_special_tokens: false`) or `messages` rendered with the chat template (with the
/// generation prompt unless `add_generation_prompt: false`; special tokens only with
/// `add_special_tokens: true`), as vLLM's.
pub fn tokenize_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<TokenizeRequest, ApiError> {
    let map = parse_object(body)?;
    check_fields(&map, "", &[TOKENIZE_FIELDS], &[], &[])?;
    let fields = Fields(&map);
    check_model(&fields, info)?;
    let token_strs = fields.bool("return_token_strs")?.unwrap_or(false);
    let tokens = match (fields.get("prompt"), fields.get("messages")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "give `prompt` or `messages`, not both",
            ))
        }
        (Some(_), None) => {
            if fields.get("add_generation_prompt").is_some()
                || fields.get("chat_template_kwargs").is_some()
            {
                return Err(ApiError::invalid(
                    "prompt",
                    "`add_generation_prompt` and `chat_template_kwargs` go with `messages`",
                ));
            }
            let text = fields
                .str("prompt")?
                .ok_or_else(|| ApiError::wrong_type("prompt", "a string"))?;
            let add_special = fields.bool("add_special_tokens")?.unwrap_or(true);
            tokenizer.encode(text, add_special).map_err(|e| {
                ApiError::invalid("prompt", format!("cannot tokenize `prompt`: {e:#}"))
            })?
        }
        (None, Some(_)) => {
            let messages = chat_messages(&fields)?;
            let kwargs = template_kwargs(&fields, info)?;
            let add_generation_prompt = fields.bool("add_generation_prompt")?.unwrap_or(true);
            let add_special = fields.bool("add_special_tokens")?.unwrap_or(false);
            render_chat(
                tokenizer,
                &messages,
                add_generation_prompt,
                &kwargs,
                add_special,
            )?
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` or `messages` is required",
            ))
        }
    };
    Ok(TokenizeRequest { tokens, token_strs })
}

/// Validates a `/detokenize` body (`tokens`, a list of ids of the vocabulary).
pub fn detokenize_request(body: &[u8], info: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let map = parse_object(body)?;
    check_fields(&map, "", &[&["model", "tokens"]], &[], &[])?;
    let fields = Fields(&map);
    check_model(&fields, info)?;
    match fields.get("tokens") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| token_id(v, info.vocab_size, "tokens"))
            .collect(),
        Some(_) => Err(ApiError::wrong_type("tokens", "a list of token ids")),
        None => Err(ApiError::invalid("tokens", "`tokens` is required")),
    }
}

fn min_tokens(fields: &Fields, max_tokens: usize) -> Result<usize, ApiError> {
    Ok(fields.int("min_tokens", 0, max_tokens as i64)?.unwrap_or(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: &Value) -> Fields<'_> {
        Fields(v.as_object().expect("object"))
    }

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        let v = serde_json::json!({"temperature": "hot", "n": 0, "top_p": 0.0, "seed": -1, "stop": ["a", 3]});
        let f = fields(&v);
        let e = f.float("temperature", 0.0, 100.0).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("temperature"), Some("invalid_type"))
        );
        let e = f.int("n", 1, MAX_N).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        assert_eq!(f.seed("seed").unwrap(), Some(u64::MAX));
        assert_eq!(stop_strings(&f).unwrap_err().param.as_deref(), Some("stop"));
        let e = sampling_params(&fields(&serde_json::json!({"top_p": 0.0})), 10).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
    }

    #[test]
    fn token_ids_are_checked_against_the_vocabulary() {
        let ids = [serde_json::json!(3), serde_json::json!(10)];
        let e = token_ids(&ids, 10, "prompt").unwrap_err();
        assert!(e.message.contains("token id 10"), "{}", e.message);
        assert_eq!(token_ids(&ids[..1], 10, "prompt").unwrap(), vec![3]);
        assert!(token_ids(&[], 10, "prompt").is_err());
    }

    #[test]
    fn context_overflow_names_max_tokens() {
        let info = ModelInfo {
            served_names: vec!["m".into()],
            vocab_size: 100,
            max_model_len: 10,
            default_chat_template_kwargs: Map::new(),
            split_reasoning: false,
            tool_call_parser: None,
            template_reads_tools: false,
        };
        let prompts = vec![vec![1; 6]];
        let v = serde_json::json!({"max_tokens": 5});
        let e = max_tokens(
            &fields(&v),
            &["max_tokens"],
            &prompts,
            "prompt",
            &info,
            false,
        )
        .unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("max_tokens"), Some("context_length_exceeded"))
        );
        let v = serde_json::json!({"max_tokens": 4});
        assert_eq!(
            max_tokens(
                &fields(&v),
                &["max_tokens"],
                &prompts,
                "prompt",
                &info,
                false
            )
            .unwrap(),
            4
        );
        let v = serde_json::json!({});
        assert_eq!(
            max_tokens(
                &fields(&v),
                &["max_tokens"],
                &prompts,
                "prompt",
                &info,
                true
            )
            .unwrap(),
            4
        );
        let e = max_tokens(
            &fields(&v),
            &["max_tokens"],
            &[vec![1; 10]],
            "prompt",
            &info,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }

    #[test]
    fn choices_get_consecutive_seeds() {
        let req = GenerateRequest {
            model: "m".into(),
            prompts: vec![vec![1], vec![2]],
            params: SamplingParams {
                seed: Some(7),
                ..SamplingParams::default()
            },
            n: 2,
            stream: false,
            include_usage: false,
            continuous_usage: false,
            constraint: None,
            tool_calls: None,
        };
        let seqs = req.sequences();
        let got: Vec<(u32, Option<u64>)> = seqs.iter().map(|(p, s)| (p[0], s.seed)).collect();
        assert_eq!(
            got,
            vec![(1, Some(7)), (1, Some(8)), (2, Some(7)), (2, Some(8))]
        );
    }
}
