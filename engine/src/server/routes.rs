//! HTTP routes: authentication, body limits, and the OpenAI endpoints.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{stream, Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::engine_loop::{AddRequest, Command, SeqOutput, EVENT_CHANNEL_CAPACITY};
use super::harmony::HarmonyReader;
use super::metrics::Metrics;
use super::protocol::{
    unix_now, ApiError, ChatChoice, ChatChunk, ChatChunkChoice, ChatDelta, ChatLogprobs,
    ChatMessageOut, ChatResponse, ChatTokenLogprob, ChatTopLogprob, CompletionChoice,
    CompletionLogprobs, CompletionResponse, DetokenizeResponse, FunctionCallOut, FunctionDelta,
    ModelCard, ModelList, Timings, TokenizeResponse, ToolCallDelta, ToolCallOut, Usage,
};
use super::responses::{self, events::ResponseBuilder};
use super::tools::{CallEvent, CallFormat, CallReader};
use super::validate::{self, GenerateRequest, ModelInfo};
use crate::engine::{FinishReason, TokenLogprob};
use crate::grammar::{GrammarCompiler, TokenMatcher};
use crate::tokenizer::Tokenizer;

/// Set once the model is loaded and the engine loop runs.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub info: ModelInfo,
    /// Compiles requests' grammars (structured output, tool choices), or why it cannot.
    pub grammar: Result<Arc<GrammarCompiler>, String>,
    /// What `GET /version` answers: the engine, its device and the KV cache it holds.
    pub server_info: serde_json::Value,
    pub commands: std::sync::mpsc::Sender<Command>,
}

/// State shared by every handler.
pub struct AppState {
    pub served_names: Vec<String>,
    pub model_root: String,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub metrics: Arc<Metrics>,
    pub ready: OnceLock<Ready>,
    pub started: u64,
}

