//! A request as the client sent it, read and checked into what the engine runs, or an
//! `ApiError` naming the field. The body is read once into the typed structs of `fields`
//! (which decide what is accepted) by `body`; each route's module checks what only the
//! server knows (the model's name, `n`, the number of prompts, unsupported values) and
//! builds a [`GenerateRequest`]. Chat requests ask the model's chat format (`formats`) for
//! the prompt, the tool grammar and the answer reading. The limits that need the engine
//! (ranges of the sampling parameters, the vocabulary, the context and the KV cache) are
//! checked once, against the engine's `RequestLimits`, by [`GenerateRequest::sequences`]
//! before anything is queued.

pub mod body;
pub mod chat;
pub mod completion;
pub mod constraints;
pub mod fields;
pub mod sampling;
pub mod tokenize;

use std::sync::Arc;

use super::error::ApiError;
use super::formats::{ChatFormat, Reading};
use crate::limits::{CheckedSequence, LimitError, RequestLimits};
use crate::sampler::SamplingParams;
use crate::tokenizer::Tokenizer;
use body::Body;
use constraints::{Constraint, ConstraintFields};
use fields::{NoEffectFields, SharedFields, StreamOptions};

/// Most choices (`n`) one request may ask for.
const MAX_N: u64 = 128;

/// What validation needs to know about the served model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Names accepted in `model`; the first is reported in responses.
    pub served_names: Vec<String>,
    /// The engine's limits, which every choice is checked against before it is queued.
    pub limits: RequestLimits,
    /// The model's chat format: how chat requests are rendered and their answers read.
    pub format: Arc<dyn ChatFormat>,
    /// Whether a chat request's history length is worth finding: the model keeps recurrent
    /// state, whose prefix cache serves the next turn from a checkpoint at the history's end.
    pub checkpoints_history: bool,
}

/// Whether and how a response streams: `stream` and its `stream_options`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streaming {
    pub stream: bool,
    /// `stream_options.include_usage`: a final chunk with the totals.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`: usage on every chunk.
    pub continuous_usage: bool,
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
    pub streaming: Streaming,
    /// The grammar every answer follows (structured output, or the tool choice's).
    pub constraint: Option<Constraint>,
    /// How each choice's answer is read (its chat format's reader), when not as plain text.
    pub reading: Option<Reading>,
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

/// The names a request gave the fields an engine-side refusal names: its prompt (`prompt`,
/// or `messages` for chat), its length limit (`max_tokens`, or chat's
/// `max_completion_tokens`) and its logprobs count (chat's `top_logprobs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFields {
    pub prompt: &'static str,
    pub max_tokens: &'static str,
    pub logprobs: &'static str,
}

impl RequestFields {
    pub const COMPLETION: RequestFields = RequestFields {
        prompt: "prompt",
        max_tokens: "max_tokens",
        logprobs: "logprobs",
    };
    pub const CHAT: RequestFields = RequestFields {
        prompt: "messages",
        max_tokens: "max_tokens",
        logprobs: "top_logprobs",
    };

    /// The engine's refusal as the client's error, naming the fields as the client sent
    /// them, in the param and in the message; a context overflow in OpenAI's words (which
    /// clients match on) with its `context_length_exceeded` code.
    pub fn refusal(&self, e: &LimitError) -> ApiError {
        let rename = |engine_name: &'static str| match engine_name {
            "prompt" => self.prompt,
            "max_tokens" => self.max_tokens,
            "logprobs" => self.logprobs,
            other => other,
        };
        let param = rename(e.param());
        match *e {
            LimitError::PromptTooLong { prompt, limit } => ApiError::context_length(
                param,
                format!(
                    "This model's maximum context length is {limit} tokens. However, your request has {prompt} input tokens. Please reduce the length of the {}.",
                    self.prompt
                ),
            ),
            LimitError::ContextLength {
                prompt,
                max_tokens,
                limit,
            } => ApiError::context_length(
                param,
                format!(
                    "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt} in the {}, {max_tokens} in the completion). Please reduce the length of the {} or completion.",
                    prompt.saturating_add(max_tokens),
                    self.prompt,
                    self.prompt
                ),
            ),
            _ => {
                // The engine's messages name its own fields in backticks.
                let mut message = e.to_string();
                for engine_name in ["max_tokens", "logprobs"] {
                    let sent = rename(engine_name);
                    message = message.replace(&format!("`{engine_name}`"), &format!("`{sent}`"));
                }
                ApiError::invalid(param, message)
            }
        }
    }
}

/// A generation route's body read whole: the fields both routes share, the route's `Own`,
/// the structured-output fields, and those that change nothing; any other field is refused.
fn read_generation_body<Own: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<(SharedFields, Own, ConstraintFields), ApiError> {
    let mut body = Body::parse(bytes)?;
    let shared = body.read()?;
    let own = body.read()?;
    let constraint_fields = body.read()?;
    body.read::<NoEffectFields>()?;
    body.finish()?;
    Ok((shared, own, constraint_fields))
}

/// The `model` field: absent means the served model, an unknown name is a 404.
fn check_model(model: Option<String>, info: &ModelInfo) -> Result<String, ApiError> {
    match model {
        None => Ok(info.served_names[0].clone()),
        Some(name) if info.served_names.contains(&name) => Ok(name),
        Some(name) => Err(ApiError::model_not_found(&name)),
    }
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

/// A count from the body, saturating at `usize::MAX` (the engine's limits refuse it).
fn count(n: Option<u64>) -> usize {
    n.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// The request's [`Streaming`]; `stream_options` only with `stream: true`.
fn read_streaming(
    stream: Option<bool>,
    options: Option<&StreamOptions>,
) -> Result<Streaming, ApiError> {
    let stream = stream.unwrap_or(false);
    let Some(options) = options else {
        return Ok(Streaming {
            stream,
            ..Streaming::default()
        });
    };
    if !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    Ok(Streaming {
        stream,
        include_usage: options.include_usage.unwrap_or(false),
        continuous_usage: options.continuous_usage_stats.unwrap_or(false),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::formats::template::{NoParser, TemplateFormat, TemplatePrompt};

    #[test]
    fn an_absent_length_limit_fills_what_the_longest_prompt_leaves() {
        let info = ModelInfo {
            served_names: vec!["m".into()],
            limits: RequestLimits::new(100, 10, Some(256)),
            format: Arc::new(TemplateFormat {
                template: TemplatePrompt::default(),
                think: None,
                calls: NoParser,
            }),
            checkpoints_history: false,
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
        let limits = RequestLimits::new(100, 64, Some(256));
        let chat = |prompt: Vec<u32>, params: SamplingParams, max_tokens_field| GenerateRequest {
            model: "m".into(),
            prompts: vec![prompt],
            params,
            n: 1,
            streaming: Streaming::default(),
            constraint: None,
            reading: None,
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
            streaming: Streaming::default(),
            constraint: None,
            reading: None,
            fields: RequestFields::COMPLETION,
        };
        let limits = RequestLimits::new(100, 64, Some(256));
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
