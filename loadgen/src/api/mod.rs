//! The wire formats of the serving APIs, one file each: OpenAI completions and chat
//! completions, and TGI's native `generate_stream`. Each says where a streamed request goes,
//! what its body is and what one streamed event means; the client times and counts events
//! without knowing the format. A new API is one file here and one [`Backend`] variant.

mod chat;
mod completions;
mod openai;
mod tgi;

use std::borrow::Cow;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::client::Target;
use crate::workload::prompt::PromptBuilder;
use crate::workload::{PromptSource, RequestSpec};

/// What one streamed event says.
#[derive(Debug, Default, PartialEq)]
pub struct StreamEvent<'a> {
    /// The stream's end marker (`[DONE]`).
    pub done: bool,
    /// An error event's message.
    pub error: Option<String>,
    /// The generated text it carries.
    pub text: Option<Cow<'a, str>>,
    /// It carries a choice or a token (a usage-only event does not).
    pub has_choice: bool,
    /// It says the generation has finished.
    pub finished: bool,
    pub prompt_tokens: Option<u64>,
    /// Output tokens so far, when the server reports them on the stream.
    pub completion_tokens: Option<u64>,
}

/// One serving API's wire format.
pub trait Api: Sync {
    /// The path a streamed request is posted to.
    fn path(&self) -> &'static str;
    /// The JSON body of one streamed request.
    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value>;
    /// Reads one event's `data`; `Err` names what is wrong with it.
    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String>;
}

/// The API a run speaks (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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
    pub fn api(self) -> &'static dyn Api {
        match self {
            Backend::Completions => &completions::Completions,
            Backend::Chat => &chat::Chat,
            Backend::Tgi => &tgi::Tgi,
        }
    }

    pub fn path(self) -> &'static str {
        self.api().path()
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Completions => "completions",
            Backend::Chat => "chat",
            Backend::Tgi => "tgi",
        }
    }
}

/// The prompt as text.
fn prompt_text(source: &PromptSource, prompts: &PromptBuilder) -> String {
    match source {
        PromptSource::Blocks(blocks) => prompts.text(blocks),
        PromptSource::Text(text) => text.clone(),
    }
}
