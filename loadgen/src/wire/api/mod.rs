//! The wire formats of the serving APIs, one file each: OpenAI completions, chat
//! completions and responses, and TGI's native `generate_stream`. Each says where a streamed
//! request goes, what its body is (a single prompt, or a conversation with tools) and what
//! one streamed event means; the client times and counts events without knowing the format.
//! A new API is one file here and one [`Backend`] variant.

mod chat;
mod completions;
mod openai;
mod responses;
mod tgi;

use std::borrow::Cow;

use anyhow::Result;
use serde_json::Value;

use crate::load::workload::agentic::FunctionTool;
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::RequestSpec;
use crate::wire::backend::Backend;
use crate::wire::target::Target;

/// What one streamed event says.
#[derive(Debug, Default, PartialEq)]
pub struct StreamEvent<'a> {
    /// The stream's end marker (`[DONE]`, or the Responses API's final event).
    pub done: bool,
    /// An error event's message.
    pub error: Option<String>,
    /// The answer text it carries (`content`, `text`, a TGI token's text); `Some("")` when
    /// the field is there but empty.
    pub text: Option<Cow<'a, str>>,
    /// The reasoning text it carries (`delta.reasoning`, or `delta.reasoning_content`).
    pub reasoning: Option<Cow<'a, str>>,
    /// The pieces of tool calls it carries (answer output without text).
    pub tool_calls: Vec<CallPiece<'a>>,
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

/// One streamed piece of a tool call: the call it belongs to (`index`), and whichever of its
/// id, name and arguments text the event carries.
#[derive(Debug, Default, PartialEq)]
pub struct CallPiece<'a> {
    pub index: u32,
    pub id: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
    /// More of the arguments' text, or (with `whole`) all of it.
    pub arguments: Option<Cow<'a, str>>,
    /// `arguments` is the call's whole text, not a piece to append.
    pub whole: bool,
}

/// A tool call as the server made it: sent back exactly so in the conversation's history.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The id the answer gave the call (chat's `id`, the Responses API's `call_id`).
    pub id: String,
    pub name: String,
    /// The arguments' JSON text, as received.
    pub arguments: String,
}

/// One message of a conversation, in no API's format: each API writes it in its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    System(String),
    User(String),
    /// An answer: its text (without reasoning) and the tool calls it made.
    Assistant {
        text: String,
        calls: Vec<ToolCall>,
    },
    /// A tool's result for the call `call_id`.
    ToolResult {
        call_id: String,
        output: String,
    },
}

/// A conversation request: the messages so far, and the tools offered.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    pub messages: &'a [Message],
    pub tools: &'a [FunctionTool],
    /// `tool_choice: "required"` rather than `auto` (with tools).
    pub require_call: bool,
}

/// One serving API's wire format.
pub trait Api: Sync {
    /// The path a streamed request is posted to.
    fn path(&self) -> &'static str;
    /// The JSON body of one streamed request, `--extra-body` not yet merged.
    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value>;
    /// The JSON body of one streamed turn of a conversation (the request's length fields
    /// from `spec`), `--extra-body` not yet merged; refused by APIs that take one prompt.
    fn conversation_body(
        &self,
        target: &Target,
        spec: &RequestSpec,
        conversation: Conversation<'_>,
    ) -> Result<Value> {
        let _ = (target, spec, conversation);
        anyhow::bail!(
            "this API takes one prompt per request: sessions and tools need --backend chat or responses"
        )
    }
    /// Where a body's generation fields live, which `--extra-body` is merged into: the body
    /// itself, or TGI's `parameters`.
    fn fields_of<'b>(&self, body: &'b mut Value) -> &'b mut Value {
        body
    }
    /// Reads one event's `data`; `Err` names what is wrong with it.
    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String>;
}

/// The body of a one-message conversation: `spec`'s prompt as its user message, no tools
/// (chat's and the Responses API's single requests).
fn one_message_body(
    api: &dyn Api,
    target: &Target,
    spec: &RequestSpec,
    prompts: &PromptBuilder,
) -> Result<Value> {
    let user = Message::User(spec.prompt.text(prompts));
    api.conversation_body(
        target,
        spec,
        Conversation {
            messages: std::slice::from_ref(&user),
            tools: &[],
            require_call: false,
        },
    )
}

/// The wire format of `backend`.
pub fn of(backend: Backend) -> &'static dyn Api {
    match backend {
        Backend::Completions => &completions::Completions,
        Backend::Chat => &chat::Chat,
        Backend::Responses => &responses::Responses,
        Backend::Tgi => &tgi::Tgi,
    }
}
