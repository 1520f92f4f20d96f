//! Turns a raw request body into a checked generation job, or an `ApiError` naming the field.
//! The body is read once into the typed structs of `bodies` (which decide what is accepted);
//! this module checks what only the server knows (the model's name, `n`, the number of
//! prompts, unsupported values) and builds the engine's job. The limits that need the
//! engine (ranges of the sampling parameters, the vocabulary, the context and the KV
//! cache) are checked once, against the engine's `RequestLimits`, by
//! [`GenerateRequest::sequences`] before anything is queued.

use serde_json::{Map, Value};

use super::bodies::{
    ChatFields, CompletionFields, DetokenizeBody, MessageBody, NoEffectFields, SharedFields,
    StreamOptions, TokenizeBody,
};
use super::constraints::{request_constraint, Constraint, ConstraintFields};
use super::harmony;
use super::protocol::{ApiError, RequestFields};
use super::tools::{self, CallFormat, ToolCallParser, ToolChoice};
use super::typed_body::Body;
use crate::grammar::GrammarSpec;
use crate::limits::{CheckedSequence, RequestLimits};
use crate::sampler::SamplingParams;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Most choices (`n`) one request may ask for.
const MAX_N: u64 = 128;
/// Most prompts in one completions request.
const MAX_PROMPTS: usize = 1024;
/// A completion's `max_tokens` when absent (OpenAI's default).
const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// What validation needs to know about the served model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Names accepted in `model`; the first is reported in responses.
    pub served_names: Vec<String>,
    /// The engine's limits, which every choice is checked against before it is queued.
    pub limits: RequestLimits,
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
    /// The model chats in harmony (gpt-oss): prompts are rendered and answers read by
    /// `harmony`, not by the chat template and the parsers.
    pub harmony: bool,
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
    /// The names the request gave its fields, which an engine-side refusal names.
    pub fields: RequestFields,
}

impl GenerateRequest {
    /// One checked request per choice, in choice-index order (`prompt_index * n + i`):
    /// the engine's limits are checked here, once, before anything is queued; a refusal
    /// names the field as the client sent it.
    pub fn sequences(&self, limits: &RequestLimits) -> Result<Vec<CheckedSequence>, ApiError> {
        let mut out = Vec::with_capacity(self.prompts.len() * self.n);
        for prompt in &self.prompts {
            for i in 0..self.n {
                let mut params = self.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
                let checked = limits
                    .check(prompt.clone(), params)
                    .map_err(|e| self.fields.refusal(&e))?;
                out.push(checked);
            }
        }
        Ok(out)
    }
}

/// The `model` field: absent means the served model, an unknown name is a 404.
fn check_model(model: Option<String>, info: &ModelInfo) -> Result<String, ApiError> {
    match model {
        None => Ok(info.served_names[0].clone()),
        Some(name) if info.served_names.contains(&name) => Ok(name),
        Some(name) => Err(ApiError::model_not_found(&name)),
    }
}

