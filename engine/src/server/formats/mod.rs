//! Chat formats: how a model family's conversations become a prompt and its answers become
//! OpenAI's message. A [`ChatFormat`] renders the prompt, gives the grammar that enforces a
//! tool choice in its syntax, reads each answer back into text, reasoning and tool calls,
//! and says which reasoning split applies. The server picks one format per model at load
//! ([`for_model`]); request validation and the response writer only ask it.

pub mod harmony;
pub mod hermes;
pub mod json_calls;
pub mod llama3_json;
pub mod qwen3_coder;
pub mod template;

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::tools::Tools;
use crate::grammar::GrammarSpec;
use crate::reasoning::ReasoningParser;
use crate::tokenizer::{ChatMessage, Tokenizer};
use template::TemplateFormat;

/// How a model writes tool calls in its own text (`--tool-call-parser`, vLLM's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5, Qwen3).
    Hermes,
    /// A JSON object `{"name": ..., "parameters": {...}}` as the whole answer, several
    /// separated by `;` (Llama 3.1 / 3.2).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>`
    /// (Qwen3-Coder, Qwen3.5, Qwen3.6), values typed by the tool's schema.
    #[value(name = "qwen3_coder")]
    Qwen3Coder,
    /// gpt-oss's harmony: `commentary` messages to `functions.NAME` (vLLM's `openai`).
    #[value(name = "harmony", alias = "openai")]
    Harmony,
}

/// Where a format's answers are split into reasoning and answer, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningSplit {
    /// All answer.
    None,
    /// The engine splits at this parser's think markers, by token id (`--reasoning-parser`).
    ThinkMarkers(ReasoningParser),
    /// The format's answer reader splits its channels from the text.
    Channels,
}