impl AppState {
    fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready
            .get()
            .ok_or_else(|| ApiError::unavailable("The model is still loading."))
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(unknown_route)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// With `--api-key`, every route but `/health` needs `Authorization: Bearer <key>`.
async fn authenticate(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &state.api_key {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if request.uri().path() != "/health" && presented != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

async fn unknown_route(uri: Uri) -> ApiError {
    ApiError::not_found_route(uri.path())
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.ready() {
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /version`: version, backend, device, model, dtypes and KV capacity, so that a load
/// generator can record who it measured.
async fn version(State(state): State<Arc<AppState>>) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(state.ready()?.server_info.clone()))
}

async fn models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let max_model_len = state.ready()?.info.limits.max_model_len();
    let data = state
        .served_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model",
            created: state.started,
            owned_by: "engine",
            root: state.model_root.clone(),
            max_model_len,
        })
        .collect();
    Ok(Json(ModelList {
        object: "list",
        data,
    }))
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The request body, or the error its rejection deserves.
fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(state.max_body_bytes)
        } else {
            ApiError::malformed(rejection.body_text())
        }
    })
}

/// `POST /tokenize`: a prompt, or chat messages rendered with the template, as token ids.
async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let body = body_bytes(&state, body)?;
    let ready = state.ready()?;
    let (tokenizer, info) = (ready.tokenizer.clone(), ready.info.clone());
    tokio::task::spawn_blocking(move || {
        let request = validate::tokenize_request(&body, &info, &tokenizer)?;
        let token_strs = request.token_strs.then(|| {
            request
                .tokens
                .iter()
                .map(|&id| tokenizer.id_to_token(id).unwrap_or_default())
                .collect()
        });
        Ok(Json(TokenizeResponse {
            count: request.tokens.len(),
            max_model_len: info.limits.max_model_len(),
            tokens: request.tokens,
            token_strs,
        }))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
}

/// `POST /detokenize`: token ids back to text (special tokens kept).
async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let body = body_bytes(&state, body)?;
    let ready = state.ready()?;
    let tokens = validate::detokenize_request(&body, &ready.info)?;
    let prompt = ready
        .tokenizer
        .decode(&tokens, false)
        .map_err(|e| ApiError::invalid("tokens", format!("cannot detokenize: {e:#}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completions,
    Chat,
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, body, Endpoint::Completions).await
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, body, Endpoint::Chat).await
}

async fn generate(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Response {
    let arrival = Instant::now();
    match start(&state, body, endpoint, arrival).await {
        Ok((request, events)) => {
            let writer = ChunkWriter::new(
                endpoint,
                &request,
                state.ready().map(|r| r.tokenizer.clone()),
            );
            if request.stream {
                stream_response(writer, request, events).into_response()
            } else {
                collect_response(writer, request, events).await
            }
        }
        Err(e) => e.into_response(),
    }
}

/// Validates the body (off the async workers: it tokenizes) and queues the request.
async fn start(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
    arrival: Instant,
) -> Result<(GenerateRequest, mpsc::Receiver<SeqOutput>), ApiError> {
    let body = body_bytes(state, body)?;
    let ready = state.ready()?;
    let tokenizer = ready.tokenizer.clone();
    let info = ready.info.clone();
    let compiler = ready.grammar.clone();
    let (request, checked, matcher) = tokio::task::spawn_blocking(move || {
        let request = match endpoint {
            Endpoint::Completions => validate::completion_request(&body, &info, &tokenizer),
            Endpoint::Chat => validate::chat_request(&body, &info, &tokenizer),
        }?;
        // The engine's limits before the grammar, whose compilation costs more.
        let checked = request.sequences(&info.limits)?;
        let matcher = compile_constraint(&request, &compiler)?;
        Ok::<_, ApiError>((request, checked, matcher))
    })
    .await
    .map_err(|e| ApiError::internal(format!("request validation failed: {e}")))??;
    let seqs = checked
        .into_iter()
        .map(|checked| (checked, matcher.clone()))
        .collect();
    let (events_tx, events_rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let (admitted_tx, admitted_rx) = oneshot::channel();
    ready
        .commands
        .send(Command::Add(AddRequest {
            seqs,
            events: events_tx,
            admitted: admitted_tx,
            arrival,
        }))
        .map_err(|_| ApiError::unavailable("The engine has stopped."))?;
    admitted_rx
        .await
        .map_err(|_| ApiError::unavailable("The engine has stopped."))??;
    Ok((request, events_rx))
}

/// The request's grammar, compiled (a grammar llguidance cannot compile is the client's
/// error, named by the field it came from).
fn compile_constraint(
    request: &GenerateRequest,
    compiler: &Result<Arc<GrammarCompiler>, String>,
) -> Result<Option<TokenMatcher>, ApiError> {
    let Some(constraint) = &request.constraint else {
        return Ok(None);
    };
    let compiler = compiler.as_ref().map_err(|why| {
        ApiError::invalid(
            &constraint.param,
            format!("structured output is unavailable with this model's tokenizer: {why}"),
        )
    })?;
    compiler.compile(&constraint.spec).map(Some).map_err(|e| {
        ApiError::invalid(
            &constraint.param,
            format!(
                "`{}` cannot be compiled to a grammar: {e:#}",
                constraint.param
            ),
        )
    })
}

fn finish_reason(reason: Option<FinishReason>) -> Option<&'static str> {
    reason.map(|r| match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Error => "error",
    })
}

/// Builds response bodies and stream chunks for one request.
struct ChunkWriter {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    tokenizer: Option<Arc<Tokenizer>>,
    want_logprobs: bool,
    continuous_usage: bool,
    /// Chat answers are split into reasoning and answer (`--reasoning-parser`).
    split_reasoning: bool,
    /// Answers are read as tool calls.
    tool_calls: Option<CallFormat>,
}

impl ChunkWriter {
    fn new(
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
            id: super::protocol::new_id(prefix),
            created: unix_now(),
            model: request.model.clone(),
            tokenizer: tokenizer.ok(),
            want_logprobs: request.params.logprobs.is_some(),
            continuous_usage: request.continuous_usage,
            split_reasoning: request.params.split_reasoning,
            tool_calls: request.tool_calls.clone(),
        }
    }

    /// A reader of one choice's answer as tool calls, or as a harmony stream, when the
    /// request has one.
    fn call_reader(&self) -> Option<AnswerReader> {
        self.tool_calls.clone().map(|format| match format {
            CallFormat::Harmony { calls } => AnswerReader::Harmony(HarmonyReader::new(calls)),
            other => AnswerReader::Calls(CallReader::new(other)),
        })
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
    fn role_chunks(&self, prompt_lens: &[usize]) -> Vec<String> {
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
    fn output_chunk(
        &self,
        out: &SeqOutput,
        offset: usize,
        reader: Option<&mut AnswerReader>,
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
    fn usage_chunk(&self, usage: Usage, timings: Option<Timings>) -> String {
        match self.endpoint {
            Endpoint::Completions => to_json(&self.completion(Vec::new(), Some(usage), timings)),
            Endpoint::Chat => to_json(&self.chat_chunk(Vec::new(), Some(usage), timings)),
        }
    }

    /// The non-streaming body from every choice's collected output.
    fn full_response(
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
                        let (content, tool_calls, called) = match self.call_reader() {
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

/// Reads one choice's answer: tool calls in the model's text, or gpt-oss's harmony stream.
enum AnswerReader {
    Calls(CallReader),
    Harmony(HarmonyReader),
}

impl AnswerReader {
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        match self {
            AnswerReader::Calls(r) => r.push(text),
            AnswerReader::Harmony(r) => r.push(text),
        }
    }

    fn finish(&mut self) -> Vec<CallEvent> {
        match self {
            AnswerReader::Calls(r) => r.finish(),
            AnswerReader::Harmony(r) => r.finish(),
        }
    }

    fn called(&self) -> bool {
        match self {
            AnswerReader::Calls(r) => r.called(),
            AnswerReader::Harmony(r) => r.called(),
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

/// Prompt tokens (and those of them served from the prefix cache, as the first choice of
/// each prompt found them) are counted once per prompt; completion and reasoning tokens
/// over every choice, whose latest outputs `choices` are, in choice-index order.
fn request_usage(request: &GenerateRequest, choices: &[SeqOutput]) -> Usage {
    let cached = choices
        .iter()
        .step_by(request.n.max(1))
        .map(|c| c.num_cached_prompt_tokens)
        .sum();
    let reasoning = choices.iter().map(|c| c.num_reasoning_tokens).sum();
    Usage::new(
        request.prompts.iter().map(Vec::len).sum(),
        choices.iter().map(|c| c.num_output_tokens).sum(),
        cached,
    )
    .with_reasoning(request.params.split_reasoning.then_some(reasoning))
}

/// The request's timings: those of the choice that finished last (arrival to its last
/// token the longest), with that choice's prompt and token counts.
fn request_timings(request: &GenerateRequest, choices: &[SeqOutput]) -> Option<Timings> {
    let (choice, t) = choices
        .iter()
        .filter_map(|c| Some((c, c.timings?)))
        .max_by(|(_, a), (_, b)| {
            (a.queue + a.prefill + a.decode).total_cmp(&(b.queue + b.prefill + b.decode))
        })?;
    let prompt = request
        .prompts
        .get(choice.index / request.n.max(1))
        .map_or(0, Vec::len);
    Some(Timings::new(
        &t,
        prompt,
        choice.num_cached_prompt_tokens,
        choice.num_output_tokens,
    ))
}

fn engine_failed() -> ApiError {
    ApiError::internal(
        "Generation stopped early: the engine failed or is shutting down (see the server log).",
    )
}

async fn collect_response(
    writer: ChunkWriter,
    request: GenerateRequest,
    mut events: mpsc::Receiver<SeqOutput>,
) -> Response {
    let total = request.prompts.len() * request.n;
    let mut choices: Vec<SeqOutput> = (0..total)
        .map(|index| SeqOutput {
            index,
            ..SeqOutput::default()
        })
        .collect();
    let mut finished = 0;
    while finished < total {
        let Some(out) = events.recv().await else {
            return engine_failed().into_response();
        };
        let choice = &mut choices[out.index];
        choice.text.push_str(&out.text);
        choice.reasoning.push_str(&out.reasoning);
        choice.logprobs.extend(out.logprobs);
        choice.num_output_tokens = out.num_output_tokens;
        choice.num_cached_prompt_tokens = out.num_cached_prompt_tokens;
        choice.num_reasoning_tokens = out.num_reasoning_tokens;
        if out.finish.is_some() {
            choice.finish = out.finish;
            choice.timings = out.timings;
            finished += 1;
        }
    }
    let usage = request_usage(&request, &choices);
    let timings = request_timings(&request, &choices);
    writer.full_response(choices, usage, timings)
}

/// Where a stream is: role chunks sent, choices still open, tokens so far.
struct StreamState {
    writer: ChunkWriter,
    request: GenerateRequest,
    events: mpsc::Receiver<SeqOutput>,
    text_lens: Vec<usize>,
    /// Each choice's tool-call or harmony reader (empty without either).
    readers: Vec<AnswerReader>,
    /// Each choice's latest counts (its text is not kept).
    counts: Vec<SeqOutput>,
    open: usize,
    started: bool,
    done: bool,
}

impl StreamState {
    /// The next batch of SSE payloads; `None` when the stream is over.
    async fn next_payloads(&mut self) -> Option<Vec<String>> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            let lens: Vec<usize> = self
                .request
                .prompts
                .iter()
                .flat_map(|p| std::iter::repeat_n(p.len(), self.request.n))
                .collect();
            let chunks = self.writer.role_chunks(&lens);
            if !chunks.is_empty() {
                return Some(chunks);
            }
        }
        if self.open == 0 {
            self.done = true;
            let mut tail = Vec::new();
            if self.request.include_usage {
                tail.push(self.writer.usage_chunk(
                    request_usage(&self.request, &self.counts),
                    request_timings(&self.request, &self.counts),
                ));
            }
            tail.push("[DONE]".to_string());
            return Some(tail);
        }
        match self.events.recv().await {
            Some(out) => {
                let chunk = self.writer.output_chunk(
                    &out,
                    self.text_lens[out.index],
                    self.readers.get_mut(out.index),
                );
                self.text_lens[out.index] += out.text.len();
                let counts = &mut self.counts[out.index];
                counts.num_output_tokens = out.num_output_tokens;
                counts.num_cached_prompt_tokens = out.num_cached_prompt_tokens;
                counts.num_reasoning_tokens = out.num_reasoning_tokens;
                if out.finish.is_some() {
                    counts.timings = out.timings;
                    self.open -= 1;
                }
                if out.finish == Some(FinishReason::Error) {
                    let error = ApiError::internal(format!(
                        "Generation of choice {} failed; the other choices go on (see the server log).",
                        out.index
                    ));
                    return Some(vec![chunk, error.body().to_string()]);
                }
                Some(vec![chunk])
            }
            None => {
                self.done = true;
                Some(vec![
                    engine_failed().body().to_string(),
                    "[DONE]".to_string(),
                ])
            }
        }
    }
}

/// The chat stream's SSE payloads (chunks as JSON text, error bodies, `[DONE]`).
fn chat_payloads(
    writer: ChunkWriter,
    request: GenerateRequest,
    events: mpsc::Receiver<SeqOutput>,
) -> impl Stream<Item = String> {
    let total = request.prompts.len() * request.n;
    let readers = (0..total).filter_map(|_| writer.call_reader()).collect();
    let state = StreamState {
        writer,
        request,
        events,
        text_lens: vec![0; total],
        readers,
        counts: vec![SeqOutput::default(); total],
        open: total,
        started: false,
        done: false,
    };
    let payloads = stream::unfold(state, |mut state| async move {
        state.next_payloads().await.map(|p| (p, state))
    });
    payloads.flat_map(stream::iter)
}

fn stream_response(
    writer: ChunkWriter,
    request: GenerateRequest,
    events: mpsc::Receiver<SeqOutput>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(chat_payloads(writer, request, events).map(|data| Ok(Event::default().data(data))))
}

/// `POST /v1/responses`: the body read as the chat request it describes (streamed inside,
/// with usage), answered as the Responses API's events, or as the final response when the
/// request did not ask for a stream. A chat validation error names the Responses field.
async fn responses(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let read = body_bytes(&state, body).and_then(|bytes| responses::request::read(&bytes));
    let request = match read {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    let chat_body = Bytes::from(request.chat_body.to_string());
    let (chat, events) = match start(&state, Ok(chat_body), Endpoint::Chat, arrival).await {
        Ok(started) => started,
        Err(mut e) => {
            e.param = e.param.as_deref().map(responses::request::responses_param);
            return e.into_response();
        }
    };
    let writer = ChunkWriter::new(
        Endpoint::Chat,
        &chat,
        state.ready().map(|r| r.tokenizer.clone()),
    );
    let mut builder = ResponseBuilder::new(chat.model.clone(), request.echo, unix_now());
    let opening = builder.start();
    let payloads = chat_payloads(writer, chat, events);
    if request.stream {
        let events = stream::iter(opening).chain(
            payloads
                .map(move |payload| builder.push(&payload))
                .flat_map(stream::iter),
        );
        return Sse::new(events.map(|e| {
            Ok::<_, Infallible>(Event::default().event(e.kind).data(e.data.to_string()))
        }))
        .into_response();
    }
    let mut payloads = std::pin::pin!(payloads);
    let mut last = None;
    while let Some(payload) = payloads.next().await {
        last = builder.push(&payload).pop().or(last);
    }
    let response = builder
        .end()
        .pop()
        .or(last)
        .map(|event| event.data["response"].clone())
        .unwrap_or_default();
    if response["status"] == "failed" {
        let mut failed = engine_failed();
        if let Some(message) = response["error"]["message"].as_str() {
            failed.message = message.to_string();
        }
        return failed.into_response();
    }
    Json(response).into_response()
}
