//! A built-in OpenAI-compatible server with known timing, for self-calibration and tests.
//!
//! Each request (after waiting for a slot when `slots > 0`, FIFO) streams
//! `ceil(max_tokens / tokens_per_chunk)` content chunks: chunk j is sent at
//! `ttft · ttft_factor + j · itl` after the request arrived (its bytes' kernel receive stamp)
//! or, when it waited for a slot, after it got one, on absolute deadlines so timing does not
//! drift. Chat streams start with a role-only prelude chunk, as vLLM does; a chat answer's
//! first `reasoning_tokens` tokens stream as reasoning, in the field current vLLM uses
//! (`delta.reasoning`) or the one SGLang, llama.cpp and DeepSeek use (`reasoning_content`),
//! unless the request turns thinking off (`chat_template_kwargs.enable_thinking: false`). Fault
//! injection: a seeded fraction of requests answered with an error status, and streams cut
//! (connection aborted) after a number of tokens. `/metrics` exports the running and waiting
//! requests under vLLM's gauge names, so the saturation judgement sees the queue it would see
//! on a real server.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use axum::{Json, Router};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::stamped_tcp::{Arrivals, StampedTcp};

/// Behaviour of the mock server.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Address to bind (`127.0.0.1:0` picks a free port).
    pub addr: SocketAddr,
    pub model: String,
    pub ttft: Duration,
    pub itl: Duration,
    pub tokens_per_chunk: u32,
    /// At most this many requests served at once (0 = unlimited); the rest queue FIFO.
    pub slots: usize,
    /// Multiplies the TTFT (an A/B "slower" server).
    pub ttft_factor: f64,
    /// Fraction of requests answered with `error_status` instead of a completion.
    pub error_rate: f64,
    pub error_status: u16,
    /// Abort the stream's connection after this many tokens.
    pub cut_after: Option<u32>,
    /// Seed of the error-injection draws.
    pub seed: u64,
    /// Where to log each streamed request's timing (see [`MockEvent`]), if anywhere.
    pub log: Option<MockLog>,
    /// A chat answer's first this many tokens are reasoning (at most the whole answer).
    pub reasoning_tokens: u32,
    /// The delta field reasoning streams in.
    pub reasoning_field: ReasoningField,
    /// Report `usage.completion_tokens_details.reasoning_tokens` in usage objects.
    pub reasoning_usage: bool,
    /// Where to keep every request body received, when anywhere (tests).
    pub bodies: Option<BodyLog>,
    /// Serve HTTPS with this configuration (`--tls-cert` / `--tls-key`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Request bodies received, each with its `x-loadgen-request-id`.
pub type BodyLog = Arc<Mutex<Vec<(Option<u64>, Value)>>>;

/// The chat delta field a server streams reasoning in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ReasoningField {
    /// `delta.reasoning`: current vLLM.
    #[default]
    #[value(name = "reasoning")]
    Reasoning,
    /// `delta.reasoning_content`: SGLang, llama.cpp, DeepSeek's API, older vLLM.
    #[value(name = "reasoning_content")]
    ReasoningContent,
}

impl ReasoningField {
    fn name(self) -> &'static str {
        match self {
            ReasoningField::Reasoning => "reasoning",
            ReasoningField::ReasoningContent => "reasoning_content",
        }
    }
}

/// The mock's own account of one streamed request, so that its lateness can be told apart
/// from the client's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MockEvent {
    /// The client's request id (`x-loadgen-request-id`), when sent.
    pub id: Option<u64>,
    /// When the handler received the request.
    pub arrival: Instant,
    /// The same instant on the wall clock (comparable across processes).
    pub arrival_wall: SystemTime,
    /// How late the first content chunk left the mock against its configured TTFT, in ms.
    pub first_chunk_lateness_ms: f64,
}

/// A shared log of [`MockEvent`]s: kept in memory ([`MockLog::default`], read back with
/// [`MockLog::events`]), or written as JSON lines (`id`, `arrival_unix_us`,
/// `first_chunk_lateness_ms`) to a file by a thread of its own ([`MockLog::to_file`]), for a
/// mock in another process; the handler only hands the event over, never waits on the disk.
#[derive(Debug, Clone, Default)]
pub struct MockLog {
    events: Arc<Mutex<Vec<MockEvent>>>,
    file: Option<std::sync::mpsc::Sender<MockEvent>>,
}

