//! The serving API a run speaks (`--backend`); its wire format is in `api/`.

use serde::{Deserialize, Serialize};

/// The API a run speaks (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// OpenAI `POST /v1/completions`.
    Completions,
    /// OpenAI `POST /v1/chat/completions`.
    Chat,
    /// Hugging Face TGI's native `POST /generate_stream`.
    Tgi,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Completions, Backend::Chat, Backend::Tgi];

    /// What the API is, in one line (`--backend`'s help).
    pub fn help(self) -> &'static str {
        match self {
            Backend::Completions => "OpenAI `POST /v1/completions`",
            Backend::Chat => "OpenAI `POST /v1/chat/completions`",
            Backend::Tgi => "Hugging Face TGI's native `POST /generate_stream`",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Completions => "completions",
            Backend::Chat => "chat",
            Backend::Tgi => "tgi",
        }
    }
}
