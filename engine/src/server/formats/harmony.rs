//! gpt-oss's chat format, harmony (OpenAI's published format, `openai/harmony`): rendering a
//! conversation, its tools and its reasoning effort into `<|start|>…<|message|>…<|end|>`
//! text, the grammar that enforces a tool choice in that format, and the reader that turns
//! the generated stream back into reasoning (the `analysis` channel), tool calls
//! (`commentary` messages to `functions.NAME`) and the answer (`final`). The reference
//! renderer downloads its vocabulary; here the model's own tokenizer encodes the text (the
//! format's markers are its special tokens).

use serde_json::{Map, Value};

use super::{
    new_call_id, AnswerReader, CallEvent, ChatFormat, Conversation, Reading, ReasoningEffort,
    ReasoningSplit,
};
use crate::grammar::{compact, GrammarSpec};
use crate::server::error::ApiError;
use crate::server::tools::{ToolChoice, Tools};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// gpt-oss's format. Its reader splits the reasoning (the `analysis` channel) from the
/// text, and reads calls whenever the request has tools it may call; a grammar in the
/// format enforces `required` and a named function.
#[derive(Debug)]
pub struct Harmony;

impl ChatFormat for Harmony {
    fn name(&self) -> &'static str {
        "harmony"
    }

    /// The prompt, dated today (UTC) as gpt-oss's template dates it, at the request's
    /// `reasoning_effort` (medium when absent). `chat_template_kwargs` has no template to
    /// reach: refused.
    fn render(
        &self,
        conversation: Conversation<'_>,
        _tokenizer: &Tokenizer,
    ) -> Result<String, ApiError> {
        if conversation.template_kwargs.is_some() {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                "this model's prompts are rendered in harmony, not by a chat template: \
                 `chat_template_kwargs` has nothing to reach (a chat request's `reasoning_effort` sets \
                 its effort)",
            ));
        }
        let effort = match conversation.reasoning_effort {
            Some(effort) => ReasoningEffort::parse(effort)?,
            None => ReasoningEffort::Medium,
        };
        let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
        let mut text = render(conversation.messages, conversation.tools, effort, &today)?;
        if !conversation.add_generation_prompt {
            text.truncate(text.len() - GENERATION_PROMPT.len());
        }
        Ok(text)
    }

    fn tool_grammar(&self, tools: &Tools) -> Option<GrammarSpec> {
        tool_grammar(tools)
    }

    fn answer_grammar(&self, spec: GrammarSpec) -> Result<GrammarSpec, String> {
        final_grammar(&spec)
    }

    fn reading(&self, tools: Option<&Tools>) -> Result<Option<Reading>, ApiError> {
        let calls = tools.is_some_and(|t| t.choice != ToolChoice::None);
        Ok(Some(Reading::new(move || {
            Box::new(HarmonyReader::new(calls))
        })))
    }

    fn reasoning_split(&self) -> ReasoningSplit {
        ReasoningSplit::Channels
    }

    /// The reader finds the format's markers in the text.
    fn reads_markers(&self) -> bool {
        true
    }
}

/// What opens the assistant's turn at the end of a prompt.
const GENERATION_PROMPT: &str = "<|start|>assistant";

/// The model identity and knowledge cutoff of gpt-oss's system message (its chat
/// template's defaults).
const IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.";
const KNOWLEDGE_CUTOFF: &str = "2024-06";

