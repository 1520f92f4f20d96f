//! The request bodies of the routes as typed structs, read by [`super::body::Body`]:
//! a field is accepted exactly when a struct here has it. A field whose JSON shape is one of
//! several (`prompt`, `stop`, a message's `content`, `tools`) is a [`Value`] read by its own
//! function in its route's module; every other field has its type here.

use serde::Deserialize;
use serde_json::{Map, Number, Value};

/// Fields of both generation routes (`/v1/completions`, `/v1/chat/completions`).
#[derive(Debug, Deserialize)]
pub struct SharedFields {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub min_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// -1 (vLLM's "off") or at least 0.
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Any integer; a negative one wraps to `u64`.
    pub seed: Option<Number>,
    /// A string or a list of strings.
    pub stop: Option<Value>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u64>,
    /// Only 1 (the only value that changes nothing).
    pub best_of: Option<u64>,
    /// Only empty (the only value that changes nothing).
    pub logit_bias: Option<Map<String, Value>>,
}

/// Fields both generation routes accept that change nothing in the answer here (listed in
/// docs/guide/engine.md).
#[derive(Debug, Deserialize)]
pub struct NoEffectFields {
    #[serde(rename = "user")]
    _user: Option<Value>,
    #[serde(rename = "metadata")]
    _metadata: Option<Value>,
    #[serde(rename = "store")]
    _store: Option<Value>,
    #[serde(rename = "service_tier")]
    _service_tier: Option<Value>,
    #[serde(rename = "safety_identifier")]
    _safety_identifier: Option<Value>,
    #[serde(rename = "prompt_cache_key")]
    _prompt_cache_key: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub continuous_usage_stats: Option<bool>,
    /// OpenAI's padding of stream chunks: changes nothing here (any value).
    #[serde(rename = "include_obfuscation")]
    _include_obfuscation: Option<Value>,
}

/// `/v1/completions`'s own fields.
#[derive(Debug, Deserialize)]
pub struct CompletionFields {
    /// A string, a list of strings, a list of token ids or a list of such lists.
    pub prompt: Option<Value>,
    pub logprobs: Option<u64>,
    /// Only `false`.
    pub echo: Option<bool>,
    /// Refused when given.
    pub suffix: Option<Value>,
}

/// `/v1/chat/completions`'s own fields.
#[derive(Debug, Deserialize)]
pub struct ChatFields {
    pub messages: Option<Vec<MessageBody>>,
    /// OpenAI's newer name of `max_tokens`, which it wins over.
    pub max_completion_tokens: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `"low"`, `"medium"` or `"high"`: harmony's `Reasoning:` for gpt-oss, the template
    /// variable `reasoning_effort` for other models.
    pub reasoning_effort: Option<String>,
    /// OpenAI's deprecated form of `tools`: refused, naming it.
    pub functions: Option<Value>,
    /// OpenAI's deprecated form of `tool_choice`: refused, naming it.
    pub function_call: Option<Value>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct MessageBody {
    pub role: Option<String>,
    /// A string or a list of text parts.
    pub content: Option<Value>,
    /// Changes nothing here (any value).
    #[serde(rename = "name")]
    _name: Option<Value>,
    /// An earlier assistant turn's reasoning, which reaches the template (as Qwen3's reads
    /// it); `reasoning` is the same field under vLLM's newer name.
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
    /// An assistant turn's calls.
    pub tool_calls: Option<Value>,
    /// A tool result's call.
    pub tool_call_id: Option<String>,
    /// OpenAI's deprecated form of `tool_calls`: refused, naming it.
    pub function_call: Option<Value>,
}

/// A `/tokenize` body (vLLM's shapes: a `prompt`, or chat `messages`).
#[derive(Debug, Deserialize)]
pub struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<MessageBody>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub return_token_strs: Option<bool>,
}

/// A `/detokenize` body.
#[derive(Debug, Deserialize)]
pub struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Option<Vec<u64>>,
}

/// A `/v1/responses` body: the fields it takes (each read and carried to the chat request
/// it becomes, or refused with its reason); any other field is refused by name.
#[derive(Debug, Deserialize)]
pub struct ResponsesBody {
    pub model: Option<String>,
    /// A string, or a list of items (messages, function calls, their outputs, reasoning).
    pub input: Option<Value>,
    pub instructions: Option<String>,
    /// Function tools in the Responses API's flat form.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    pub reasoning: Option<ResponsesReasoning>,
    pub text: Option<ResponsesText>,
    /// Only `false`: this server keeps no responses.
    pub store: Option<bool>,
    /// Refused: this server keeps no responses to continue.
    pub previous_response_id: Option<Value>,
    /// Echoed in the response; changes nothing else.
    pub metadata: Option<Map<String, Value>>,
    /// Changes nothing here (any value).
    #[serde(rename = "user")]
    _user: Option<Value>,
    /// vLLM's extensions of its Responses request, as in chat.
    pub ignore_eos: Option<bool>,
    pub seed: Option<Number>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub stop: Option<Value>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// `reasoning` of a Responses request.
#[derive(Debug, Deserialize)]
pub struct ResponsesReasoning {
    pub effort: Option<String>,
    /// Refused when given: the reasoning streams as its text, not summarised.
    pub summary: Option<Value>,
}

/// `text` of a Responses request.
#[derive(Debug, Deserialize)]
pub struct ResponsesText {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", ...}`.
    pub format: Option<Value>,
}
