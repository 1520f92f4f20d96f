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
//! on a real server. A request that offers tools is answered with `calls_per_answer` tool
//! calls (`call_<id>_<k>_<c>` to the first tool, each over 4 tokens of one chunk: its name,
//! then its arguments in pieces) while its conversation holds fewer than `tool_turns` tool
//! results, then with text; the Responses API (`/v1/responses`) streams the same answers as
//! vLLM's events.

mod ask;
pub mod calibrate;
mod log;
mod routes;
mod streaming;
mod transport;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::routing::{get, post};
use axum::Router;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

pub use log::{BodyLog, MockEvent, MockLog};
use routes::{chat_completions, completions, generate_stream, metrics, models, responses, version};
pub use transport::MockIo;
use transport::{listen, ConnectionArrivals, StampedListener};

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
    /// A request that offers tools is answered with a tool call while its conversation
    /// holds fewer tool results than this (always, when `tool_choice` is `required`).
    pub tool_turns: u32,
    /// Every tool call's arguments text, instead of a JSON object naming the request (a
    /// test's broken call).
    pub tool_arguments: Option<String>,
    /// Tool calls in each answer that calls (parallel calls), one after the other.
    pub calls_per_answer: u32,
}

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
            tool_turns: 2,
            tool_arguments: None,
            calls_per_answer: 1,
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
        .route("/v1/responses", post(responses))
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