/// The prompt for `messages` with `tools` (those of a choice other than `none`), up to the
/// assistant's turn (`<|start|>assistant`): the system message (identity, cutoff, `date`,
/// the reasoning effort, the valid channels), a developer message with the request's system
/// and developer messages as `# Instructions` and the tools as a TypeScript-like namespace,
/// then the turns. An assistant turn's reasoning is kept only after the last user message
/// (a turn still going on through tool calls), as the format drops finished turns'
/// thinking; tool calls render to `functions.NAME` in the commentary channel, tool results
/// as messages from `functions.NAME`.
fn render(
    messages: &[ChatMessage],
    tools: Option<&Tools>,
    effort: ReasoningEffort,
    date: &str,
) -> Result<String, ApiError> {
    let tools = tools.filter(|t| t.choice != ToolChoice::None && !t.tools.is_empty());
    let mut out = String::new();
    let mut system = format!(
        "{IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}\nCurrent date: {date}\n\nReasoning: {}\n\n\
         # Valid channels: analysis, commentary, final. Channel must be included for every message.",
        effort.as_str()
    );
    if tools.is_some() {
        system.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
    }
    push_message(&mut out, "system", &system, "<|end|>");

    let instructions: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == "system" || m.role == "developer")
        .map(|m| m.content.as_str())
        .collect();
    let mut developer = Vec::new();
    if !instructions.is_empty() {
        developer.push(format!("# Instructions\n\n{}", instructions.join("\n\n")));
    }
    if let Some(tools) = tools {
        developer.push(tools_namespace(tools));
    }
    if !developer.is_empty() {
        push_message(&mut out, "developer", &developer.join("\n\n"), "<|end|>");
    }

    let last_user = messages.iter().rposition(|m| m.role == "user");
    // Call ids to function names, for the tool results.
    let mut called: Vec<(Option<String>, String)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "developer" => {}
            "user" => push_message(&mut out, "user", &m.content, "<|end|>"),
            "assistant" => {
                let ongoing = last_user.is_none_or(|u| i > u);
                if let Some(reasoning) = m.reasoning_content.as_deref().filter(|_| ongoing) {
                    push_message(
                        &mut out,
                        "assistant<|channel|>analysis",
                        reasoning,
                        "<|end|>",
                    );
                }
                // Text beside calls is a preamble in the commentary channel; alone, the
                // turn's final answer.
                if !m.content.is_empty() {
                    let header = match m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
                        true => "assistant<|channel|>commentary",
                        false => "assistant<|channel|>final",
                    };
                    push_message(&mut out, header, &m.content, "<|end|>");
                }
                for (j, call) in m.tool_calls.iter().flatten().enumerate() {
                    let at = format!("messages[{i}].tool_calls[{j}]");
                    let function = &call["function"];
                    let name = function["name"].as_str().ok_or_else(|| {
                        ApiError::invalid(&format!("{at}.function.name"), "a call needs a name")
                    })?;
                    let header = format!(
                        "assistant to=functions.{name}<|channel|>commentary <|constrain|>json"
                    );
                    push_message(
                        &mut out,
                        &header,
                        &python_json(&function["arguments"]),
                        "<|call|>",
                    );
                    let id = call.get("id").and_then(Value::as_str).map(str::to_string);
                    called.push((id, name.to_string()));
                }
            }
            "tool" => {
                // The call it answers by its id, else (no id) the latest call.
                let answered = match &m.tool_call_id {
                    Some(id) => called.iter().rev().find(|(c, _)| c.as_ref() == Some(id)),
                    None => called.last(),
                };
                let name = answered.map(|(_, name)| name.clone()).ok_or_else(|| {
                    let param = match &m.tool_call_id {
                        Some(_) => format!("messages[{i}].tool_call_id"),
                        None => format!("messages[{i}]"),
                    };
                    ApiError::invalid(&param, "a `tool` message answers no earlier tool call")
                })?;
                let header = format!("functions.{name} to=assistant<|channel|>commentary");
                push_message(&mut out, &header, &m.content, "<|end|>");
            }
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("unknown role `{other}`"),
                ))
            }
        }
    }
    out.push_str(GENERATION_PROMPT);
    Ok(out)
}

fn push_message(out: &mut String, header: &str, content: &str, end: &str) {
    out.push_str("<|start|>");
    out.push_str(header);
    out.push_str("<|message|>");
    out.push_str(content);
    out.push_str(end);
}

/// The `functions` namespace: each tool's description as comments and its parameters as a
/// TypeScript-like type.
fn tools_namespace(tools: &Tools) -> String {
    let mut out = String::from("# Tools\n\n## functions\n\nnamespace functions {\n\n");
    for tool in &tools.tools {
        let description = tool.raw["function"]["description"].as_str().unwrap_or("");
        for line in description.lines() {
            out.push_str(&format!("// {line}\n"));
        }
        let has_properties = tool.parameters["properties"]
            .as_object()
            .is_some_and(|p| !p.is_empty());
        if has_properties {
            let ty = typescript(&tool.parameters, "");
            out.push_str(&format!("type {} = (_: {ty}) => any;\n\n", tool.name));
        } else {
            out.push_str(&format!("type {} = () => any;\n\n", tool.name));
        }
    }
    out.push_str("} // namespace functions");
    out
}

