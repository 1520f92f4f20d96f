//! `engine serve`: the OpenAI-compatible HTTP server.
//!
//! The port is bound first (so `/health` answers 503 while loading), the model is loaded on
//! the engine thread, which then runs [`engine_loop::EngineLoop`]. SIGTERM / Ctrl-C stop
//! accepting connections and let in-flight requests finish for up to `--shutdown-grace`.

pub mod engine_loop;
pub mod error;
pub mod formats;
pub mod http;
pub mod info;
pub mod metrics;
pub mod request;
pub mod response;
pub mod responses_api;
pub mod tools;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::serve::ListenerExt;
use tokio::sync::oneshot;

use crate::engine::LlmEngine;
use crate::grammar::GrammarCompiler;
use crate::loader::{load_engine, EngineArgs};
use crate::reasoning::{ReasoningParser, ThinkMarkers};
use crate::tokenizer::Tokenizer;
use engine_loop::{Command, EngineLoop};
use formats::template::{TemplatePrompt, SERVER_TEMPLATE_VARIABLES};
use formats::{ReasoningSplit, ToolCallParser};
use http::{AppState, Ready};
use metrics::Metrics;
use request::ModelInfo;

/// Flags of `engine serve` (named after vLLM's where the meaning is the same).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the ready line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Model names accepted in requests and reported in responses; default: the `--model` value.
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Require `Authorization: Bearer <key>` on every route but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Most sequences queued behind the running batch; beyond it requests get 429 with Retry-After.
    #[arg(long, default_value_t = 512)]
    pub max_waiting_requests: usize,
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Seconds that in-flight requests may take to finish after SIGTERM before the server exits.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_grace: f64,
    /// Chat-template variables of every chat request, as a JSON object (e.g.
    /// '{"enable_thinking": false}'); a request's `chat_template_kwargs` override them key by key.
    #[arg(long, value_name = "JSON", value_parser = parse_kwargs, default_value = "{}")]
    pub default_chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Split chat answers into reasoning (`reasoning` and `reasoning_content`) and answer
    /// (`content`) at the model's think markers, found by token id.
    #[arg(long, value_enum)]
    pub reasoning_parser: Option<ReasoningParser>,
    /// Read the model's own tool-call text into `tool_calls` for `tool_choice: "auto"`
    /// (`required` and a named function need no parser: a grammar enforces them, in JSON,
    /// or with `qwen3_coder` in its XML).
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<ToolCallParser>,
}

/// `--default-chat-template-kwargs`: a JSON object.
fn parse_kwargs(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("expected a JSON object, got {other}")),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

/// The loaded model, ready for the engine loop.
struct Loaded {
    engine: LlmEngine,
    tokenizer: Arc<Tokenizer>,
    info: ModelInfo,
    /// Structured output's grammar compiler, or why this tokenizer cannot have one.
    grammar: Result<Arc<GrammarCompiler>, String>,
    kv_capacity_tokens: usize,
    device: crate::backend::Device,
    /// What `GET /version` answers.
    version: serde_json::Value,
}