impl MockLog {
    /// A log written to `path` (created, or truncated) as events happen.
    pub fn to_file(path: &std::path::Path) -> Result<MockLog> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let (tx, rx) = std::sync::mpsc::channel::<MockEvent>();
        std::thread::Builder::new()
            .name("mock-arrival-log".into())
            .spawn(move || {
                let mut out = std::io::LineWriter::new(file);
                for event in rx {
                    let arrival_us = event
                        .arrival_wall
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_micros());
                    let line = json!({"id": event.id, "arrival_unix_us": arrival_us,
                        "first_chunk_lateness_ms": event.first_chunk_lateness_ms});
                    // The log is a test aid: a full disk loses lines, never a response.
                    let _ = writeln!(out, "{line}");
                }
            })
            .context("starting the arrival-log writer")?;
        Ok(MockLog {
            events: Arc::default(),
            file: Some(tx),
        })
    }

    /// The events so far (of a log kept in memory).
    pub fn events(&self) -> Vec<MockEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    fn push(&self, event: MockEvent) {
        if let Some(file) = &self.file {
            let _ = file.send(event);
        } else if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            model: "loadgen-mock".to_string(),
            ttft: Duration::from_millis(50),
            itl: Duration::from_millis(10),
            tokens_per_chunk: 1,
            slots: 0,
            ttft_factor: 1.0,
            error_rate: 0.0,
            error_status: 500,
            cut_after: None,
            seed: 0,
            log: None,
            reasoning_tokens: 0,
            reasoning_field: ReasoningField::default(),
            reasoning_usage: false,
            bodies: None,
            tls: None,
        }
    }
}

/// A running mock; stop it with [`MockHandle::shutdown`] (dropping it leaves it running).
pub struct MockHandle {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl MockHandle {
    /// Stops accepting connections and waits for the server task.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }

    /// Waits until the server stops (it runs until shut down).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// A mock on its own runtime (two worker threads), apart from the client's: a calibration
/// then measures the client, not the two sharing one scheduler, and the mock logs its own
/// lateness. (One mock thread measured worse: it queues its own events at 30,000 per second.)
pub struct ThreadedMock {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadedMock {
    /// Starts the mock; returns once it listens.
    pub fn start(cfg: MockConfig) -> Result<(SocketAddr, ThreadedMock)> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("loadgen-mock".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("loadgen-mock")
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match spawn(cfg).await {
                        Ok((addr, handle)) => {
                            let _ = ready_tx.send(Ok(addr));
                            let _ = stop_rx.await;
                            handle.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .context("starting the mock's thread")?;
        let addr = ready_rx
            .recv()
            .context("the mock's thread ended before listening")??;
        Ok((
            addr,
            ThreadedMock {
                stop: Some(stop_tx),
                thread: Some(thread),
            },
        ))
    }

    /// Stops the mock and waits for its thread.
    pub fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct MockState {
    cfg: MockConfig,
    /// Requests received on the generation routes.
    received: std::sync::atomic::AtomicU64,
    slots: Option<Arc<Semaphore>>,
    /// Requests waiting for a slot now (exported as vLLM's `num_requests_waiting`).
    waiting: Arc<std::sync::atomic::AtomicU64>,
    rng: Mutex<StdRng>,
}

/// Pending connections the listener queues: room for a thousand streams opening at once.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepts connections as [`StampedTcp`] streams (with `TCP_NODELAY`), so that a request's
/// timing starts when its bytes arrived, not when a busy mock got round to reading them;
/// with a TLS configuration, each connection's handshake runs in its own task, on its first
/// read or write, so that a thousand clients opening at once are not served one by one.
struct StampedListener {
    tcp: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl axum::serve::Listener for StampedListener {
    type Io = MockIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (MockIo, SocketAddr) {
        loop {
            match self.tcp.accept().await {
                Ok((tcp, addr)) => {
                    let _ = tcp.set_nodelay(true);
                    let stamped = StampedTcp::new(tcp);
                    let arrivals = stamped.arrivals();
                    let state = match &self.tls {
                        None => Transport::Plain(stamped),
                        Some(acceptor) => Transport::Handshake(Box::new(acceptor.accept(stamped))),
                    };
                    return (MockIo { arrivals, state }, addr);
                }
                // Out of descriptors, or a connection reset before it was accepted: the
                // listener itself is fine; wait a moment rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// An accepted connection with its arrivals: plain, or TLS over the stamped stream.
pub struct MockIo {
    arrivals: Arc<Arrivals>,
    state: Transport,
}

enum Transport {
    Plain(StampedTcp),
    /// The TLS handshake, driven by the connection's first read or write.
    Handshake(Box<tokio_rustls::Accept<StampedTcp>>),
    Tls(Box<tokio_rustls::server::TlsStream<StampedTcp>>),
}

impl MockIo {
    fn arrivals(&self) -> Arc<Arrivals> {
        self.arrivals.clone()
    }

    /// Finishes the handshake, if one is under way.
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Transport::Handshake(accept) = &mut self.state {
            let tls = std::task::ready!(std::future::Future::poll(
                std::pin::Pin::new(accept.as_mut()),
                cx
            ))?;
            self.state = Transport::Tls(Box::new(tls));
        }
        std::task::Poll::Ready(Ok(()))
    }
}

/// Runs `$op` on the connection's stream once its handshake (if any) is done.
macro_rules! on_stream {
    ($self:ident, $cx:ident, $io:ident => $op:expr) => {{
        let this = $self.get_mut();
        std::task::ready!(this.poll_ready($cx))?;
        match &mut this.state {
            Transport::Plain($io) => {
                let $io = std::pin::Pin::new($io);
                $op
            }
            Transport::Tls($io) => {
                let $io = std::pin::Pin::new($io.as_mut());
                $op
            }
            Transport::Handshake(_) => unreachable!("the handshake finished above"),
        }
    }};
}

impl tokio::io::AsyncRead for MockIo {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        on_stream!(self, cx, io => io.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for MockIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        on_stream!(self, cx, io => io.poll_write(cx, buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        on_stream!(self, cx, io => io.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        on_stream!(self, cx, io => io.poll_shutdown(cx))
    }
}

/// The arrivals of the connection a request came over (axum's connect info).
#[derive(Debug, Clone)]
struct ConnectionArrivals(Arc<Arrivals>);

impl Connected<IncomingStream<'_, StampedListener>> for ConnectionArrivals {
    fn connect_info(stream: IncomingStream<'_, StampedListener>) -> Self {
        ConnectionArrivals(stream.io().arrivals())
    }
}

/// Starts the mock on the current tokio runtime; returns its bound address.
pub async fn spawn(cfg: MockConfig) -> Result<(SocketAddr, MockHandle)> {
    let listener =
        listen(cfg.addr).with_context(|| format!("binding mock server to {}", cfg.addr))?;
    let addr = listener.local_addr()?;
    let tls = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let state = Arc::new(MockState {
        slots: (cfg.slots > 0).then(|| Arc::new(Semaphore::new(cfg.slots))),
        rng: Mutex::new(StdRng::seed_from_u64(cfg.seed)),
        received: std::sync::atomic::AtomicU64::new(0),
        waiting: Arc::default(),
        cfg,
    });
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/generate_stream", post(generate_stream))
        .with_state(state);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let listener = StampedListener { tcp: listener, tls };
    let task = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<ConnectionArrivals>(),
        )
        .with_graceful_shutdown(async {
            let _ = stop_rx.await;
        })
        .await;
    });
    Ok((
        addr,
        MockHandle {
            stop: Some(stop_tx),
            task,
        },
    ))
}

async fn version() -> Json<Value> {
    Json(json!({"version": format!("loadgen-mock {}", env!("CARGO_PKG_VERSION"))}))
}

/// `GET /metrics`: the requests received so far, and the running and waiting gauges under
/// vLLM's names (as the scraper reads them from a real server), in Prometheus text.
async fn metrics(State(s): State<Arc<MockState>>) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut text = format!(
        "# TYPE loadgen_mock_requests_total counter\nloadgen_mock_requests_total {}\n",
        s.received.load(Relaxed)
    );
    let model = &s.cfg.model;
    if let Some(sem) = &s.slots {
        let running = s.cfg.slots - sem.available_permits();
        let _ = writeln!(
            text,
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{model}\"}} {running}"
        );
    }
    let _ = writeln!(
        text,
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"{model}\"}} {}",
        s.waiting.load(Relaxed)
    );
    text
}

/// Counts one request as waiting for a slot while it lives (a dropped request stops waiting).
struct Waiting(Arc<std::sync::atomic::AtomicU64>);

impl Waiting {
    fn start(count: &Arc<std::sync::atomic::AtomicU64>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Waiting(count.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn models(State(s): State<Arc<MockState>>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": s.cfg.model, "object": "model", "owned_by": "loadgen"}]}),
    )
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "mock_error", "param": null, "code": status.as_u16()}});
    let mut resp = (status, Json(body)).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    resp
}

fn words(v: &Value) -> u64 {
    v.as_str()
        .map_or(0, |s| s.split_whitespace().count() as u64)
}

/// The parts of a request the mock honours.
struct Ask {
    chat: bool,
    /// TGI's native stream: one event per chunk with `token`, no `[DONE]`.
    tgi: bool,
    prompt_tokens: u64,
    max_tokens: u32,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// `chat_template_kwargs.enable_thinking` is not `false` (Qwen3's thinking switch).
    thinking: bool,
}

/// The API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Completions,
    Chat,
    Tgi,
}

fn parse_ask(body: &Value, format: Format) -> Ask {
    if format == Format::Tgi {
        let max_tokens = body["parameters"]["max_new_tokens"].as_u64().unwrap_or(20) as u32;
        return Ask {
            chat: false,
            tgi: true,
            prompt_tokens: words(&body["inputs"]),
            max_tokens: max_tokens.max(1),
            stream: true,
            include_usage: false,
            continuous_usage: false,
            thinking: false,
        };
    }
    let chat = format == Format::Chat;
    let prompt_tokens = if chat {
        body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().map(|msg| words(&msg["content"])).sum())
    } else {
        match &body["prompt"] {
            Value::Array(items) if items.iter().all(Value::is_number) => items.len() as u64,
            Value::Array(items) => items.first().map_or(0, words),
            other => words(other),
        }
    };
    let max_tokens = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
        .unwrap_or(16) as u32;
    Ask {
        chat,
        tgi: false,
        prompt_tokens,
        max_tokens: max_tokens.max(1),
        stream: body["stream"].as_bool().unwrap_or(false),
        include_usage: body["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        continuous_usage: body["stream_options"]["continuous_usage_stats"]
            .as_bool()
            .unwrap_or(false),
        thinking: body["chat_template_kwargs"]["enable_thinking"] != false,
    }
}

async fn completions(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Completions).await
}

async fn chat_completions(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Chat).await
}

async fn generate_stream(
    State(s): State<Arc<MockState>>,
    ConnectInfo(conn): ConnectInfo<ConnectionArrivals>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    serve(s, &conn, request_id(&headers), body, Format::Tgi).await
}

fn request_id(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(crate::client::REQUEST_ID_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

async fn serve(
    s: Arc<MockState>,
    conn: &ConnectionArrivals,
    id: Option<u64>,
    body: Bytes,
    format: Format,
) -> Response {
    // The request's last bytes were the newest its connection had when the handler ran.
    let now = (Instant::now(), SystemTime::now());
    let arrived = conn.0.latest().map_or(now.0, |at| at.min(now.0));
    let arrival = (arrived, now.1 - (now.0 - arrived));
    s.received
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error_response(StatusCode::BAD_REQUEST, "request body is not JSON");
    };
    if let Some(bodies) = &s.cfg.bodies {
        if let Ok(mut bodies) = bodies.lock() {
            bodies.push((id, body.clone()));
        }
    }
    let ask = parse_ask(&body, format);
    let fail = s.cfg.error_rate > 0.0
        && s.rng
            .lock()
            .map(|mut r| r.random::<f64>() < s.cfg.error_rate)
            .unwrap_or(false);
    if fail {
        let status =
            StatusCode::from_u16(s.cfg.error_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error_response(status, "injected failure");
    }
    // Timing starts at the request's arrival, or when it got a slot after waiting for one.
    let (permit, start) = match &s.slots {
        Some(sem) => match sem.clone().try_acquire_owned() {
            Ok(p) => (Some(p), arrival.0),
            Err(_) => {
                let waiting = Waiting::start(&s.waiting);
                let acquired = sem.clone().acquire_owned().await;
                drop(waiting);
                match acquired {
                    Ok(p) => (Some(p), Instant::now()),
                    Err(_) => {
                        return error_response(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                    }
                }
            }
        },
        None => (None, arrival.0),
    };
    let plan = Timing {
        start,
        ttft: s.cfg.ttft.mul_f64(s.cfg.ttft_factor.max(0.0)),
        itl: s.cfg.itl,
        per_chunk: s.cfg.tokens_per_chunk.max(1),
        total: ask.max_tokens,
        cut_after: s.cfg.cut_after,
    };
    if ask.stream {
        let log = s.cfg.log.clone().map(|log| (log, id, arrival));
        let reasoning = Reasoning {
            tokens: if ask.chat && ask.thinking {
                s.cfg.reasoning_tokens
            } else {
                0
            },
            field: s.cfg.reasoning_field,
            usage: s.cfg.reasoning_usage,
            answer_tag: format!("r{} ", id.unwrap_or(0)),
        };
        stream_response(s.cfg.model.clone(), ask, plan, reasoning, permit, log)
    } else {
        let chunks = plan.total.div_ceil(plan.per_chunk);
        tokio::time::sleep_until(plan.deadline(chunks - 1).into()).await;
        drop(permit);
        let text = "tok ".repeat(plan.total as usize);
        let choice = if ask.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": text, "finish_reason": "length"})
        };
        Json(json!({
            "id": "mock", "object": if ask.chat { "chat.completion" } else { "text_completion" },
            "model": s.cfg.model, "choices": [choice],
            "usage": usage(ask.prompt_tokens, u64::from(plan.total)),
        }))
        .into_response()
    }
}

struct Timing {
    start: Instant,
    ttft: Duration,
    itl: Duration,
    per_chunk: u32,
    total: u32,
    cut_after: Option<u32>,
}

impl Timing {
    fn deadline(&self, chunk: u32) -> Instant {
        self.start + self.ttft + self.itl * chunk
    }
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// How a chat stream's answer starts with reasoning.
struct Reasoning {
    /// The answer's first this many tokens.
    tokens: u32,
    field: ReasoningField,
    /// Usage objects carry `completion_tokens_details.reasoning_tokens`.
    usage: bool,
    /// A chat answer's first word, `r<request id> `, so that a client sending the answer
    /// back (a session's history) can be checked to send this answer.
    answer_tag: String,
}

impl Reasoning {
    /// Writes the usage object after `sent` tokens to `out` (no allocation of its own: the
    /// mock's CPU per event is what a calibration must keep small).
    fn write_usage(&self, out: &mut String, prompt: u64, sent: u32) {
        let c = u64::from(sent);
        let _ = write!(
            out,
            r#"{{"prompt_tokens":{prompt},"completion_tokens":{c},"total_tokens":{}"#,
            prompt + c
        );
        if self.usage {
            let _ = write!(
                out,
                r#","completion_tokens_details":{{"reasoning_tokens":{}}}"#,
                sent.min(self.tokens)
            );
        }
        out.push('}');
    }
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// State of one streaming response.
struct StreamState {
    model: String,
    ask: Ask,
    timing: Timing,
    reasoning: Reasoning,
    chunk: u32,
    sent_tokens: u32,
    prelude_sent: bool,
    finished: bool,
    _permit: Option<OwnedSemaphorePermit>,
    /// A content event's text up to its choice's fields.
    chunk_prefix: String,
    /// Where to log the first chunk's lateness: the log, the request id, its arrival.
    log: Option<(MockLog, Option<u64>, (Instant, SystemTime))>,
}

fn stream_response(
    model: String,
    ask: Ask,
    timing: Timing,
    reasoning: Reasoning,
    permit: Option<OwnedSemaphorePermit>,
    log: Option<(MockLog, Option<u64>, (Instant, SystemTime))>,
) -> Response {
    let object = if ask.chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk_prefix = format!(
        r#"data: {{"id":"mock","object":"{object}","model":{},"choices":[{{"index":0,"#,
        Value::from(model.as_str())
    );
    let state = StreamState {
        chunk_prefix,
        log,
        prelude_sent: !ask.chat,
        model,
        ask,
        timing,
        reasoning,
        chunk: 0,
        sent_tokens: 0,
        finished: false,
        _permit: permit,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.finished {
            return None;
        }
        let object = if st.ask.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        if !st.prelude_sent {
            st.prelude_sent = true;
            let v = json!({"id": "mock", "object": object, "model": st.model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
            return Some((Ok(sse(&v)), st));
        }
        if st.sent_tokens >= st.timing.total {
            st.finished = true;
            if st.ask.tgi {
                // TGI ends the stream after the event that carries `details`.
                return None;
            }
            let mut out = String::new();
            if st.ask.include_usage {
                let _ = write!(
                    out,
                    r#"data: {{"id":"mock","object":"{object}","model":{},"choices":[],"usage":"#,
                    Value::from(st.model.as_str()),
                );
                st.reasoning
                    .write_usage(&mut out, st.ask.prompt_tokens, st.sent_tokens);
                out.push_str("}\n\n");
            }
            out.push_str("data: [DONE]\n\n");
            return Some((Ok(Bytes::from(out)), st));
        }
        if st.timing.cut_after.is_some_and(|c| st.sent_tokens >= c) {
            // Cut when the next chunk would be due, so the chunks before it are flushed.
            tokio::time::sleep_until(st.timing.deadline(st.chunk).into()).await;
            st.finished = true;
            return Some((Err(std::io::Error::other("mock: stream cut")), st));
        }
        tokio::time::sleep_until(st.timing.deadline(st.chunk).into()).await;
        if st.chunk == 0 {
            if let Some((log, id, arrival)) = st.log.take() {
                let late = Instant::now().saturating_duration_since(st.timing.deadline(0));
                log.push(MockEvent {
                    id,
                    arrival: arrival.0,
                    arrival_wall: arrival.1,
                    first_chunk_lateness_ms: late.as_secs_f64() * 1000.0,
                });
            }
        }
        let k = st.timing.per_chunk.min(st.timing.total - st.sent_tokens);
        // Of this chunk's tokens, those before the reasoning ends are reasoning.
        let thinking = st.reasoning.tokens.saturating_sub(st.sent_tokens).min(k);
        let first_answer_token = st.reasoning.tokens.checked_sub(st.sent_tokens);
        st.sent_tokens += k;
        st.chunk += 1;
        if st.ask.tgi {
            let last = st.sent_tokens == st.timing.total;
            let text = "tok ".repeat(k as usize);
            let (generated, details) = if last {
                (
                    Value::from("tok ".repeat(st.sent_tokens as usize)),
                    json!({"finish_reason": "length", "generated_tokens": st.sent_tokens, "seed": null}),
                )
            } else {
                (Value::Null, Value::Null)
            };
            let v = json!({"index": st.sent_tokens,
                "token": {"id": 1, "text": text, "logprob": 0.0, "special": false},
                "generated_text": generated, "details": details});
            return Some((Ok(sse(&v)), st));
        }
        // Written from a template rather than a JSON tree: at thousands of events per second
        // the mock's own CPU time is what a calibration must keep small.
        let finish = if st.sent_tokens == st.timing.total {
            r#""length""#
        } else {
            "null"
        };
        let mut event = String::with_capacity(st.chunk_prefix.len() + 160);
        event.push_str(&st.chunk_prefix);
        if st.ask.chat {
            event.push_str(r#""delta":{"#);
            if thinking > 0 {
                let _ = write!(event, r#""{}":""#, st.reasoning.field.name());
                for _ in 0..thinking {
                    event.push_str("think ");
                }
                event.push('"');
            }
            if k > thinking {
                if thinking > 0 {
                    event.push(',');
                }
                event.push_str(r#""content":""#);
                for i in thinking..k {
                    if first_answer_token == Some(i) {
                        event.push_str(&st.reasoning.answer_tag);
                    } else {
                        event.push_str("tok ");
                    }
                }
                event.push('"');
            }
            event.push('}');
        } else {
            event.push_str(r#""text":""#);
            for _ in 0..k {
                event.push_str("tok ");
            }
            event.push_str(r#"","logprobs":null"#);
        }
        let _ = write!(event, r#","finish_reason":{finish}}}]"#);
        if st.ask.include_usage && st.ask.continuous_usage {
            event.push_str(r#","usage":"#);
            st.reasoning
                .write_usage(&mut event, st.ask.prompt_tokens, st.sent_tokens);
        }
        event.push_str("}\n\n");
        Some((Ok::<Bytes, std::io::Error>(Bytes::from(event)), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            error_response(StatusCode::INTERNAL_SERVER_ERROR, "response build failed")
        })
}
