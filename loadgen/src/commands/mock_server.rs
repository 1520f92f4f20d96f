//! `loadgen mock-server`: the built-in OpenAI-compatible mock, with known timing.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::mock::{self, MockConfig, MockLog, ReasoningField};
use crate::units::duration_arg;

#[derive(Args, Debug, Clone)]
pub struct MockArgs {
    #[arg(long, value_parser = duration_arg, default_value = "50ms")]
    pub ttft: Duration,
    #[arg(long, value_parser = duration_arg, default_value = "10ms")]
    pub itl: Duration,
    #[arg(long, default_value_t = 1)]
    pub tokens_per_chunk: u32,
    /// Requests served at once (0 = unlimited); others queue FIFO.
    #[arg(long, default_value_t = 0)]
    pub slots: usize,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    #[arg(long, default_value = "loadgen-mock")]
    pub model: String,
    /// Multiply the TTFT (a "slower" server for A/B tests).
    #[arg(long, default_value_t = 1.0)]
    pub ttft_factor: f64,
    /// Fraction of requests answered with --error-status.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    #[arg(long, default_value_t = 500)]
    pub error_status: u16,
    /// Abort each stream after this many tokens.
    #[arg(long)]
    pub cut_after: Option<u32>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write each streamed request's arrival (wall clock, µs since the Unix epoch), its
    /// `x-loadgen-request-id` and the mock's own lateness on its first chunk to this
    /// JSON-lines file (created, or truncated).
    #[arg(long)]
    pub arrival_log: Option<std::path::PathBuf>,
    /// Stream a chat answer's first N tokens as reasoning, as a reasoning model does (not
    /// when the request says `"chat_template_kwargs": {"enable_thinking": false}`).
    #[arg(long, default_value_t = 0)]
    pub reasoning_tokens: u32,
    /// The delta field reasoning streams in: `reasoning` (current vLLM) or
    /// `reasoning_content` (SGLang, llama.cpp, DeepSeek).
    #[arg(long, value_enum, default_value = "reasoning")]
    pub reasoning_field: ReasoningField,
    /// Report `usage.completion_tokens_details.reasoning_tokens`.
    #[arg(long)]
    pub reasoning_usage: bool,
    /// A request that offers tools is answered with a tool call to its first tool while its
    /// conversation holds fewer tool results than this (always, with `tool_choice:
    /// "required"`), then with text.
    #[arg(long, default_value_t = 2)]
    pub tool_turns: u32,
    /// Tool calls in each answer that calls (parallel calls, one after the other, 4 tokens
    /// each).
    #[arg(long, default_value_t = 1)]
    pub calls_per_answer: u32,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// `loadgen mock-server`: serves until killed.
pub async fn mock_command(a: MockArgs) -> Result<()> {
    let (addr, handle) = mock::spawn(MockConfig {
        addr: std::net::SocketAddr::new(a.host, a.port),
        model: a.model,
        ttft: a.ttft,
        itl: a.itl,
        tokens_per_chunk: a.tokens_per_chunk,
        slots: a.slots,
        ttft_factor: a.ttft_factor,
        error_rate: a.error_rate,
        error_status: a.error_status,
        cut_after: a.cut_after,
        seed: a.seed,
        log: a.arrival_log.as_deref().map(MockLog::to_file).transpose()?,
        reasoning_tokens: a.reasoning_tokens,
        reasoning_field: a.reasoning_field,
        reasoning_usage: a.reasoning_usage,
        bodies: None,
        tool_turns: a.tool_turns,
        tool_arguments: None,
        calls_per_answer: a.calls_per_answer,
        tls: match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(crate::wire::tls::server_config(cert, key)?),
            _ => None,
        },
    })
    .await?;
    let scheme = if a.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    eprintln!("loadgen mock server listening on {scheme}://{addr}");
    handle.wait().await;
    Ok(())
}
