//! The response bodies and stream chunks of one request: completions' and chat's, each
//! choice's answer read by its chat format's reader into content, reasoning and tool calls.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Json;

use super::protocol::{
    new_id, unix_now, ChatChoice, ChatChunk, ChatChunkChoice, ChatDelta, ChatLogprobs,
    ChatMessageOut, ChatResponse, ChatTokenLogprob, ChatTopLogprob, CompletionChoice,
    CompletionLogprobs, CompletionResponse, FunctionCallOut, FunctionDelta, Timings, ToolCallDelta,
    ToolCallOut, Usage,
};
use super::Endpoint;
use crate::engine::{FinishReason, TokenLogprob};
use crate::server::engine_loop::SeqOutput;
use crate::server::error::ApiError;
use crate::server::formats::{AnswerReader, CallEvent, Reading};
use crate::server::request::GenerateRequest;
use crate::tokenizer::Tokenizer;

fn finish_reason(reason: Option<FinishReason>) -> Option<&'static str> {
    reason.map(|r| match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Error => "error",
    })
}

/// Builds response bodies and stream chunks for one request.
pub struct ChunkWriter {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    tokenizer: Option<Arc<Tokenizer>>,
    want_logprobs: bool,
    continuous_usage: bool,
    /// Chat answers are split into reasoning and answer (`--reasoning-parser`).
    split_reasoning: bool,
    /// How each choice's answer is read (its chat format's reader), when not as plain text.
    reading: Option<Reading>,
}

impl ChunkWriter {
    pub fn new(
        endpoint: Endpoint,
        request: &GenerateRequest,
        tokenizer: Result<Arc<Tokenizer>, ApiError>,
    ) -> ChunkWriter {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        ChunkWriter {
            endpoint,
            id: new_id(prefix),
            created: unix_now(),
            model: request.model.clone(),
            tokenizer: tokenizer.ok(),
            want_logprobs: request.params.logprobs.is_some(),
            continuous_usage: request.streaming.continuous_usage,
            split_reasoning: request.params.split_reasoning,
            reading: request.reading.clone(),
        }
    }

    /// A reader of one choice's answer, when the request's answers are not plain text.
    pub fn answer_reader(&self) -> Option<Box<dyn AnswerReader>> {
        self.reading.as_ref().map(Reading::reader)
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer
            .as_ref()
            .and_then(|t| t.decode(&[id], false).ok())
            .unwrap_or_default()
    }

