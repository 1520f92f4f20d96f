//! The server under test and how its requests are phrased: the types the client, the wire
//! formats (`api/`) and the run loop share, below all three.

use std::time::Duration;

use crate::wire::backend::Backend;
use crate::wire::extra_body::ExtraBody;
use crate::wire::tls::TlsSettings;

/// The server under test and how requests are phrased.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL, e.g. `http://127.0.0.1:8000` (no trailing `/v1`).
    pub base_url: String,
    pub backend: Backend,
    pub model: String,
    /// Extra HTTP headers (`--header`).
    pub headers: Vec<(String, String)>,
    pub api_key: Option<String>,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Send `ignore_eos: true` (vLLM extension) so the output length is enforced.
    pub ignore_eos: bool,
    /// Also send `min_tokens` = `max_tokens`.
    pub min_tokens: bool,
    /// Send prompts as token ids (completions only).
    pub prompt_ids: bool,
    /// Ask for usage on every chunk (`stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
    /// The user's own fields, merged into every request body (`--extra-body`).
    pub extra_body: Option<ExtraBody>,
    /// How `https://` servers are reached (`--ca-cert`, `--insecure`).
    pub tls: Option<TlsSettings>,
}