/// `best_of` other than 1 and a non-empty `logit_bias` would change the answer: refused.
fn check_unsupported_values(shared: &SharedFields) -> Result<(), ApiError> {
    if shared.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` other than 1 is not supported",
        ));
    }
    if shared.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::invalid(
            "logit_bias",
            "`logit_bias` is not supported",
        ));
    }
    Ok(())
}

/// `stop`: a string or a list of strings (their number and lengths are the engine's to check).
fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    const EXPECTED: &str = "a string or a list of strings";
    match stop {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::wrong_type("stop", EXPECTED)),
        Some(_) => Err(ApiError::wrong_type("stop", EXPECTED)),
    }
}

/// A non-empty list of token ids (the engine checks them against the vocabulary).
fn token_ids(items: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be empty"),
        ));
    }
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::wrong_type(param, "a list of non-negative integer token ids")
                })
        })
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
    prompt: Option<&Value>,
    tokenizer: &Tokenizer,
) -> Result<Vec<Vec<u32>>, ApiError> {
    const EXPECTED: &str =
        "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let prompts = match prompt {
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
            Value::Number(_) => vec![token_ids(items, "prompt")?],
            Value::Array(_) => items
                .iter()
                .map(|v| match v {
                    Value::Array(ids) => token_ids(ids, "prompt"),
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

/// `messages`, checked message by message.
fn chat_messages(messages: Option<Vec<MessageBody>>) -> Result<Vec<ChatMessage>, ApiError> {
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
        Some(calls) => Some(tools::message_tool_calls(&calls, &calls_param)?),
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

/// Template variables the server sets itself, which `chat_template_kwargs` may not replace.
pub const SERVER_TEMPLATE_VARIABLES: [&str; 4] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// The template variables of a chat request: the server's defaults, overridden key by key
/// by the request's `chat_template_kwargs`.
fn template_kwargs(
    own: Option<Map<String, Value>>,
    info: &ModelInfo,
) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = info.default_chat_template_kwargs.clone();
    if let Some(own) = own {
        if let Some(key) = SERVER_TEMPLATE_VARIABLES
            .iter()
            .find(|k| own.contains_key(**k))
        {
            return Err(ApiError::invalid(
                &format!("chat_template_kwargs.{key}"),
                format!("`{key}` is set by the server, not by chat_template_kwargs"),
            ));
        }
        kwargs.extend(own);
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

/// The sampling parameters of the fields shared by both routes (`max_tokens`, `min_tokens`
/// and logprobs are set by the route). Their ranges are the engine's to check.
fn sampling_params(shared: &SharedFields) -> Result<SamplingParams, ApiError> {
    let defaults = SamplingParams::default();
    let float = |v: Option<f64>, default: f32| v.map_or(default, |x| x as f32);
    let top_k = match shared.top_k {
        None | Some(-1) => 0,
        Some(k) => usize::try_from(k).map_err(|_| {
            ApiError::invalid(
                "top_k",
                format!("`top_k` must be -1 (off) or at least 0, got {k}"),
            )
        })?,
    };
    let seed = shared.seed.as_ref().map(|n| {
        n.as_u64()
            .or_else(|| n.as_i64().map(|i| i as u64))
            .ok_or_else(|| ApiError::wrong_type("seed", "an integer"))
    });
    Ok(SamplingParams {
        temperature: float(shared.temperature, defaults.temperature),
        top_p: float(shared.top_p, defaults.top_p),
        top_k,
        min_p: float(shared.min_p, defaults.min_p),
        presence_penalty: float(shared.presence_penalty, defaults.presence_penalty),
        frequency_penalty: float(shared.frequency_penalty, defaults.frequency_penalty),
        repetition_penalty: float(shared.repetition_penalty, defaults.repetition_penalty),
        seed: seed.transpose()?,
        stop: stop_strings(shared.stop.as_ref())?,
        stop_token_ids: shared.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: shared.ignore_eos.unwrap_or(false),
        skip_special_tokens: shared.skip_special_tokens.unwrap_or(true),
        min_tokens: count(shared.min_tokens),
        ..defaults
    })
}

/// A count from the body, saturating at `usize::MAX` (the engine's limits refuse it).
fn count(n: Option<u64>) -> usize {
    n.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Stream flags `(stream, include_usage, continuous_usage)`; `stream_options` only with
/// `stream: true`.
fn stream_flags(
    stream: Option<bool>,
    options: Option<&StreamOptions>,
) -> Result<(bool, bool, bool), ApiError> {
    let stream = stream.unwrap_or(false);
    let Some(options) = options else {
        return Ok((stream, false, false));
    };
    if !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    Ok((
        stream,
        options.include_usage.unwrap_or(false),
        options.continuous_usage_stats.unwrap_or(false),
    ))
}

/// `n`, within `1..=MAX_N`.
fn choices(n: Option<u64>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        n @ 1..=MAX_N => Ok(n as usize),
        n => Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {MAX_N}, got {n}"),
        )),
    }
}

/// What fills the context after the longest prompt (zero when it is already full, which
/// the engine refuses naming the prompt).
fn room_after(prompts: &[Vec<u32>], info: &ModelInfo) -> usize {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    info.limits.max_model_len().saturating_sub(longest)
}

/// Validates a `/v1/completions` body.
pub fn completion_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<GenerateRequest, ApiError> {
    let mut body = Body::parse(body)?;
    let shared: SharedFields = body.read()?;
    let own: CompletionFields = body.read()?;
    let constraint_fields: ConstraintFields = body.read()?;
    body.read::<NoEffectFields>()?;
    body.finish()?;
    check_unsupported_values(&shared)?;
    let model = check_model(shared.model.clone(), info)?;
    if own.echo == Some(true) {
        return Err(ApiError::invalid("echo", "`echo: true` is not supported"));
    }
    if own.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    let mut params = sampling_params(&shared)?;
    params.logprobs = own.logprobs.map(|k| count(Some(k)));
    let (stream, include_usage, continuous_usage) =
        stream_flags(shared.stream, shared.stream_options.as_ref())?;
    let n = choices(shared.n)?;
    let prompts = completion_prompts(own.prompt.as_ref(), tokenizer)?;
    params.max_tokens = match shared.max_tokens {
        Some(n) => count(Some(n)),
        None => DEFAULT_COMPLETION_TOKENS.min(room_after(&prompts, info)),
    };
    Ok(GenerateRequest {
        model,
        prompts,
        params,
        n,
        stream,
        include_usage,
        continuous_usage,
        constraint: request_constraint(&constraint_fields)?,
        tool_calls: None,
        fields: RequestFields::COMPLETION,
    })
}

/// Validates a `/v1/chat/completions` body.
pub fn chat_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<GenerateRequest, ApiError> {
    let mut body = Body::parse(body)?;
    let shared: SharedFields = body.read()?;
    let own: ChatFields = body.read()?;
    let constraint_fields: ConstraintFields = body.read()?;
    body.read::<NoEffectFields>()?;
    body.finish()?;
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
    let (stream, include_usage, continuous_usage) =
        stream_flags(shared.stream, shared.stream_options.as_ref())?;
    let n = choices(shared.n)?;
    let mut messages = chat_messages(own.messages)?;
    let tools = tools::parse_tools(
        own.tools.as_ref(),
        own.tool_choice.as_ref(),
        own.parallel_tool_calls,
    )?;
    let mut constraint = request_constraint(&constraint_fields)?;
    if info.harmony {
        let prompt = harmony_prompt(
            own.chat_template_kwargs.is_some(),
            own.reasoning_effort.as_deref(),
            &messages,
            tools.as_ref(),
            tokenizer,
        )?;
        if shared.skip_special_tokens == Some(false) {
            return Err(ApiError::invalid(
                "skip_special_tokens",
                "this model answers in harmony, whose markers the server reads out of the answer: \
                 `skip_special_tokens: false` has no markers to keep",
            ));
        }
        if let Some(c) = &mut constraint {
            c.spec = harmony::final_grammar(&c.spec)
                .map_err(|message| ApiError::invalid(&c.param, message))?;
        }
        if let Some(spec) = tools.as_ref().and_then(harmony::tool_grammar) {
            constraint = Some(tool_constraint(spec, constraint.as_ref())?);
        }
        let calls = tools.as_ref().is_some_and(|t| t.choice != ToolChoice::None);
        // The reader finds the format's markers in the text.
        params.skip_special_tokens = false;
        return Ok(chat_job(
            model,
            vec![prompt],
            params,
            (n, stream, include_usage, continuous_usage),
            constraint,
            Some(CallFormat::Harmony { calls }),
            (own.max_completion_tokens, shared.max_tokens),
            info,
        ));
    }
    let effort_twice = own
        .chat_template_kwargs
        .as_ref()
        .is_some_and(|k| k.contains_key("reasoning_effort"));
    let mut kwargs = template_kwargs(own.chat_template_kwargs, info)?;
    if let Some(effort) = own.reasoning_effort {
        if effort_twice {
            return Err(ApiError::invalid(
                "chat_template_kwargs.reasoning_effort",
                "`reasoning_effort` reaches the template as `reasoning_effort`; give it once",
            ));
        }
        harmony::ReasoningEffort::parse(&effort)?;
        // The request's value wins over a server default.
        kwargs.insert("reasoning_effort".into(), Value::String(effort));
    }
    let mut tool_calls = None;
    if let Some(tools) = &tools {
        tool_calls = tools.call_format(info.tool_call_parser)?;
        if let Some(spec) = tools.grammar() {
            constraint = Some(tool_constraint(spec, constraint.as_ref())?);
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
    Ok(chat_job(
        model,
        prompts,
        params,
        (n, stream, include_usage, continuous_usage),
        constraint,
        tool_calls,
        (own.max_completion_tokens, shared.max_tokens),
        info,
    ))
}

/// The constraint of a tool choice's grammar `spec`, refused beside the request's own
/// structured output (`other`).
fn tool_constraint(spec: GrammarSpec, other: Option<&Constraint>) -> Result<Constraint, ApiError> {
    if let Some(other) = other {
        return Err(ApiError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` \"required\" or a named function constrains the answer, and so does `{}`: give one",
                other.param
            ),
        ));
    }
    Ok(Constraint {
        spec,
        param: "tools".into(),
    })
}

