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
use serde_json::Value;

use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::{PromptSource, RequestSpec};
use crate::wire::backend::Backend;
use crate::wire::target::Target;

/// What one streamed event says.
#[derive(Debug, Default, PartialEq)]
pub struct StreamEvent<'a> {
    /// The stream's end marker (`[DONE]`).
    pub done: bool,
    /// An error event's message.
    pub error: Option<String>,
    /// The answer text it carries (`content`, `text`, a TGI token's text); `Some("")` when
    /// the field is there but empty.
    pub text: Option<Cow<'a, str>>,
    /// The reasoning text it carries (`delta.reasoning`, or `delta.reasoning_content`).
    pub reasoning: Option<Cow<'a, str>>,
    /// It carries part of a tool call (`delta.tool_calls`): answer output without text.
    pub tool_call: bool,
    /// It carries a choice or a token (a usage-only event does not).
    pub has_choice: bool,
    /// It says the generation has finished.
    pub finished: bool,
    pub prompt_tokens: Option<u64>,
    /// Output tokens so far, when the server reports them on the stream.
    pub completion_tokens: Option<u64>,
    /// Reasoning tokens so far (`usage.completion_tokens_details.reasoning_tokens`).
    pub reasoning_tokens: Option<u64>,
    /// Prompt tokens served from the prefix cache (`usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: Option<u64>,
    /// The server's own timing of the request (on a stream's last events).
    pub server_timing: Option<reports::records::ServerTiming>,
}

/// One serving API's wire format.
pub trait Api: Sync {
    /// The path a streamed request is posted to.
    fn path(&self) -> &'static str;
    /// The JSON body of one streamed request, `--extra-body` not yet merged.
    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value>;
    /// Where a body's generation fields live, which `--extra-body` is merged into: the body
    /// itself, or TGI's `parameters`.
    fn fields_of<'b>(&self, body: &'b mut Value) -> &'b mut Value {
        body
    }
    /// Reads one event's `data`; `Err` names what is wrong with it.
    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String>;
}

/// The wire format of `backend`.
pub fn of(backend: Backend) -> &'static dyn Api {
    match backend {
        Backend::Completions => &completions::Completions,
        Backend::Chat => &chat::Chat,
        Backend::Tgi => &tgi::Tgi,
    }
}

/// The prompt as text.
fn prompt_text(source: &PromptSource, prompts: &PromptBuilder) -> String {
    match source {
        PromptSource::Blocks(blocks) => prompts.text(blocks),
        PromptSource::Text(text) => text.clone(),
    }
}