/// `reasoning_effort`: how long the model thinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    /// From the request's `reasoning_effort`.
    pub fn parse(value: &str) -> Result<ReasoningEffort, ApiError> {
        match value {
            "low" => Ok(ReasoningEffort::Low),
            "medium" => Ok(ReasoningEffort::Medium),
            "high" => Ok(ReasoningEffort::High),
            other => Err(ApiError::invalid(
                "reasoning_effort",
                format!(
                    "`reasoning_effort` must be \"low\", \"medium\" or \"high\", got \"{other}\""
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

/// A conversation to render, as the request gave it.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    pub messages: &'a [ChatMessage],
    /// The request's tools, whatever its `tool_choice`.
    pub tools: Option<&'a Tools>,
    /// `chat_template_kwargs`, as the request gave them.
    pub template_kwargs: Option<&'a Map<String, Value>>,
    /// `reasoning_effort`, as the request gave it.
    pub reasoning_effort: Option<&'a str>,
    /// End with the assistant's turn opened (a chat request always does).
    pub add_generation_prompt: bool,
}

/// A model family's chat format.
pub trait ChatFormat: Send + Sync + std::fmt::Debug {
    /// The format's name in messages ("harmony", "hermes", ...).
    fn name(&self) -> &'static str;

    /// The prompt text of `conversation` (special tokens written as text).
    fn render(
        &self,
        conversation: Conversation<'_>,
        tokenizer: &Tokenizer,
    ) -> Result<String, ApiError>;

    /// The grammar that enforces a `required` or named tool choice in this format's syntax;
    /// `None` for `auto` and `none`.
    fn tool_grammar(&self, tools: &Tools) -> Option<GrammarSpec>;

    /// A structured-output grammar as this format's answers carry it, or why it cannot be.
    fn answer_grammar(&self, spec: GrammarSpec) -> Result<GrammarSpec, String>;

    /// How the answers of a request with `tools` are read; `None` when they are plain text.
    /// A tool choice this format cannot read is the client's error.
    fn reading(&self, tools: Option<&Tools>) -> Result<Option<Reading>, ApiError>;

    /// Which reasoning split applies to this format's answers.
    fn reasoning_split(&self) -> ReasoningSplit;

    /// Whether the answer reader finds the format's markers in the text, so that special
    /// tokens must be kept in it.
    fn reads_markers(&self) -> bool;
}

/// The format of a model: harmony for gpt-oss (whose parsers `--reasoning-parser` and
/// `--tool-call-parser` may name, or leave out); else the chat template, with the calls of
/// `tool_choice: "auto"` read by `--tool-call-parser` and the reasoning split at the think
/// markers with `--reasoning-parser`.
pub fn for_model(
    harmony: bool,
    tool_call_parser: Option<ToolCallParser>,
    reasoning_parser: Option<ReasoningParser>,
    template: template::TemplatePrompt,
) -> anyhow::Result<Arc<dyn ChatFormat>> {
    let reasoning = reasoning_parser.map(|p| p == ReasoningParser::Harmony);
    let tools = tool_call_parser.map(|p| p == ToolCallParser::Harmony);
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
    let think = reasoning_parser;
    Ok(match (harmony, tool_call_parser) {
        (true, _) if !template.default_kwargs.is_empty() => anyhow::bail!(
            "--default-chat-template-kwargs: this model's prompts are rendered in harmony, \
             not by a chat template"
        ),
        (true, _) => Arc::new(harmony::Harmony),
        (false, Some(ToolCallParser::Hermes)) => Arc::new(TemplateFormat {
            template,
            think,
            calls: hermes::Hermes,
        }),
        (false, Some(ToolCallParser::Llama3Json)) => Arc::new(TemplateFormat {
            template,
            think,
            calls: llama3_json::Llama3Json,
        }),
        (false, Some(ToolCallParser::Qwen3Coder)) => Arc::new(TemplateFormat {
            template,
            think,
            calls: qwen3_coder::Qwen3Coder,
        }),
        (false, None) => Arc::new(TemplateFormat {
            template,
            think,
            calls: template::NoParser,
        }),
        (false, Some(ToolCallParser::Harmony)) => anyhow::bail!(
            "--tool-call-parser harmony: this model does not write harmony (only gpt-oss does)"
        ),
    })
}

/// What reading a piece of answer text gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEvent {
    /// Ordinary answer text.
    Content(String),
    /// Reasoning text (a format that splits channels).
    Reasoning(String),
    /// A call begins: its index among the answer's calls, id and function name.
    Start {
        index: usize,
        id: String,
        name: String,
    },
    /// More of a call's arguments (a JSON text once all are joined).
    Arguments { index: usize, delta: String },
}

/// Reads one answer's text as it arrives (a whole answer is read in one piece by the same
/// code, so streamed and non-streamed answers agree by construction).
pub trait AnswerReader: Send {
    /// Reads more of the answer.
    fn push(&mut self, text: &str) -> Vec<CallEvent>;
    /// The answer ended: whatever was held is read for good.
    fn finish(&mut self) -> Vec<CallEvent>;
    /// Whether any call was read.
    fn called(&self) -> bool;
}

/// How one request's answers are read: every choice gets a fresh reader from it.
#[derive(Clone)]
pub struct Reading(Arc<dyn Fn() -> Box<dyn AnswerReader> + Send + Sync>);

impl Reading {
    pub fn new(make: impl Fn() -> Box<dyn AnswerReader> + Send + Sync + 'static) -> Reading {
        Reading(Arc::new(make))
    }

    /// A reader for one choice.
    pub fn reader(&self) -> Box<dyn AnswerReader> {
        (self.0)()
    }
}

impl std::fmt::Debug for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reading")
    }
}

/// An OpenAI-style call id.
fn new_call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The next call's start (and one more call counted).
fn start_call(calls: &mut usize, name: String) -> CallEvent {
    *calls += 1;
    CallEvent::Start {
        index: *calls - 1,
        id: new_call_id(),
        name,
    }
}

/// A call's start and its whole arguments (one more call counted).
fn whole_call(calls: &mut usize, name: String, arguments: String, events: &mut Vec<CallEvent>) {
    events.push(start_call(calls, name));
    events.push(CallEvent::Arguments {
        index: *calls - 1,
        delta: arguments,
    });
}

/// `{"name": ..., "arguments" | "parameters": {...}}` as (name, compact arguments JSON).
fn call_of(value: &Value) -> Option<(String, String)> {
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match arguments {
        // Some models write the arguments as a JSON string.
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some((name, arguments))
}

/// Drops empty text, and every call after the first unless `parallel` (as vLLM keeps only
/// the first call with `parallel_tool_calls: false`).
fn kept(mut events: Vec<CallEvent>, parallel: bool) -> Vec<CallEvent> {
    events.retain(|e| match e {
        CallEvent::Content(t) | CallEvent::Reasoning(t) => !t.is_empty(),
        CallEvent::Start { index, .. } | CallEvent::Arguments { index, .. } => {
            parallel || *index == 0
        }
    });
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` to `reader` in pieces of `step` bytes (at char boundaries) and joins
    /// what was read: (content, [(name, arguments)]).
    pub(crate) fn read(
        mut reader: Box<dyn AnswerReader>,
        text: &str,
        step: usize,
    ) -> (String, Vec<(String, String)>) {
        let mut events = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            events.extend(reader.push(&text[at..end]));
            at = end;
        }
        events.extend(reader.finish());
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for e in events {
            match e {
                CallEvent::Content(t) => content.push_str(&t),
                CallEvent::Start { index, name, id } => {
                    assert_eq!(index, calls.len());
                    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
                    calls.push((name, String::new()));
                }
                CallEvent::Arguments { index, delta } => calls[index].1.push_str(&delta),
                CallEvent::Reasoning(t) => panic!("reasoning {t:?} from a tool-call reader"),
            }
        }
        (content, calls)
    }

    pub(crate) fn call(name: &str, args: &str) -> (String, String) {
        (name.to_string(), args.to_string())
    }
}