    fn completion_logprobs(
        &self,
        logprobs: &[TokenLogprob],
        start_offset: usize,
    ) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        let mut offset = start_offset;
        for lp in logprobs {
            let text = self.token_text(lp.token);
            out.text_offset.push(offset);
            offset += text.len();
            out.tokens.push(text);
            out.token_logprobs.push(lp.logprob);
            out.top_logprobs.push(
                lp.top
                    .iter()
                    .map(|&(id, l)| (self.token_text(id), serde_json::json!(l)))
                    .collect(),
            );
        }
        out
    }

    fn chat_logprobs(&self, logprobs: &[TokenLogprob]) -> ChatLogprobs {
        let content = logprobs
            .iter()
            .map(|lp| {
                let token = self.token_text(lp.token);
                ChatTokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob: lp.logprob,
                    top_logprobs: lp
                        .top
                        .iter()
                        .map(|&(id, logprob)| {
                            let token = self.token_text(id);
                            ChatTopLogprob {
                                bytes: token.as_bytes().to_vec(),
                                token,
                                logprob,
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        ChatLogprobs { content }
    }

    /// Chat streams open every choice with a `role` delta.
    pub fn role_chunks(&self, prompt_lens: &[usize]) -> Vec<String> {
        if self.endpoint != Endpoint::Chat {
            return Vec::new();
        }
        prompt_lens
            .iter()
            .enumerate()
            .map(|(index, &prompt)| {
                let role = ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        ..ChatDelta::default()
                    },
                    logprobs: None,
                    finish_reason: None,
                };
                let usage = self.continuous_usage.then(|| Usage::queued(prompt));
                to_json(&self.chat_chunk(vec![role], usage, None))
            })
            .collect()
    }

    /// One stream chunk for one choice's new output; `offset` is the choice's text length so
    /// far; `reader` reads the answer as tool calls.
    pub fn output_chunk(
        &self,
        out: &SeqOutput,
        offset: usize,
        reader: Option<&mut Box<dyn AnswerReader>>,
    ) -> String {
        let usage = self.continuous_usage.then(|| {
            Usage::new(
                out.num_prompt_tokens,
                out.num_output_tokens,
                out.num_cached_prompt_tokens,
            )
            .with_reasoning(self.split_reasoning.then_some(out.num_reasoning_tokens))
        });
        let timings = out.timings.as_ref().map(|t| {
            Timings::new(
                t,
                out.num_prompt_tokens,
                out.num_cached_prompt_tokens,
                out.num_output_tokens,
            )
        });
        match self.endpoint {
            Endpoint::Completions => {
                to_json(&self.completion(vec![self.completion_choice(out, offset)], usage, timings))
            }
            Endpoint::Chat => {
                let mut reasoning = out.reasoning.clone();
                let (content, tool_calls, called) = match reader {
                    Some(reader) => {
                        let mut events = reader.push(&out.text);
                        if out.finish.is_some() {
                            events.extend(reader.finish());
                        }
                        let (content, calls) = call_deltas(events, &mut reasoning);
                        let calls = (!calls.is_empty()).then_some(calls);
                        (content, calls, reader.called())
                    }
                    None => (
                        (!out.text.is_empty()).then(|| out.text.clone()),
                        None,
                        false,
                    ),
                };
                let choice = ChatChunkChoice {
                    index: out.index,
                    delta: ChatDelta {
                        role: None,
                        content,
                        reasoning_content: (!reasoning.is_empty()).then(|| reasoning.clone()),
                        reasoning: (!reasoning.is_empty()).then_some(reasoning),
                        tool_calls,
                    },
                    logprobs: self
                        .want_logprobs
                        .then(|| self.chat_logprobs(&out.logprobs)),
                    finish_reason: chat_finish_reason(out.finish, called),
                };
                to_json(&self.chat_chunk(vec![choice], usage, timings))
            }
        }
    }

    /// A `text_completion` body or stream chunk with this request's id, time and model.
    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Usage>,
        timings: Option<Timings>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            timings,
        }
    }

    /// One choice's output; `offset` is the choice's text length before it.
    fn completion_choice(&self, out: &SeqOutput, offset: usize) -> CompletionChoice {
        CompletionChoice {
            index: out.index,
            text: out.text.clone(),
            logprobs: self
                .want_logprobs
                .then(|| self.completion_logprobs(&out.logprobs, offset)),
            finish_reason: finish_reason(out.finish),
        }
    }

    /// A `chat.completion.chunk` with this request's id, time and model.
    fn chat_chunk(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Usage>,
        timings: Option<Timings>,
    ) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            timings,
        }
    }

    /// The final `include_usage` chunk: no choices, the request's totals and timings.
    pub fn usage_chunk(&self, usage: Usage, timings: Option<Timings>) -> String {
        match self.endpoint {
            Endpoint::Completions => to_json(&self.completion(Vec::new(), Some(usage), timings)),
            Endpoint::Chat => to_json(&self.chat_chunk(Vec::new(), Some(usage), timings)),
        }
    }

    /// The non-streaming body from every choice's collected output.
    pub fn full_response(
        &self,
        choices: Vec<SeqOutput>,
        usage: Usage,
        timings: Option<Timings>,
    ) -> Response {
        match self.endpoint {
            Endpoint::Completions => {
                let choices = choices
                    .iter()
                    .map(|c| self.completion_choice(c, 0))
                    .collect();
                Json(self.completion(choices, Some(usage), timings)).into_response()
            }
            Endpoint::Chat => Json(ChatResponse {
                id: self.id.clone(),
                object: "chat.completion",
                created: self.created,
                model: self.model.clone(),
                choices: choices
                    .iter()
                    .map(|c| {
                        let mut reasoning = c.reasoning.clone();
                        let (content, tool_calls, called) = match self.answer_reader() {
                            Some(mut reader) => {
                                let mut events = reader.push(&c.text);
                                events.extend(reader.finish());
                                let (content, calls) = whole_calls(events, &mut reasoning);
                                let calls = (!calls.is_empty()).then_some(calls);
                                (content, calls, reader.called())
                            }
                            None => (Some(c.text.clone()), None, false),
                        };
                        ChatChoice {
                            index: c.index,
                            message: ChatMessageOut {
                                role: "assistant",
                                content,
                                tool_calls,
                                reasoning_content: (!reasoning.is_empty())
                                    .then(|| reasoning.clone()),
                                reasoning: (!reasoning.is_empty()).then_some(reasoning),
                            },
                            logprobs: self.want_logprobs.then(|| self.chat_logprobs(&c.logprobs)),
                            finish_reason: chat_finish_reason(c.finish, called),
                        }
                    })
                    .collect(),
                usage,
                timings,
            })
            .into_response(),
        }
    }
}

/// A chat choice's finish reason: `tool_calls` when it stopped after calling tools.
fn chat_finish_reason(reason: Option<FinishReason>, called: bool) -> Option<&'static str> {
    match reason {
        Some(FinishReason::Stop) if called => Some("tool_calls"),
        other => finish_reason(other),
    }
}

/// A stream chunk's content and tool-call pieces from what the reader found; its reasoning
/// joins `reasoning`.
fn call_deltas(
    events: Vec<CallEvent>,
    reasoning: &mut String,
) -> (Option<String>, Vec<ToolCallDelta>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    for event in events {
        match event {
            CallEvent::Content(text) => content.push_str(&text),
            CallEvent::Reasoning(text) => reasoning.push_str(&text),
            CallEvent::Start { index, id, name } => calls.push(ToolCallDelta {
                index,
                id: Some(id),
                kind: Some("function"),
                function: FunctionDelta {
                    name: Some(name),
                    arguments: Some(String::new()),
                },
            }),
            CallEvent::Arguments { index, delta } => calls.push(ToolCallDelta {
                index,
                id: None,
                kind: None,
                function: FunctionDelta {
                    name: None,
                    arguments: Some(delta),
                },
            }),
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

/// A whole answer's content (`None` when it is only calls and whitespace) and calls; its
/// reasoning joins `reasoning`.
fn whole_calls(
    events: Vec<CallEvent>,
    reasoning: &mut String,
) -> (Option<String>, Vec<ToolCallOut>) {
    let mut content = String::new();
    let mut calls: Vec<ToolCallOut> = Vec::new();
    for event in events {
        match event {
            CallEvent::Content(text) => content.push_str(&text),
            CallEvent::Reasoning(text) => reasoning.push_str(&text),
            CallEvent::Start { id, name, .. } => calls.push(ToolCallOut {
                id,
                kind: "function",
                function: FunctionCallOut {
                    name,
                    arguments: String::new(),
                },
            }),
            CallEvent::Arguments { index, delta } => {
                if let Some(call) = calls.get_mut(index) {
                    call.function.arguments.push_str(&delta);
                }
            }
        }
    }
    let content = (calls.is_empty() || !content.trim().is_empty()).then_some(content);
    (content, calls)
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        ApiError::internal(format!("cannot encode a response: {e}"))
            .body()
            .to_string()
    })
}