/// A JSON schema as harmony's TypeScript-like type: objects with one commented property a
/// line (`?` when optional, defaults as trailing comments), string enums as unions of
/// literals, numbers, booleans, arrays as `T[]`, lists of types and `anyOf` / `oneOf` as
/// unions, anything else `any`.
fn typescript(schema: &Value, indent: &str) -> String {
    let variants = schema.get("anyOf").or_else(|| schema.get("oneOf"));
    if let Some(Value::Array(variants)) = variants {
        let types: Vec<String> = variants.iter().map(|v| typescript(v, indent)).collect();
        return types.join(" | ");
    }
    if let Some(Value::Array(types)) = schema.get("type") {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        return names.join(" | ");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object_type(schema, indent),
        Some("string") => match schema.get("enum").and_then(Value::as_array) {
            Some(values) if !values.is_empty() => values
                .iter()
                .map(|v| format!("\"{}\"", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(" | "),
            _ => "string".to_string(),
        },
        Some("number" | "integer") => "number".to_string(),
        Some("boolean") => "boolean".to_string(),
        Some("null") => "null".to_string(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("{}[]", typescript(items, indent)),
            None => "Array<any>".to_string(),
        },
        _ => "any".to_string(),
    }
}

fn object_type(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(description) = schema.get("description").and_then(Value::as_str) {
        out.push_str(&format!("{indent}// {description}\n"));
    }
    out.push_str("{\n");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let empty = Map::new();
    let properties = schema["properties"].as_object().unwrap_or(&empty);
    for (key, property) in properties {
        if let Some(title) = property.get("title").and_then(Value::as_str) {
            out.push_str(&format!("{indent}// {title}\n{indent}//\n"));
        }
        if let Some(description) = property.get("description").and_then(Value::as_str) {
            for line in description.lines() {
                out.push_str(&format!("{indent}// {line}\n"));
            }
        }
        if let Some(Value::Array(examples)) = property.get("examples") {
            out.push_str(&format!("{indent}// Examples:\n"));
            for example in examples.iter().filter_map(Value::as_str) {
                out.push_str(&format!("{indent}// - \"{example}\"\n"));
            }
        }
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        let mut ty = typescript(property, &format!("{indent}    "));
        if property.get("nullable").and_then(Value::as_bool) == Some(true) && !ty.contains("null") {
            ty.push_str(" | null");
        }
        out.push_str(&format!("{indent}{key}{optional}: {ty},"));
        match property.get("default") {
            Some(Value::String(s)) if property.get("enum").is_some() => {
                out.push_str(&format!(" // default: {s}"))
            }
            Some(Value::String(s)) => out.push_str(&format!(" // default: \"{s}\"")),
            Some(other) => out.push_str(&format!(" // default: {other}")),
            None => {}
        }
        out.push('\n');
    }
    out.push_str(&format!("{indent}}}"));
    out
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "` between items), as gpt-oss's
/// chat template renders call arguments.
fn python_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The grammar of a `required` or named tool choice in harmony: one call, in the
/// commentary channel to `functions.NAME`, its arguments JSON of the tool's schema
/// (`<|call|>` then ends the answer as an end-of-turn token).
fn tool_grammar(tools: &Tools) -> Option<GrammarSpec> {
    let chosen: Vec<_> = match &tools.choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => tools.tools.iter().collect(),
        ToolChoice::Named(name) => tools.tools.iter().filter(|t| &t.name == name).collect(),
    };
    let mut rules = Vec::new();
    let mut calls = Vec::new();
    for (i, tool) in chosen.iter().enumerate() {
        // Compact JSON, as structured output's other grammars (no runs of whitespace).
        let schema = compact(tool.parameters.clone());
        calls.push(format!("call_{i}"));
        rules.push(format!(
            "call_{i}: {} \" \" <|constrain|> \"json\" <|message|> %json {schema}",
            Value::String(tool.name.clone()),
        ));
    }
    Some(GrammarSpec::Lark(format!(
        "start: <|channel|> \"commentary to=functions.\" ({})\n{}",
        calls.join(" | "),
        rules.join("\n")
    )))
}

/// A structured-output grammar in harmony: the answer opens the final channel at once and
/// its message follows the grammar. JSON (an object, or a schema) and a choice of strings
/// are wrapped; a regular expression or a Lark grammar is refused (its own `start` rule and
/// regex dialect are not rewritten), naming what is not supported.
fn final_grammar(spec: &GrammarSpec) -> Result<GrammarSpec, String> {
    let body = match spec {
        GrammarSpec::JsonObject => format!("%json {}", compact(serde_json::json!({"type": "object"}))),
        GrammarSpec::JsonSchema(schema) => format!("%json {}", compact(schema.clone())),
        GrammarSpec::Choice(choices) => {
            let alternatives: Vec<String> = choices
                .iter()
                .map(|c| Value::String(c.clone()).to_string())
                .collect();
            format!("({})", alternatives.join(" | "))
        }
        GrammarSpec::Regex(_) | GrammarSpec::Lark(_) => {
            return Err("this model answers in harmony: its structured output takes JSON (an \
                        object or a schema) or a choice, not a regular expression or a Lark grammar"
                .to_string())
        }
    };
    Ok(GrammarSpec::Lark(format!(
        "start: <|channel|> \"final\" <|message|> {body}"
    )))
}

/// The format's markers.
const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
/// End-of-turn markers (stop tokens, so normally never in the text).
const TURN_ENDS: [&str; 2] = ["<|call|>", "<|return|>"];
const MARKERS: [&str; 6] = [START, CHANNEL, MESSAGE, END, TURN_ENDS[0], TURN_ENDS[1]];

/// Where the reader is in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// A message's header (role, channel, recipient, content type), up to `<|message|>`.
    Header(String),
    /// A message's body, read as `Body`.
    Body(Body),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Answer,
    /// A call's arguments (its index among the answer's calls).
    Call(usize),
}

/// Reads one answer's harmony stream (the text after the prompt's `<|start|>assistant`,
/// markers decoded) as it arrives: `analysis` bodies as reasoning, `commentary` bodies
/// addressed to `functions.NAME` as calls when `calls` (else as answer text), other bodies
/// (`final`, commentary to the user) as answer text. Headers are read whole at
/// `<|message|>`; text that may be the start of a marker is held back until it is not.
#[derive(Debug)]
struct HarmonyReader {
    calls: bool,
    place: Place,
    pending: String,
    made: usize,
}

impl HarmonyReader {
    fn new(calls: bool) -> HarmonyReader {
        HarmonyReader {
            calls,
            place: Place::Header(String::new()),
            pending: String::new(),
            made: 0,
        }
    }

    fn text(&mut self, text: &str, events: &mut Vec<CallEvent>) {
        if text.is_empty() {
            return;
        }
        match &mut self.place {
            Place::Header(header) => header.push_str(text),
            Place::Body(Body::Reasoning) => events.push(CallEvent::Reasoning(text.to_string())),
            Place::Body(Body::Answer) => events.push(CallEvent::Content(text.to_string())),
            Place::Body(Body::Call(index)) => events.push(CallEvent::Arguments {
                index: *index,
                delta: text.to_string(),
            }),
        }
    }

    fn marker(&mut self, marker: &str, events: &mut Vec<CallEvent>) {
        match (marker, &mut self.place) {
            // The channel is part of the header; a body that meets one has ended without
            // its `<|end|>`, and the channel begins the next header.
            (CHANNEL, Place::Header(header)) => header.push_str(CHANNEL),
            (CHANNEL, Place::Body(_)) => self.place = Place::Header(CHANNEL.to_string()),
            (MESSAGE, Place::Header(header)) => {
                let header = std::mem::take(header);
                self.place = Place::Body(self.body_of(&header, events));
            }
            // `<|start|>`, `<|end|>` and the turn ends close a body, or drop a header that
            // never reached its `<|message|>`; a stray `<|message|>` in a body is dropped.
            (MESSAGE, Place::Body(_)) => {}
            _ => self.place = Place::Header(String::new()),
        }
    }

    /// What a body under `header` is: its channel, and its recipient (`to=NAME`, in the
    /// role part or after the channel).
    fn body_of(&mut self, header: &str, events: &mut Vec<CallEvent>) -> Body {
        // Words end at whitespace or a marker (`to=functions.f<|constrain|>json`).
        let word = |s: &str| -> String {
            s.split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("")
                .to_string()
        };
        let channel = header
            .split_once(CHANNEL)
            .map_or(String::new(), |(_, rest)| word(rest));
        let recipient = header
            .match_indices("to=")
            .find(|&(at, _)| {
                header[..at].ends_with(|c: char| c.is_whitespace() || c == '>') || at == 0
            })
            .map(|(at, _)| word(&header[at + 3..]));
        match (
            channel.as_str(),
            recipient
                .as_deref()
                .and_then(|r| r.strip_prefix("functions.")),
        ) {
            (_, Some(name)) if self.calls => {
                let index = self.made;
                self.made += 1;
                events.push(CallEvent::Start {
                    index,
                    id: new_call_id(),
                    name: name.to_string(),
                });
                Body::Call(index)
            }
            ("analysis", _) => Body::Reasoning,
            _ => Body::Answer,
        }
    }
}

impl AnswerReader for HarmonyReader {
    /// Whether any call was read.
    fn called(&self) -> bool {
        self.made > 0
    }

    /// Reads more of the stream.
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.pending.push_str(text);
        let mut events = Vec::new();
        loop {
            let next = MARKERS
                .iter()
                .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
                .min();
            match next {
                Some((at, marker)) => {
                    let before: String = self.pending.drain(..at + marker.len()).collect();
                    self.text(&before[..at], &mut events);
                    self.marker(marker, &mut events);
                }
                None => {
                    // Hold back a tail that could begin a marker.
                    let keep = self
                        .pending
                        .rfind('<')
                        .filter(|&at| {
                            let tail = &self.pending[at..];
                            MARKERS.iter().any(|m| m.starts_with(tail))
                        })
                        .map_or(0, |at| self.pending.len() - at);
                    let cut = self.pending.len() - keep;
                    let text: String = self.pending.drain(..cut).collect();
                    self.text(&text, &mut events);
                    return events;
                }
            }
        }
    }

    /// The stream ended (a stop token, the length limit, or a cut): what is held is read as
    /// it stands; an unfinished header is dropped, an unfinished body keeps what arrived.
    fn finish(&mut self) -> Vec<CallEvent> {
        let rest = std::mem::take(&mut self.pending);
        let mut events = Vec::new();
        self.text(&rest, &mut events);
        events
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::server::tools::parse_tools;

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    /// The weather tools of the format's own example (openai/harmony's
    /// `test_render_functions_with_parameters`).
    fn weather_tools(choice: Value) -> Tools {
        let tools = json!([
            {"type": "function", "function": {"name": "get_location",
             "description": "Gets the location of the user."}},
            {"type": "function", "function": {"name": "get_current_weather",
             "description": "Gets the current weather in the provided location.",
             "parameters": {"type": "object", "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                           "default": "celsius"}},
              "required": ["location"]}}},
        ]);
        parse_tools(Some(&tools), Some(&choice), None)
            .unwrap()
            .unwrap()
    }

    /// A system message, a tool definition, a call with the reasoning before it, its
    /// result: the text the format's specification writes for them.
    #[test]
    fn a_conversation_with_a_tool_call_renders_as_the_format_writes_it() {
        let mut call = message("assistant", "");
        call.reasoning_content = Some("Need the weather tool.".into());
        call.tool_calls = Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "get_current_weather",
                         "arguments": {"location": "San Francisco, CA"}}})]);
        let mut result = message("tool", "{\"sunny\": true, \"temperature\": 20}");
        result.tool_call_id = Some("call_1".into());
        let messages = vec![
            message("system", "Always respond in riddles"),
            message("user", "What is the weather like in SF?"),
            call,
            result,
        ];
        let tools = weather_tools(json!("auto"));
        let got = render(&messages, Some(&tools), ReasoningEffort::High, "2025-06-28").unwrap();
        let want = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: 2025-06-28