/// A chat request's job: `max_tokens` from OpenAI's newer name or the old one (without
/// either, the answer may fill the context).
#[allow(clippy::too_many_arguments)]
fn chat_job(
    model: String,
    prompts: Vec<Vec<u32>>,
    mut params: SamplingParams,
    (n, stream, include_usage, continuous_usage): (usize, bool, bool, bool),
    constraint: Option<Constraint>,
    tool_calls: Option<CallFormat>,
    (max_completion_tokens, max_tokens): (Option<u64>, Option<u64>),
    info: &ModelInfo,
) -> GenerateRequest {
    params.split_reasoning = info.split_reasoning;
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
        stream,
        include_usage,
        continuous_usage,
        constraint,
        tool_calls,
        fields: RequestFields {
            max_tokens: max_tokens_field,
            ..RequestFields::CHAT
        },
    }
}

/// A harmony model's prompt (`chat_template_kwargs` has no template to reach: refused),
/// dated today (UTC), as gpt-oss's template dates it.
fn harmony_prompt(
    template_kwargs_given: bool,
    reasoning_effort: Option<&str>,
    messages: &[ChatMessage],
    tools: Option<&tools::Tools>,
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, ApiError> {
    if template_kwargs_given {
        return Err(ApiError::invalid(
            "chat_template_kwargs",
            "this model's prompts are rendered in harmony, not by a chat template: \
             `chat_template_kwargs` has nothing to reach (`reasoning_effort` sets its effort)",
        ));
    }
    let effort = match reasoning_effort {
        Some(effort) => harmony::ReasoningEffort::parse(effort)?,
        None => harmony::ReasoningEffort::Medium,
    };
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let text = harmony::render(messages, tools, effort, &today)?;
    encode(tokenizer, &text, "messages", false)
}

/// Whether the chat template renders `tools` itself (else the Hermes prompt carries them):
/// decided once, when the model loads.
pub fn template_reads_tools(tokenizer: &Tokenizer) -> bool {
    tokenizer
        .chat_template()
        .is_some_and(|source| source.contains("tools"))
}

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
    let mut body = Body::parse(body)?;
    let b: TokenizeBody = body.read()?;
    body.finish()?;
    check_model(b.model, info)?;
    let token_strs = b.return_token_strs.unwrap_or(false);
    let tokens = match (b.prompt, b.messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "give `prompt` or `messages`, not both",
            ))
        }
        (Some(text), None) => {
            if b.add_generation_prompt.is_some() || b.chat_template_kwargs.is_some() {
                return Err(ApiError::invalid(
                    "prompt",
                    "`add_generation_prompt` and `chat_template_kwargs` go with `messages`",
                ));
            }
            let add_special = b.add_special_tokens.unwrap_or(true);
            tokenizer.encode(&text, add_special).map_err(|e| {
                ApiError::invalid("prompt", format!("cannot tokenize `prompt`: {e:#}"))
            })?
        }
        (None, Some(messages)) if info.harmony => {
            if b.chat_template_kwargs.is_some() {
                return Err(ApiError::invalid(
                    "chat_template_kwargs",
                    "this model's prompts are rendered in harmony, not by a chat template",
                ));
            }
            let messages = chat_messages(Some(messages))?;
            let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
            let mut text =
                harmony::render(&messages, None, harmony::ReasoningEffort::Medium, &today)?;
            if !b.add_generation_prompt.unwrap_or(true) {
                text.truncate(text.len() - "<|start|>assistant".len());
            }
            encode(
                tokenizer,
                &text,
                "messages",
                b.add_special_tokens.unwrap_or(false),
            )?
        }
        (None, Some(messages)) => {
            let messages = chat_messages(Some(messages))?;
            let kwargs = template_kwargs(b.chat_template_kwargs, info)?;
            render_chat(
                tokenizer,
                &messages,
                b.add_generation_prompt.unwrap_or(true),
                &kwargs,
                b.add_special_tokens.unwrap_or(false),
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
    let mut body = Body::parse(body)?;
    let b: DetokenizeBody = body.read()?;
    body.finish()?;
    check_model(b.model, info)?;
    let vocab = info.limits.vocab_size();
    let tokens = b
        .tokens
        .ok_or_else(|| ApiError::invalid("tokens", "`tokens` is required"))?;
    tokens
        .into_iter()
        .map(|id| match u32::try_from(id) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => Err(ApiError::invalid(
                "tokens",
                format!("token id {id} is out of the vocabulary (size {vocab})"),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(body: serde_json::Value) -> Result<SharedFields, ApiError> {
        Body::parse(body.to_string().as_bytes())?.read()
    }

    #[test]
    fn wrong_types_and_values_name_the_field() {
        let e = shared(serde_json::json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("temperature"), Some("invalid_type"))
        );
        assert_eq!(choices(Some(0)).unwrap_err().param.as_deref(), Some("n"));
        assert_eq!(choices(Some(MAX_N)).unwrap(), MAX_N as usize);
        let p = sampling_params(&shared(serde_json::json!({"seed": -1, "top_k": -1})).unwrap())
            .unwrap();
        assert_eq!((p.seed, p.top_k), (Some(u64::MAX), 0));
        let e = sampling_params(&shared(serde_json::json!({"top_k": -2})).unwrap()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_k"));
        let e =
            sampling_params(&shared(serde_json::json!({"stop": ["a", 3]})).unwrap()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let p = sampling_params(&shared(serde_json::json!({"stop": "x", "top_p": 0.5})).unwrap())
            .unwrap();
        assert_eq!((p.stop, p.top_p), (vec!["x".to_string()], 0.5));
    }

    #[test]
    fn token_ids_must_be_a_non_empty_list_of_non_negative_integers() {
        let ids = [serde_json::json!(3), serde_json::json!(10)];
        assert_eq!(token_ids(&ids, "prompt").unwrap(), vec![3, 10]);
        assert!(token_ids(&[], "prompt").is_err());
        let e = token_ids(&[serde_json::json!(-1)], "prompt").unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("prompt"), Some("invalid_type"))
        );
    }

    #[test]
    fn an_absent_length_limit_fills_what_the_longest_prompt_leaves() {
        let info = ModelInfo {
            served_names: vec!["m".into()],
            limits: RequestLimits::new(100, 10, 16, 16),
            default_chat_template_kwargs: Map::new(),
            split_reasoning: false,
            tool_call_parser: None,
            template_reads_tools: false,
            harmony: false,
        };
        assert_eq!(room_after(&[vec![1; 6], vec![1; 2]], &info), 4);
        assert_eq!(room_after(&[vec![1; 12]], &info), 0);
    }

    /// The engine's limits, checked before a request is queued, refuse a chat request by
    /// the fields the client sent: its prompt as `messages`, its logprobs count as
    /// `top_logprobs`, its length limit as `max_completion_tokens` (with OpenAI's
    /// `context_length_exceeded`).
    #[test]
    fn an_engine_side_refusal_of_a_chat_request_names_the_fields_the_client_sent() {
        let limits = RequestLimits::new(100, 64, 16, 16);
        let chat = |prompt: Vec<u32>, params: SamplingParams, max_tokens_field| GenerateRequest {
            model: "m".into(),
            prompts: vec![prompt],
            params,
            n: 1,
            stream: false,
            include_usage: false,
            continuous_usage: false,
            constraint: None,
            tool_calls: None,
            fields: RequestFields {
                max_tokens: max_tokens_field,
                ..RequestFields::CHAT
            },
        };
        let refusal = |request: GenerateRequest| request.sequences(&limits).unwrap_err();
        let e = refusal(chat(vec![5, 100], SamplingParams::default(), "max_tokens"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("out of vocabulary"), "{}", e.message);
        let e = refusal(chat(vec![5; 64], SamplingParams::default(), "max_tokens"));
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("messages"), Some("context_length_exceeded"))
        );
        let many = SamplingParams {
            logprobs: Some(21),
            ..SamplingParams::default()
        };
        let e = refusal(chat(vec![5], many, "max_tokens"));
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert!(
            e.message.contains("`top_logprobs` must be at most 20"),
            "{}",
            e.message
        );
        let long = SamplingParams {
            max_tokens: 64,
            ..SamplingParams::default()
        };
        let e = refusal(chat(vec![5], long, "max_completion_tokens"));
        assert_eq!(
            (e.param.as_deref(), e.code),
            (
                Some("max_completion_tokens"),
                Some("context_length_exceeded")
            )
        );
        assert!(
            e.message.starts_with(
                "This model's maximum context length is 64 tokens. However, you requested 65 \
                 tokens (1 in the messages, 64 in the completion)"
            ),
            "{}",
            e.message
        );
        let fits = chat(vec![5; 10], SamplingParams::default(), "max_tokens");
        assert_eq!(fits.sequences(&limits).unwrap()[0].prompt_ids(), &[5; 10]);
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
            fields: RequestFields::COMPLETION,
        };
        let limits = RequestLimits::new(100, 64, 16, 16);
        let seqs = req.sequences(&limits).unwrap();
        let got: Vec<(u32, Option<u64>)> = seqs
            .iter()
            .map(|c| (c.prompt_ids()[0], c.params().seed))
            .collect();
        assert_eq!(
            got,
            vec![(1, Some(7)), (1, Some(8)), (2, Some(7)), (2, Some(8))]
        );
    }
}
