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
    /// OpenAI `POST /v1/responses`.
    Responses,
    /// Hugging Face TGI's native `POST /generate_stream`.
    Tgi,
}

impl Backend {
    pub const ALL: [Backend; 4] = [
        Backend::Completions,
        Backend::Chat,
        Backend::Responses,
        Backend::Tgi,
    ];

    /// What the API is, in one line (`--backend`'s help).
    pub fn help(self) -> &'static str {
        match self {
            Backend::Completions => "OpenAI `POST /v1/completions`",
            Backend::Chat => "OpenAI `POST /v1/chat/completions`",
            Backend::Responses => "OpenAI `POST /v1/responses` (streamed events, no `[DONE]`)",
            Backend::Tgi => "Hugging Face TGI's native `POST /generate_stream`",
        }
    }

    /// Whether its requests carry a conversation (messages, tools): what sessions need.
    pub fn takes_conversations(self) -> bool {
        matches!(self, Backend::Chat | Backend::Responses)
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Completions => "completions",
            Backend::Chat => "chat",
            Backend::Responses => "responses",
            Backend::Tgi => "tgi",
        }
    }
}