Reasoning: high

# Valid channels: analysis, commentary, final. Channel must be included for every message.
Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions

Always respond in riddles

# Tools

## functions

namespace functions {

// Gets the location of the user.
type get_location = () => any;

// Gets the current weather in the provided location.
type get_current_weather = (_: {
// The city and state, e.g. San Francisco, CA
location: string,
format?: \"celsius\" | \"fahrenheit\", // default: celsius
}) => any;

} // namespace functions<|end|><|start|>user<|message|>What is the weather like in SF?<|end|>\
<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>\
<|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json<|message|>{\"location\": \"San Francisco, CA\"}<|call|>\
<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>{\"sunny\": true, \"temperature\": 20}<|end|>\
<|start|>assistant";
        assert_eq!(got, want);
    }

    /// A finished turn's reasoning is dropped; without tools or instructions there is no
    /// developer message and no tools line; the effort is the request's.
    #[test]
    fn finished_turns_lose_their_reasoning() {
        let mut answer = message("assistant", "2 + 2 equals 4.");
        answer.reasoning_content = Some("Simple.".into());
        let messages = vec![
            message("user", "What is 2 + 2?"),
            answer,
            message("user", "What about 9 / 2?"),
        ];
        let got = render(&messages, None, ReasoningEffort::Low, "2026-11-27").unwrap();
        assert_eq!(
            got,
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
             Knowledge cutoff: 2024-06\nCurrent date: 2026-11-27\n\nReasoning: low\n\n\
             # Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>\
             <|start|>user<|message|>What is 2 + 2?<|end|>\
             <|start|>assistant<|channel|>final<|message|>2 + 2 equals 4.<|end|>\
             <|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant"
        );
        let orphan = vec![message("user", "hi"), message("tool", "{}")];
        let err = render(&orphan, None, ReasoningEffort::Low, "2026-11-27").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[1]"));
        // A result naming a call that was not made is refused by its id.
        let mut call = message("assistant", "Checking.");
        call.tool_calls = Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": {}}})]);
        let mut stray = message("tool", "{}");
        stray.tool_call_id = Some("call_2".into());
        let err = render(
            &[message("user", "hi"), call.clone(), stray],
            None,
            ReasoningEffort::Low,
            "2026-11-27",
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[2].tool_call_id"));
        // Text beside a call is a commentary preamble, not a final answer.
        let got = render(
            &[message("user", "hi"), call],
            None,
            ReasoningEffort::Low,
            "d",
        )
        .unwrap();
        assert!(
            got.ends_with(
                "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
                 <|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|>\
                 <|start|>assistant"
            ),
            "{got}"
        );
    }

    /// Reads `pieces` in order and joins what came out: (reasoning, answer, calls).
    fn read(pieces: &[&str], calls: bool) -> (String, String, Vec<(String, String)>) {
        let mut reader = HarmonyReader::new(calls);
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(reader.push(piece));
        }
        events.extend(reader.finish());
        let (mut reasoning, mut answer, mut made) = (String::new(), String::new(), Vec::new());
        for e in events {
            match e {
                CallEvent::Reasoning(t) => reasoning.push_str(&t),
                CallEvent::Content(t) => answer.push_str(&t),
                CallEvent::Start { name, .. } => made.push((name, String::new())),
                CallEvent::Arguments { index, delta } => made[index].1.push_str(&delta),
            }
        }
        (reasoning, answer, made)
    }

    /// Reasoning, a call (recipient in the header's role part or after the channel) and a
    /// final answer land in their three fields, whatever the chunking.
    #[test]
    fn a_stream_parses_into_reasoning_calls_and_answer() {
        let stream = "<|channel|>analysis<|message|>Look it up.<|end|>\
            <|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\"}<|end|>\
            <|start|>assistant<|channel|>commentary to=functions.get_time json<|message|>{}<|end|>\
            <|start|>assistant<|channel|>final<|message|>It is <b>sunny</b>.";
        let want = (
            "Look it up.".to_string(),
            "It is <b>sunny</b>.".to_string(),
            vec![
                (
                    "get_weather".to_string(),
                    "{\"city\": \"Paris\"}".to_string(),
                ),
                ("get_time".to_string(), "{}".to_string()),
            ],
        );
        for step in [1, 2, 3, 7, stream.len()] {
            let chars: Vec<char> = stream.chars().collect();
            let pieces: Vec<String> = chars.chunks(step).map(|c| c.iter().collect()).collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(read(&pieces, true), want, "pieces of {step}");
        }
        // Without calls allowed, a call's arguments are answer text.
        let (_, answer, made) = read(&[stream], false);
        assert!(made.is_empty());
        assert!(
            answer.starts_with("{\"city\": \"Paris\"}{}It is"),
            "{answer}"
        );
    }

    /// Headers written loosely still read: a recipient against `<|constrain|>`, a body that
    /// meets the next `<|channel|>` without its `<|end|>`, a header cut by `<|end|>`.
    #[test]
    fn loose_headers_are_read() {
        let (reasoning, answer, made) = read(
            &["<|channel|>commentary to=functions.f<|constrain|>json<|message|>{}<|end|>"],
            true,
        );
        assert_eq!(made, [("f".to_string(), "{}".to_string())]);
        assert!(reasoning.is_empty() && answer.is_empty());
        let (reasoning, answer, _) = read(
            &["<|channel|>final<|message|>A<|channel|>analysis<|message|>B<|end|><|start|>assistant<|end|><|channel|>final<|message|>C"],
            true,
        );
        assert_eq!((reasoning.as_str(), answer.as_str()), ("B", "AC"));
    }

    /// A stream cut inside a channel keeps what arrived: the reasoning so far, or the
    /// call's arguments so far; a half-read header gives nothing.
    #[test]
    fn a_cut_stream_ends_with_what_arrived() {
        let (reasoning, answer, made) = read(&["<|channel|>analysis<|message|>Half a thou"], true);
        assert_eq!((reasoning.as_str(), answer.as_str()), ("Half a thou", ""));
        assert!(made.is_empty());
        let (_, _, made) = read(
            &["<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": <|"],
            true,
        );
        assert_eq!(made, [("f".to_string(), "{\"a\": <|".to_string())]);
        let (reasoning, answer, made) = read(&["<|channel|>fin"], true);
        assert!(reasoning.is_empty() && answer.is_empty() && made.is_empty());
    }

    /// Structured output opens the final channel and follows the grammar there; what cannot
    /// be wrapped is refused.
    #[test]
    fn structured_output_goes_to_the_final_channel() {
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let Ok(GrammarSpec::Lark(lark)) = final_grammar(&GrammarSpec::JsonSchema(schema)) else {
            panic!("not wrapped")
        };
        assert!(
            lark.starts_with("start: <|channel|> \"final\" <|message|> %json {"),
            "{lark}"
        );
        assert!(lark.contains("\"whitespace_flexible\":false"), "{lark}");
        let choice = final_grammar(&GrammarSpec::Choice(vec!["yes".into(), "no".into()]));
        assert_eq!(
            choice,
            Ok(GrammarSpec::Lark(
                "start: <|channel|> \"final\" <|message|> (\"yes\" | \"no\")".into()
            ))
        );
        assert!(final_grammar(&GrammarSpec::Regex("a+".into())).is_err());
        assert!(final_grammar(&GrammarSpec::Lark("start: \"a\"".into())).is_err());
    }

    /// `required` is one call to any tool in the format; a named choice, to that tool.
    #[test]
    fn tool_choices_become_a_grammar_of_one_call() {
        assert_eq!(tool_grammar(&weather_tools(json!("auto"))), None);
        let Some(GrammarSpec::Lark(required)) = tool_grammar(&weather_tools(json!("required")))
        else {
            panic!("no grammar")
        };
        assert!(
            required.starts_with(
                "start: <|channel|> \"commentary to=functions.\" (call_0 | call_1)\n\
                 call_0: \"get_location\" \" \" <|constrain|> \"json\" <|message|> %json {"
            ),
            "{required}"
        );
        assert_eq!(required.lines().count(), 3, "{required}");
        let Some(GrammarSpec::Lark(named)) = tool_grammar(&weather_tools(
            json!({"type": "function", "function": {"name": "get_current_weather"}}),
        )) else {
            panic!("no grammar")
        };
        assert!(
            named.contains("(call_0)\ncall_0: \"get_current_weather\""),
            "{named}"
        );
        assert_eq!(named.lines().count(), 2, "{named}");
    }
}