/// The CPU threads the engine computes on: `--threads`, or every core (0).
fn cpu_threads(threads: usize) -> usize {
    if threads > 0 {
        threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

fn load(args: &ServeArgs, served_names: Vec<String>) -> anyhow::Result<Loaded> {
    let mut loaded = load_engine(&args.engine)?;
    let format = formats::for_model(
        loaded.config.family == crate::config::Family::GptOss,
        args.tool_call_parser,
        args.reasoning_parser,
        TemplatePrompt::of(&loaded.tokenizer, args.default_chat_template_kwargs.clone()),
    )?;
    if let ReasoningSplit::ThinkMarkers(parser) = format.reasoning_split() {
        let markers = ThinkMarkers::resolve(parser, &loaded.tokenizer)?;
        loaded.engine.set_think_markers(markers);
    }
    let grammar = GrammarCompiler::new(loaded.tokenizer.clone(), loaded.config.vocab_size)
        .map(Arc::new)
        .map_err(|e| {
            tracing::warn!("structured output and tool choices are unavailable: {e:#}");
            format!("{e:#}")
        });
    let limits = loaded.engine.limits();
    let checkpoints_history = loaded.kv_layer_groups.has_recurrent()
        && loaded.engine.prefix_caching() == crate::engine::PrefixCaching::On;
    let version = info::version_body(&info::Facts {
        model: args.engine.model.display().to_string(),
        served_names: &served_names,
        device: loaded.device,
        threads: cpu_threads(args.engine.device.threads),
        max_model_len: limits.max_model_len(),
        kv_capacity_tokens: loaded.kv_capacity_tokens,
        max_num_seqs: args.engine.max_num_seqs,
        footprint: loaded.footprint,
        kv_layer_groups: &loaded.kv_layer_groups,
        config: &loaded.config,
        rope_positions: loaded.rope_positions,
        prefix_caching: loaded.engine.prefix_caching(),
        state_checkpoint_every: loaded.engine.config().state_checkpoint_every,
    });
    Ok(Loaded {
        engine: loaded.engine,
        tokenizer: loaded.tokenizer,
        info: ModelInfo {
            served_names,
            limits,
            format,
            checkpoints_history,
        },
        grammar,
        kv_capacity_tokens: loaded.kv_capacity_tokens,
        device: loaded.device,
        version,
    })
}

fn check_args(args: &ServeArgs) -> anyhow::Result<()> {
    args.engine.check()?;
    if let Some(key) = SERVER_TEMPLATE_VARIABLES
        .iter()
        .find(|k| args.default_chat_template_kwargs.contains_key(**k))
    {
        bail!("--default-chat-template-kwargs: `{key}` is set by the server, not by template arguments");
    }
    if !(args.shutdown_grace >= 0.0 && args.shutdown_grace.is_finite()) {
        bail!("--shutdown-grace must be a non-negative number of seconds");
    }
    Ok(())
}

/// Runs `engine serve` until SIGTERM / Ctrl-C; returns once drained.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    check_args(&args)?;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(serve_async(args));
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn serve_async(args: ServeArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let served_names = if args.served_model_name.is_empty() {
        vec![args.engine.model.display().to_string()]
    } else {
        args.served_model_name.clone()
    };
    let metrics = Arc::new(Metrics::new(&served_names[0]));
    let state = Arc::new(AppState {
        served_names: served_names.clone(),
        model_root: args.engine.model.display().to_string(),
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body_bytes,
        metrics: metrics.clone(),
        ready: OnceLock::new(),
        started: response::protocol::unix_now(),
    });
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let address: SocketAddr = listener.local_addr().context("reading the bound address")?;
    tracing::info!(
        "listening on http://{address}, loading {}",
        args.engine.model.display()
    );

    let (commands_tx, commands_rx) = std::sync::mpsc::channel::<Command>();
    let (loaded_tx, loaded_rx) = oneshot::channel::<anyhow::Result<()>>();
    let engine_state = state.clone();
    let engine_args = args.clone();
    let engine_thread = std::thread::Builder::new()
        .name("engine-loop".into())
        .spawn(move || {
            let loaded = match load(&engine_args, served_names) {
                Ok(l) => l,
                Err(e) => {
                    let _ = loaded_tx.send(Err(e));
                    return;
                }
            };
            tracing::info!(
                "ready in {:.2}s: model={} backend={} kv_capacity_tokens={} max_model_len={} address=http://{address}",
                start.elapsed().as_secs_f64(),
                engine_args.engine.model.display(),
                loaded.device,
                loaded.kv_capacity_tokens,
                loaded.info.limits.max_model_len(),
            );
            let _ = engine_state.ready.set(Ready {
                tokenizer: loaded.tokenizer,
                info: loaded.info.clone(),
                grammar: loaded.grammar,
                version: loaded.version,
                commands: commands_tx,
            });
            let _ = loaded_tx.send(Ok(()));
            EngineLoop::new(loaded.engine, commands_rx, metrics, engine_args.max_waiting_requests).run();
        })
        .context("starting the engine thread")?;

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let app = http::router(state.clone());
    let server = tokio::spawn(async move {
        // Nagle's algorithm could hold a small SSE write back until the client ACKs.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!("TCP_NODELAY on an accepted socket: {e}");
            }
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });

    // A failed load ends the server; a signal during loading just stops it.
    tokio::pin!(loaded_rx);
    let signal = shutdown_signal();
    tokio::pin!(signal);
    tokio::select! {
        loaded = &mut loaded_rx => {
            match loaded {
                Ok(Ok(())) => signal.await,
                Ok(Err(e)) => {
                    let _ = stop_tx.send(());
                    return Err(e);
                }
                Err(_) => bail!("the engine thread ended while loading the model"),
            }
        }
        _ = &mut signal => {}
    }

    let grace = Duration::from_secs_f64(args.shutdown_grace);
    tracing::info!(
        "shutting down: no new connections, draining in-flight requests for up to {grace:?}"
    );
    let _ = stop_tx.send(());
    match tokio::time::timeout(grace, server).await {
        Ok(Ok(Ok(()))) => tracing::info!("drained"),
        Ok(Ok(Err(e))) => tracing::warn!("server error while draining: {e}"),
        Ok(Err(e)) => tracing::warn!("server task failed: {e}"),
        Err(_) => tracing::warn!("grace period over, aborting the remaining requests"),
    }
    if let Some(ready) = state.ready.get() {
        let _ = ready.commands.send(Command::Shutdown);
        let _ = engine_thread.join();
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::loader::parse_memory;

    #[test]
    fn memory_sizes_parse() {
        assert_eq!(parse_memory("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_memory("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_memory("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_memory("4096").unwrap(), 4096);
        assert!(parse_memory("0.9").is_err());
        assert!(parse_memory("12 parsecs").is_err());
    }
}
