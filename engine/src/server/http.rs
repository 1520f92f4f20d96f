//! The HTTP server: its router, authentication and body limit, and the handlers of the
//! OpenAI endpoints (what `/version` and `/v1/models` answer is `info`'s).

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
use futures::{stream, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::engine_loop::{AddRequest, Command, SeqOutput, EVENT_CHANNEL_CAPACITY};
use super::error::ApiError;
use super::info;
use super::metrics::Metrics;
use super::request::{chat, completion, constraints, tokenize, GenerateRequest, ModelInfo};
use super::response::protocol::{unix_now, DetokenizeResponse, ModelList, TokenizeResponse};
use super::response::stream::{chat_payloads, collect_response, engine_failed, stream_response};
use super::response::writer::ChunkWriter;
use super::response::Endpoint;
use super::responses_api::{self, events::ResponseBuilder};
use crate::grammar::GrammarCompiler;
use crate::tokenizer::Tokenizer;

/// Set once the model is loaded and the engine loop runs.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub info: ModelInfo,
    /// Compiles requests' grammars (structured output, tool choices), or why it cannot.
    pub grammar: Result<Arc<GrammarCompiler>, String>,
    /// What `GET /version` answers: the engine, its device and the KV cache it holds.
    pub version: serde_json::Value,
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
    pub fn ready(&self) -> Result<&Ready, ApiError> {
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
    Ok(Json(state.ready()?.version.clone()))
}

async fn models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let max_model_len = state.ready()?.info.limits.max_model_len();
    Ok(Json(info::model_list(
        &state.served_names,
        state.started,
        &state.model_root,
        max_model_len,
    )))
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
        let request = tokenize::tokenize_request(&body, &info, &tokenizer)?;
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
    let tokens = tokenize::detokenize_request(&body, &ready.info)?;
    let prompt = ready
        .tokenizer
        .decode(&tokens, false)
        .map_err(|e| ApiError::invalid("tokens", format!("cannot detokenize: {e:#}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
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
            if request.streaming.stream {
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
            Endpoint::Completions => completion::completion_request(&body, &info, &tokenizer),
            Endpoint::Chat => chat::chat_request(&body, &info, &tokenizer),
        }?;
        // The engine's limits before the grammar, whose compilation costs more.
        let checked = request.sequences(&info.limits)?;
        let matcher = constraints::compile(request.constraint.as_ref(), &compiler)?;
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

/// `POST /v1/responses`: the body read as the chat request it describes (streamed inside,
/// with usage), answered as the Responses API's events, or as the final response when the
/// request did not ask for a stream. A chat validation error names the Responses field.
async fn responses(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let read = body_bytes(&state, body).and_then(|bytes| responses_api::request::read(&bytes));
    let request = match read {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    let chat_body = Bytes::from(request.chat_body.to_string());
    let (chat, events) = match start(&state, Ok(chat_body), Endpoint::Chat, arrival).await {
        Ok(started) => started,
        Err(mut e) => {
            e.param = e
                .param
                .as_deref()
                .map(responses_api::request::responses_param);
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
