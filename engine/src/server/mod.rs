//! `engine serve`: the OpenAI-compatible HTTP server.
//!
//! The port is bound first (so `/health` answers 503 while loading), the model is loaded on
//! the engine thread, which then runs [`engine_loop::EngineLoop`]. SIGTERM / Ctrl-C stop
//! accepting connections and let in-flight requests finish for up to `--shutdown-grace`.

pub mod bodies;
pub mod constraints;
pub mod engine_loop;
pub mod harmony;
pub mod metrics;
pub mod protocol;
pub mod responses;
pub mod routes;
pub mod tools;
pub mod typed_body;
pub mod validate;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::serve::ListenerExt;
use tokio::sync::oneshot;

use crate::config::{AttentionSpan, Routing};
use crate::engine::LlmEngine;
use crate::grammar::GrammarCompiler;
use crate::loader::{load_engine, EngineArgs};
use crate::reasoning::{ReasoningParser, ThinkMarkers};
use crate::tokenizer::Tokenizer;
use engine_loop::{Command, EngineLoop};
use metrics::Metrics;
use routes::{AppState, Ready};
use tools::ToolCallParser;
use validate::ModelInfo;

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
    /// (`required` and a named function need no parser: a grammar enforces them).
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<ToolCallParser>,
}

/// A harmony model (gpt-oss) is read by harmony's parsers, which `--reasoning-parser` and
/// `--tool-call-parser` may name (or leave out); other models have no harmony to read.
fn check_harmony_parsers(args: &ServeArgs, harmony: bool) -> anyhow::Result<()> {
    let reasoning = args.reasoning_parser.map(|p| p == ReasoningParser::Harmony);
    let tools = args.tool_call_parser.map(|p| p == ToolCallParser::Harmony);
    for (flag, is_harmony) in [
        ("--reasoning-parser", reasoning),
        ("--tool-call-parser", tools),
    ] {
        match (harmony, is_harmony) {
            (true, Some(false)) => anyhow::bail!(
                "{flag}: this model (gpt-oss) writes harmony: give `{flag} harmony` or leave it out"
            ),
            (false, Some(true)) => anyhow::bail!(
                "{flag} harmony: this model does not write harmony (only gpt-oss does)"
            ),
            _ => {}
        }
    }
    if harmony && !args.default_chat_template_kwargs.is_empty() {
        anyhow::bail!(
            "--default-chat-template-kwargs: this model's prompts are rendered in harmony, not by \
             a chat template"
        );
    }
    Ok(())
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
    footprint: crate::model::Footprint,
    /// Peak memory bandwidth (bytes/s) and how it was found, or why it is unknown.
    bandwidth: Result<(f64, &'static str), String>,
    /// Peak compute (FLOP/s) and how it was found, or why it is unknown.
    compute: Result<(f64, &'static str), String>,
    /// The model's family and layers' attention, for `GET /version`.
    architecture: serde_json::Value,
}

/// The CPU threads the engine computes on: `--threads`, or every core (0).
fn cpu_threads(threads: usize) -> usize {
    if threads > 0 {
        threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// The memory bandwidth of `device` for `GET /version` (see `bandwidth`), on the CPU with
/// the engine's `threads`.
fn memory_bandwidth(
    device: crate::backend::Device,
    threads: usize,
) -> Result<(f64, &'static str), String> {
    match device {
        crate::backend::Device::Cuda => crate::backend::cuda::memory_bandwidth(0)
            .map(|bw| (bw, "the device's attributes: 2 × memory clock × bus width")),
        crate::backend::Device::Cpu => Ok((
            crate::bandwidth::cpu_copy_bandwidth(threads),
            "measured at start-up: a copy on the engine's threads, read + written, best of 10",
        )),
    }
}

/// The compute rate of `device` for `GET /version` (see `compute_rate`), on the CPU with the
/// engine's `threads`.
fn compute_rate(
    device: crate::backend::Device,
    threads: usize,
) -> Result<(f64, &'static str), String> {
    match device {
        crate::backend::Device::Cuda => crate::backend::cuda::compute_flops(0).map(|f| {
            (
                f,
                "the device's attributes: SMs × clock × dense bf16 tensor-core FLOPs per SM clock",
            )
        }),
        crate::backend::Device::Cpu => Ok((
            crate::backend::cpu::compute_rate::cpu_gemm_flops(threads),
            "measured at start-up: the faster of the engine's f32 and integer (Q8_0) GEMMs, 256 × 1024 × 1024 on its threads, best of 10",
        )),
    }
}

fn load(args: &ServeArgs, served_names: Vec<String>) -> anyhow::Result<Loaded> {
    let mut loaded = load_engine(&args.engine)?;
    let harmony = loaded.config.family == crate::config::Family::GptOss;
    check_harmony_parsers(args, harmony)?;
    if let Some(parser) = args.reasoning_parser.filter(|_| !harmony) {
        let markers = ThinkMarkers::resolve(parser, &loaded.tokenizer)?;
        loaded.engine.set_think_markers(markers);
    }
    let grammar = GrammarCompiler::new(loaded.tokenizer.clone(), loaded.config.vocab_size)
        .map(Arc::new)
        .map_err(|e| {
            tracing::warn!("structured output and tool choices are unavailable: {e:#}");
            format!("{e:#}")
        });
    let template_reads_tools = validate::template_reads_tools(&loaded.tokenizer);
    let limits = loaded.engine.limits();
    Ok(Loaded {
        engine: loaded.engine,
        tokenizer: loaded.tokenizer,
        info: ModelInfo {
            served_names,
            limits,
            default_chat_template_kwargs: args.default_chat_template_kwargs.clone(),
            // Harmony's reader splits the reasoning from the text, whatever the flag.
            split_reasoning: args.reasoning_parser.is_some() && !harmony,
            tool_call_parser: args.tool_call_parser,
            template_reads_tools,
            harmony,
        },
        grammar,
        kv_capacity_tokens: loaded.kv_capacity_tokens,
        device: loaded.device,
        footprint: loaded.footprint,
        bandwidth: memory_bandwidth(loaded.device, cpu_threads(args.engine.device.threads)),
        compute: compute_rate(loaded.device, cpu_threads(args.engine.device.threads)),
        architecture: architecture(&loaded.config, loaded.rope_positions),
    })
}

/// The family and what its layers attend to: how many use a sliding window and which
/// windows, and that the KV blocks outside every window are kept (not freed) for now; each
/// distinct RoPE with the layers that use it, as tables of `rope_positions` apply it; and
/// each distinct mixture-of-experts FFN with the layers that have it.
fn architecture(config: &crate::config::ModelConfig, rope_positions: usize) -> serde_json::Value {
    let ropes = count_distinct(config.layers.iter().map(|l| &l.rope));
    let rope: Vec<serde_json::Value> = ropes
        .iter()
        .map(|(r, layers)| {
            serde_json::json!({
                "layers": layers,
                "theta": r.theta,
                "rotary_dim": r.rotary_dim,
                "head_dim": config.head_dim,
                "scaling": r.describe_scaling(rope_positions),
            })
        })
        .collect();
    let mut windows: Vec<usize> = config
        .layers
        .iter()
        .filter_map(|l| match l.attention {
            AttentionSpan::Sliding { window } => Some(window),
            AttentionSpan::Full => None,
        })
        .collect();
    let sliding = windows.len();
    windows.sort_unstable();
    windows.dedup();
    let experts = count_distinct(config.layers.iter().filter_map(|l| match l.ffn {
        crate::config::Ffn::Experts(e) => Some(e),
        crate::config::Ffn::Dense { .. } => None,
    }));
    let experts: Vec<serde_json::Value> = experts
        .iter()
        .map(|(e, layers)| {
            serde_json::json!({
                "layers": layers,
                "num_experts": e.num_experts,
                "top_k": e.top_k,
                "expert_intermediate_size": e.intermediate_size,
                "routing": match e.routing {
                    Routing::SoftmaxTopK { renormalise: false } => "softmax_top_k",
                    Routing::SoftmaxTopK { renormalise: true } => "softmax_top_k_renormalised",
                    Routing::TopKSoftmax => "top_k_softmax",
                },
                "biases": e.biases,
            })
        })
        .collect();
    serde_json::json!({
        "family": format!("{:?}", config.family),
        "layers": config.num_layers(),
        "sliding_window_layers": sliding,
        "sliding_windows": windows,
        "kv_blocks_outside_windows": if sliding > 0 {
            "kept: a sequence holds blocks for its whole context (freeing the blocks every layer's window has passed is not built yet)"
        } else {
            "none: every layer attends to the whole context"
        },
        "rope": rope,
        "experts": experts,
    })
}

/// Each distinct item, in order of first appearance, with how many times it appears.
fn count_distinct<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<(T, usize)> {
    let mut counted: Vec<(T, usize)> = Vec::new();
    for item in items {
        match counted.iter_mut().find(|(x, _)| *x == item) {
            Some((_, n)) => *n += 1,
            None => counted.push((item, 1)),
        }
    }
    counted
}

/// The facts `GET /version` reports.
fn server_info(args: &ServeArgs, loaded: &Loaded) -> serde_json::Value {
    let (device_name, dtype) = match loaded.device {
        crate::backend::Device::Cuda => (
            crate::backend::cuda::device_name(0).unwrap_or_else(|e| format!("CUDA device 0 ({e})")),
            "bf16 weights and activations, f32 accumulation",
        ),
        crate::backend::Device::Cpu => (
            cpu_name(),
            "weights in their file dtype (quantised GGUF tensors as f16), f32 activations",
        ),
    };
    serde_json::json!({
        "version": format!("engine {}", env!("CARGO_PKG_VERSION")),
        "backend": loaded.device.to_string(),
        "device": device_name,
        "model": args.engine.model.display().to_string(),
        "served_model_names": loaded.info.served_names,
        "dtype": dtype,
        "max_model_len": loaded.info.limits.max_model_len(),
        "kv_capacity_tokens": loaded.kv_capacity_tokens,
        "max_num_seqs": args.engine.max_num_seqs,
        "weight_bytes": loaded.footprint.weight_bytes,
        "kv_bytes_per_token": loaded.footprint.kv_bytes_per_token,
        "parameters": loaded.footprint.parameters,
        "attention_flops_per_context_token": loaded.footprint.attention_flops_per_context_token,
        "architecture": loaded.architecture,
        "memory_bandwidth_bytes_per_s": loaded.bandwidth.as_ref().ok().map(|b| b.0),
        "memory_bandwidth_source": match &loaded.bandwidth {
            Ok((_, source)) => source.to_string(),
            Err(why) => format!("unknown: {why}"),
        },
        "compute_flops_per_s": loaded.compute.as_ref().ok().map(|c| c.0),
        "compute_flops_source": match &loaded.compute {
            Ok((_, source)) => source.to_string(),
            Err(why) => format!("unknown: {why}"),
        },
    })
}

/// "AMD EPYC (2 cores)", from `/proc/cpuinfo` where there is one.
fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model} ({cores} cores)")
}

fn check_args(args: &ServeArgs) -> anyhow::Result<()> {
    args.engine.check()?;
    if let Some(key) = validate::SERVER_TEMPLATE_VARIABLES
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
        started: protocol::unix_now(),
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
            let server_info = server_info(&engine_args, &loaded);
            let _ = engine_state.ready.set(Ready {
                tokenizer: loaded.tokenizer,
                info: loaded.info.clone(),
                grammar: loaded.grammar,
                server_info,
                commands: commands_tx,
            });
            let _ = loaded_tx.send(Ok(()));
            EngineLoop::new(loaded.engine, commands_rx, metrics, engine_args.max_waiting_requests).run();
        })
        .context("starting the engine thread")?;

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let app = routes::router(state.clone());
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

    /// `/version` lists each distinct expert FFN with how many layers have it (none for a
    /// dense model).
    #[test]
    fn the_architecture_lists_each_expert_ffn_with_its_layers() {
        let mut config = crate::config::test_llama();
        assert_eq!(
            super::architecture(&config, 64)["experts"],
            serde_json::json!([])
        );
        let spec = crate::config::ExpertSpec {
            num_experts: 16,
            top_k: 4,
            intermediate_size: 32,
            routing: crate::config::Routing::SoftmaxTopK { renormalise: true },
            biases: false,
        };
        config.layers[1].ffn = crate::config::Ffn::Experts(spec);
        assert_eq!(
            super::architecture(&config, 64)["experts"],
            serde_json::json!([{"layers": 1, "num_experts": 16, "top_k": 4,
                "expert_intermediate_size": 32, "routing": "softmax_top_k_renormalised",
                "biases": false}])
        );
    }

    /// `/version` counts the windowed layers, lists their windows once, and says that the
    /// blocks outside them are kept.
    #[test]
    fn the_architecture_reports_sliding_windows() {
        let mut config = crate::config::test_llama();
        let full = super::architecture(&config, 4096);
        assert_eq!(full["sliding_window_layers"], 0);
        assert!(full["kv_blocks_outside_windows"]
            .as_str()
            .unwrap()
            .starts_with("none"));
        for layer in &mut config.layers {
            layer.attention = super::AttentionSpan::Sliding { window: 4096 };
        }
        let windowed = super::architecture(&config, 4096);
        assert_eq!(windowed["sliding_window_layers"], 2);
        assert_eq!(windowed["sliding_windows"], serde_json::json!([4096]));
        assert_eq!(
            windowed["rope"],
            serde_json::json!([{"layers": 2, "theta": 500000.0, "rotary_dim": 128,
                "head_dim": 128, "scaling": "none"}])
        );
        assert!(windowed["kv_blocks_outside_windows"]
            .as_str()
            .unwrap()
            .starts_with("kept"));
    }

    /// LongRoPE's factor list follows the served context: short within the original one.
    #[test]
    fn the_architecture_says_which_longrope_factors_serve() {
        let mut config = crate::config::test_llama();
        for layer in &mut config.layers {
            layer.rope.scaling = Some(crate::config::RopeScaling::LongRope(
                crate::config::LongRopeScaling {
                    short_factor: vec![1.0; 64],
                    long_factor: vec![2.0; 64],
                    original_max_position_embeddings: 4096,
                    attention_factor: 1.2,
                },
            ));
        }
        let scaling =
            |positions| super::architecture(&config, positions)["rope"][0]["scaling"].clone();
        assert_eq!(
            scaling(4096),
            "longrope: the short factors, as the served context (4096) is within the original 4096"
        );
        assert_eq!(
            scaling(4097),
            "longrope: the long factors, as the served context (4097) exceeds the original 4096"
        );
    }
}
