//! OpenAI wire types: responses, stream chunks, usage, logprobs and the error body (request
//! bodies are typed in `bodies`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::limits::LimitError;

/// Token counts of a request (or of one choice so far, in continuous usage stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Absent only on a chat stream's role chunk, before the prefix cache was looked up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Only when the server splits reasoning (`--reasoning-parser`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
            completion_tokens_details: None,
        }
    }

    /// Prompt tokens only, before the prefix cache was looked up.
    pub fn queued(prompt_tokens: usize) -> Usage {
        Usage {
            prompt_tokens_details: None,
            ..Usage::new(prompt_tokens, 0, 0)
        }
    }

    /// With the reasoning tokens among the completion tokens.
    pub fn with_reasoning(mut self, reasoning_tokens: Option<usize>) -> Usage {
        self.completion_tokens_details =
            reasoning_tokens.map(|reasoning_tokens| CompletionTokensDetails { reasoning_tokens });
        self
    }
}

/// Legacy completions logprobs (`logprobs: k` on `/v1/completions`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The server's own timing of a request, on every response body and a stream's last chunk:
/// llama.cpp's `timings` fields (its server's `result_timings::to_json`: `cache_n`,
/// `prompt_n`, `prompt_ms`, … `predicted_per_second`) and ours beside them. `prompt_ms` is
/// `prefill_ms` (first scheduled to first token), `predicted_ms` is `decode_ms` (first token
/// to last, so its rates count the tokens after the first); `queue_ms` runs from arrival to
/// first scheduled (a wait for the step in flight included), so arrival to the last token is
/// `queue_ms + prefill_ms + decode_ms`. A rate with nothing to divide by is `null`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timings {
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: Option<f64>,
    pub prompt_per_second: Option<f64>,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: Option<f64>,
    pub predicted_per_second: Option<f64>,
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Prompt tokens served from the prefix cache (`cache_n`).
    pub cached_tokens: usize,
    /// Prompt tokens computed (`prompt_n`).
    pub computed_prompt_tokens: usize,
}

impl Timings {
    /// From a sequence's timings (seconds) and its token counts.
    pub fn new(
        t: &super::metrics::SeqTimings,
        prompt_tokens: usize,
        cached_tokens: usize,
        output_tokens: usize,
    ) -> Timings {
        let computed = prompt_tokens.saturating_sub(cached_tokens);
        let (prefill_ms, decode_ms) = (t.prefill * 1000.0, t.decode * 1000.0);
        let per_token = |ms: f64, n: usize| (n > 0 && ms > 0.0).then(|| ms / n as f64);
        let per_second = |ms: f64, n: usize| (n > 0 && ms > 0.0).then(|| n as f64 * 1000.0 / ms);
        // Decode spans the gaps after the first token, as llama.cpp's own rates do
        // (`predicted_per_token_ms` 60.112 ms over 8 tokens reads 8.587: 7 gaps).
        let gaps = output_tokens.saturating_sub(1);
        Timings {
            cache_n: cached_tokens,
            prompt_n: computed,
            prompt_ms: prefill_ms,
            prompt_per_token_ms: per_token(prefill_ms, computed),
            prompt_per_second: per_second(prefill_ms, computed),
            predicted_n: output_tokens,
            predicted_ms: decode_ms,
            predicted_per_token_ms: per_token(decode_ms, gaps),
            predicted_per_second: per_second(decode_ms, gaps),
            queue_ms: t.queue * 1000.0,
            prefill_ms,
            decode_ms,
            cached_tokens,
            computed_prompt_tokens: computed,
        }
    }
}

/// A `/v1/completions` response body, or one stream chunk (`object` says which).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// One alternative of chat logprobs (`top_logprobs` entries).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// Chat logprobs of one sampled token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// `null` when the answer is tool calls only.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
    /// The reasoning, under vLLM's current name and under SGLang's, llama.cpp's and
    /// DeepSeek's (`--reasoning-parser`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// One tool call of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A stream's piece of a tool call: its first has `id`, `type` and the function's `name`,
/// later ones more `arguments`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// The incremental message of a chat stream chunk: `role` on the first, `content` after.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text, under both names (see [`ChatMessageOut`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub max_model_len: usize,
}

/// `POST /tokenize` (vLLM's shape).
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    /// Each token's string, with `return_token_strs: true`.
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` (vLLM's shape).
#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
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

/// An error answered with OpenAI's body `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            retry_after: None,
        }
    }

    /// 400 for a field of the wrong JSON type.
    pub fn wrong_type(param: &str, expected: &str) -> ApiError {
        ApiError {
            code: Some("invalid_type"),
            ..ApiError::invalid(param, format!("`{param}` must be {expected}"))
        }
    }

    /// 400 for a body that is not a JSON object.
    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError {
            param: None,
            code: Some("invalid_json"),
            ..ApiError::invalid("", message)
        }
    }

    /// 400 for prompt + completion beyond the context window.
    pub fn context_length(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(param, message)
        }
    }

    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("model_not_found"),
            ..ApiError::invalid("model", format!("The model `{model}` does not exist."))
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Missing or invalid bearer token in the Authorization header.".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("request_too_large"),
            param: None,
            ..ApiError::invalid(
                "",
                format!("The request body exceeds the limit of {limit} bytes."),
            )
        }
    }

    pub fn overloaded(waiting: usize, retry_after: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is overloaded: {waiting} requests are already waiting. Retry later."
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable_error",
            param: None,
            code: None,
            retry_after: Some(1),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn not_found_route(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("unknown_url"),
            param: None,
            ..ApiError::invalid("", format!("Unknown route `{path}`."))
        }
    }

    /// The JSON body, also used inside an SSE stream when generation fails mid-way.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// Seconds since the Unix epoch, for `created` fields.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh response id such as `cmpl-3f9a...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}
