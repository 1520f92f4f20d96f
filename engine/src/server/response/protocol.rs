//! OpenAI wire types of what the server answers: responses, stream chunks, usage and
//! logprobs (request bodies are typed in `request::body`, the error body in `error`).

use serde::Serialize;

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
        t: &crate::server::metrics::SeqTimings,
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
