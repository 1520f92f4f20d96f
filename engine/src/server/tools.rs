//! Tool calls: the request's `tools` and `tool_choice`, the Hermes system prompt for chat
//! templates that do not read `tools`, the grammar that enforces `required` and a named
//! function, and the reader that turns generated text into OpenAI `tool_calls`, chunk by
//! chunk (a whole answer is read by the same code in one chunk, so streamed and
//! non-streamed calls agree by construction).

use serde_json::{json, Map, Value};

use super::protocol::ApiError;
use crate::grammar::GrammarSpec;
use crate::tokenizer::ChatMessage;

/// How a model writes tool calls in its own text (`--tool-call-parser`, vLLM's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5, Qwen3).
    Hermes,
    /// A JSON object `{"name": ..., "parameters": {...}}` as the whole answer, several
    /// separated by `;` (Llama 3.1 / 3.2).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// gpt-oss's harmony: `commentary` messages to `functions.NAME` (vLLM's `openai`).
    #[value(name = "harmony", alias = "openai")]
    Harmony,
}

/// One function of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when absent).
    pub parameters: Value,
    /// The tool object as the request sent it (what chat templates read).
    pub raw: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tools of a chat request and what the model may do with them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): more than one call per answer.
    pub parallel: bool,
}

/// How to read an answer's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFormat {
    /// `auto`: the model's own format; only the first call is kept without `parallel`
    /// (`parallel_tool_calls: false`, as vLLM).
    Parsed {
        parser: ToolCallParser,
        parallel: bool,
    },
    /// `required`: the grammar's JSON array of `{"name", "parameters"}`.
    Array,
    /// A named function: the answer is its arguments.
    Arguments(String),
    /// gpt-oss's harmony stream: reasoning, answer, and (when `calls`) tool calls, whatever
    /// the choice (a grammar in the format enforces `required` and a named function).
    Harmony { calls: bool },
}

const TOOLS_HELP: &str =
    "a list of `{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}`";

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tools were sent.
pub fn parse_tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ApiError> {
    let parallel = parallel.unwrap_or(true);
    let Some(tools) = tools else {
        return match choice.map(Value::as_str) {
            None | Some(Some("none")) | Some(Some("auto")) => Ok(None),
            _ => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` other than \"none\" or \"auto\" needs `tools`",
            )),
        };
    };
    let Value::Array(items) = tools else {
        return Err(ApiError::wrong_type("tools", TOOLS_HELP));
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let tool = parse_tool(item, &format!("tools[{i}]"))?;
        if parsed.iter().any(|t| t.name == tool.name) {
            return Err(ApiError::invalid(
                &format!("tools[{i}].function.name"),
                format!("two tools are named `{}`", tool.name),
            ));
        }
        parsed.push(tool);
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be \"none\", \"auto\", \"required\" or a named function, got \"{other}\""),
                ))
            }
        },
        Some(Value::Object(obj)) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "a named `tool_choice` is `{\"type\": \"function\", \"function\": {\"name\": ...}}`",
                    )
                })?;
            if !parsed.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!("`tool_choice` names `{name}`, which is not among `tools`"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => {
            return Err(ApiError::wrong_type(
                "tool_choice",
                "\"none\", \"auto\", \"required\" or a named function",
            ))
        }
    };
    if parsed.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::invalid("tools", "`tools` must not be empty"));
    }
    Ok(Some(Tools {
        tools: parsed,
        choice,
        parallel,
    }))
}

fn parse_tool(item: &Value, path: &str) -> Result<Tool, ApiError> {
    let function = match (
        item.get("type").and_then(Value::as_str),
        item.get("function"),
    ) {
        (Some("function"), Some(Value::Object(f))) => f,
        _ => {
            return Err(ApiError::invalid(
                path,
                format!("`{path}` must be {TOOLS_HELP}"),
            ))
        }
    };
    for key in function.keys() {
        if !["name", "description", "parameters", "strict"].contains(&key.as_str()) {
            return Err(ApiError::invalid(
                &format!("{path}.function.{key}"),
                format!("Unrecognized request argument supplied: {path}.function.{key}"),
            ));
        }
    }
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                &format!("{path}.function.name"),
                "every function needs a non-empty `name`",
            )
        })?;
    let param = format!("{path}.function.parameters");
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(Value::Object(p)) => match p.get("type") {
            // The arguments are an object: a schema that says nothing of its type gets it.
            None => {
                let mut p = p.clone();
                p.insert("type".into(), json!("object"));
                Value::Object(p)
            }
            Some(t) if t == "object" => Value::Object(p.clone()),
            Some(t) => {
                return Err(ApiError::invalid(
                    &param,
                    format!("`{param}` must describe an object (the arguments), not type {t}"),
                ))
            }
        },
        Some(_) => return Err(ApiError::wrong_type(&param, "a JSON schema object")),
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
        raw: item.clone(),
    })
}

impl Tools {
    /// The grammar that enforces the choice: `required` is a JSON array of calls to the
    /// tools (one call without `parallel_tool_calls`), a named function its arguments.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Named(name) => self
                .tools
                .iter()
                .find(|t| &t.name == name)
                .map(|t| GrammarSpec::JsonSchema(t.parameters.clone())),
            ToolChoice::Required => {
                let calls: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "object",
                            "properties": {"name": {"const": t.name}, "parameters": t.parameters},
                            "required": ["name", "parameters"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let mut array = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if !self.parallel {
                    array["maxItems"] = json!(1);
                }
                Some(GrammarSpec::JsonSchema(array))
            }
        }
    }

    /// How to read the answer; `None` for `tool_choice: "none"`. `auto` needs a parser.
    pub fn call_format(
        &self,
        parser: Option<ToolCallParser>,
    ) -> Result<Option<CallFormat>, ApiError> {
        Ok(match &self.choice {
            ToolChoice::None => None,
            ToolChoice::Required => Some(CallFormat::Array),
            ToolChoice::Named(name) => Some(CallFormat::Arguments(name.clone())),
            ToolChoice::Auto => Some(CallFormat::Parsed {
                parser: parser.ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "`tool_choice: \"auto\"` needs a server started with `--tool-call-parser`; \
                         \"required\" or a named function work without one",
                    )
                })?,
                parallel: self.parallel,
            }),
        })
    }

    /// The template variable `tools`: the tool objects as sent.
    pub fn template_value(&self) -> Value {
        Value::Array(self.tools.iter().map(|t| t.raw.clone()).collect())
    }
}

/// The Hermes tool prompt (NousResearch's format, which Qwen2.5 also uses), for templates
/// that do not read `tools`: the tools in `<tools>`, and how to call them.
pub fn hermes_tool_prompt(tools: &Tools) -> String {
    let mut text = String::from(
        "You are a function calling AI model. You are provided with function signatures within \
         <tools></tools> XML tags. You may call one or more functions to assist with the user \
         query. Don't make assumptions about what values to plug into functions. Here are the \
         available tools:\n<tools>\n",
    );
    for tool in &tools.tools {
        text.push_str(&tool.raw.to_string());
        text.push('\n');
    }
    text.push_str(
        "</tools>\nFor each function call, return a JSON object with the function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// The conversation for a template that does not read `tools`: the Hermes tool prompt
/// joins (or becomes) the system message, earlier calls become `<tool_call>` text and tool
/// results `<tool_response>` user turns.
pub fn hermes_messages(messages: &[ChatMessage], tools: Option<&Tools>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = m.tool_calls.take() {
                for call in calls {
                    let function = &call["function"];
                    let body =
                        json!({"name": function["name"], "arguments": function["arguments"]});
                    if !m.content.is_empty() {
                        m.content.push('\n');
                    }
                    m.content
                        .push_str(&format!("<tool_call>\n{body}\n</tool_call>"));
                }
            }
            if m.role == "tool" {
                m.role = "user".into();
                m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
                m.tool_call_id = None;
            }
            m
        })
        .collect();
    if let Some(tools) = tools {
        let prompt = hermes_tool_prompt(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{prompt}", first.content);
            }
            _ => out.insert(
                0,
                ChatMessage {
                    role: "system".into(),
                    content: prompt,
                    ..ChatMessage::default()
                },
            ),
        }
    }
    out
}

/// An assistant message's `tool_calls`, checked, with `arguments` parsed into JSON (as
/// templates read them).
pub fn message_tool_calls(value: &Value, path: &str) -> Result<Vec<Value>, ApiError> {
    let Value::Array(calls) = value else {
        return Err(ApiError::wrong_type(path, "a list of tool calls"));
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let at = format!("{path}[{j}]");
            let function = call
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    ApiError::invalid(&at, format!("`{at}` needs a `function` object"))
                })?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(&format!("{at}.function.name"), "a tool call needs a `name`")
                })?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    ApiError::invalid(
                        &format!("{at}.function.arguments"),
                        format!("`{at}.function.arguments` is not valid JSON: {e}"),
                    )
                })?,
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => {
                    return Err(ApiError::wrong_type(
                        &format!("{at}.function.arguments"),
                        "a JSON string",
                    ))
                }
            };
            let mut out = json!({
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            });
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                out["id"] = json!(id);
            }
            Ok(out)
        })
        .collect()
}

/// What reading a piece of answer text gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEvent {
    /// Ordinary answer text.
    Content(String),
    /// Reasoning text (harmony's `analysis` channel).
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

/// Reads one answer's text as it arrives.
#[derive(Debug)]
pub struct CallReader {
    format: CallFormat,
    /// Text not read yet (a possible marker's start, or a call not complete).
    pending: String,
    calls: usize,
    /// Hermes: inside `<tool_call>`; Llama 3: the answer is JSON.
    in_call: bool,
    /// Llama 3: whether the answer's first character was seen.
    decided: bool,
    array: ArrayScan,
}

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

impl CallReader {
    pub fn new(format: CallFormat) -> CallReader {
        CallReader {
            format,
            pending: String::new(),
            calls: 0,
            in_call: false,
            decided: false,
            array: ArrayScan::default(),
        }
    }

    /// Whether any call was read.
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    fn start(&mut self, name: String) -> CallEvent {
        start_call(&mut self.calls, name)
    }

    /// Reads more answer text.
    pub fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.pending.push_str(text);
        let mut events = Vec::new();
        match self.format.clone() {
            CallFormat::Arguments(name) => {
                if self.calls == 0 {
                    events.push(self.start(name));
                }
                let delta = std::mem::take(&mut self.pending);
                if !delta.is_empty() {
                    events.push(CallEvent::Arguments { index: 0, delta });
                }
            }
            CallFormat::Array => {
                let calls = &mut self.calls;
                self.array.scan(
                    &self.pending,
                    &mut |name| start_call(calls, name),
                    &mut events,
                );
            }
            CallFormat::Parsed {
                parser: ToolCallParser::Hermes,
                ..
            } => self.read_hermes(&mut events),
            // Harmony streams have a reader of their own: routes make a
            // `harmony::HarmonyReader` for them, never a `CallReader`.
            CallFormat::Parsed {
                parser: ToolCallParser::Harmony,
                ..
            }
            | CallFormat::Harmony { .. } => {
                unreachable!("harmony answers are read by harmony::HarmonyReader")
            }
            CallFormat::Parsed {
                parser: ToolCallParser::Llama3Json,
                ..
            } => {
                if !self.decided {
                    match self.pending.trim_start().chars().next() {
                        None => return events,
                        Some(c) => {
                            self.decided = true;
                            self.in_call = c == '{';
                        }
                    }
                }
                if !self.in_call {
                    events.push(CallEvent::Content(std::mem::take(&mut self.pending)));
                }
            }
        }
        self.keep(events)
    }

    /// Drops empty text, and every call after the first without parallel calls.
    fn keep(&self, mut events: Vec<CallEvent>) -> Vec<CallEvent> {
        let single = matches!(
            self.format,
            CallFormat::Parsed {
                parallel: false,
                ..
            }
        );
        events.retain(|e| match e {
            CallEvent::Content(t) | CallEvent::Reasoning(t) => !t.is_empty(),
            CallEvent::Start { index, .. } | CallEvent::Arguments { index, .. } => {
                !single || *index == 0
            }
        });
        events
    }

    /// The answer ended: whatever was held is read for good.
    pub fn finish(&mut self) -> Vec<CallEvent> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        match self.format {
            CallFormat::Parsed {
                parser: ToolCallParser::Hermes,
                ..
            } if self.in_call => {
                events.push(CallEvent::Content(format!("{CALL_OPEN}{rest}")));
            }
            CallFormat::Parsed {
                parser: ToolCallParser::Llama3Json,
                ..
            } if self.in_call => match parse_llama3_calls(&rest) {
                Some(calls) => {
                    for (name, arguments) in calls {
                        let start = self.start(name);
                        let index = self.calls - 1;
                        events.push(start);
                        events.push(CallEvent::Arguments {
                            index,
                            delta: arguments,
                        });
                    }
                }
                None => events.push(CallEvent::Content(rest)),
            },
            CallFormat::Array | CallFormat::Arguments(_) | CallFormat::Harmony { .. } => {}
            CallFormat::Parsed { .. } => events.push(CallEvent::Content(rest)),
        }
        self.keep(events)
    }

    fn read_hermes(&mut self, events: &mut Vec<CallEvent>) {
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CALL_CLOSE) else {
                    return;
                };
                let body = self.pending[..end].to_string();
                self.pending.drain(..end + CALL_CLOSE.len());
                self.in_call = false;
                match parse_call_object(body.trim()) {
                    Some((name, arguments)) => {
                        let start = self.start(name);
                        let index = self.calls - 1;
                        events.push(start);
                        events.push(CallEvent::Arguments {
                            index,
                            delta: arguments,
                        });
                    }
                    // Not a call after all: the text is kept as answer text.
                    None => {
                        events.push(CallEvent::Content(format!("{CALL_OPEN}{body}{CALL_CLOSE}")))
                    }
                }
            } else if let Some(at) = self.pending.find(CALL_OPEN) {
                let before: String = self.pending.drain(..at).collect();
                self.pending.drain(..CALL_OPEN.len());
                self.in_call = true;
                self.push_content(before, events);
            } else {
                // Hold back what could be the start of `<tool_call>`.
                let keep = (1..CALL_OPEN.len())
                    .rev()
                    .find(|&k| self.pending.ends_with(&CALL_OPEN[..k]))
                    .unwrap_or(0);
                let cut = self.pending.len() - keep;
                let text: String = self.pending.drain(..cut).collect();
                self.push_content(text, events);
                return;
            }
        }
    }

    /// Answer text; once a call was made, the whitespace between calls is dropped.
    fn push_content(&self, text: String, events: &mut Vec<CallEvent>) {
        if !(self.called() && text.trim().is_empty()) {
            events.push(CallEvent::Content(text));
        }
    }
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

/// `{"name": ..., "arguments" | "parameters": {...}}` as (name, compact arguments JSON).
fn parse_call_object(text: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(text).ok()?;
    call_of(&value)
}

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

/// Llama 3's JSON calls: one object, or several separated by `;`.
fn parse_llama3_calls(text: &str) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(call_of(&value)?);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// An OpenAI-style call id.
pub fn new_call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// A scan of the `required` grammar's JSON array `[{"name": ..., "parameters": {...}}, ...]`
/// as it arrives: a call starts when its `"parameters":` key is read (the name comes first
/// in the schema), and its arguments are the text of that value.
#[derive(Debug, Default)]
struct ArrayScan {
    /// Bytes of the text already scanned.
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Where the current element (`{` at depth 2) began.
    element: Option<usize>,
    /// The current call's index, where its arguments began, and how far they were sent.
    arguments: Option<(usize, usize, usize)>,
}

impl ArrayScan {
    fn scan(
        &mut self,
        text: &str,
        start: &mut dyn FnMut(String) -> CallEvent,
        events: &mut Vec<CallEvent>,
    ) {
        let bytes = text.as_bytes();
        while self.scanned < bytes.len() {
            let i = self.scanned;
            self.scanned += 1;
            let c = bytes[i];
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.depth == 2 && c == b'{' {
                        self.element = Some(i);
                    }
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 2 {
                        if let Some((index, from, sent)) = self.arguments.take() {
                            push_arguments(events, index, &text[from.max(sent)..=i]);
                        }
                    }
                }
                b':' if self.depth == 2 && self.arguments.is_none() => {
                    let Some(element) = self.element else {
                        continue;
                    };
                    let head = &text[element..i];
                    if head.trim_end().ends_with("\"parameters\"") {
                        let name = serde_json::from_str::<Value>(&format!("{head}:null}}"))
                            .ok()
                            .and_then(|v| v.get("name")?.as_str().map(str::to_string))
                            .unwrap_or_default();
                        let event = start(name);
                        if let CallEvent::Start { index, .. } = &event {
                            self.arguments = Some((*index, i + 1, i + 1));
                        }
                        events.push(event);
                    }
                }
                _ => {}
            }
        }
        if let Some((index, from, sent)) = self.arguments.as_mut() {
            let begin = (*from).max(*sent);
            push_arguments(events, *index, &text[begin..]);
            *sent = text.len();
        }
    }
}

/// More arguments text of call `index`.
fn push_arguments(events: &mut Vec<CallEvent>, index: usize, delta: &str) {
    if !delta.is_empty() {
        events.push(CallEvent::Arguments {
            index,
            delta: delta.to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERMES: CallFormat = CallFormat::Parsed {
        parser: ToolCallParser::Hermes,
        parallel: true,
    };
    const LLAMA3_JSON: CallFormat = CallFormat::Parsed {
        parser: ToolCallParser::Llama3Json,
        parallel: true,
    };

    /// Feeds `text` in pieces of `step` bytes (at char boundaries) and joins what was read:
    /// (content, [(name, arguments)]).
    fn read(format: CallFormat, text: &str, step: usize) -> (String, Vec<(String, String)>) {
        let mut reader = CallReader::new(format);
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

    fn call(name: &str, args: &str) -> (String, String) {
        (name.to_string(), args.to_string())
    }

    #[test]
    fn hermes_calls_are_read_whatever_the_chunking() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris <3\"}}\n</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>";
        for step in [1, 2, 3, 7, text.len()] {
            assert_eq!(
                read(HERMES, text, step),
                (
                    "Let me check.\n".to_string(),
                    vec![
                        call("get_weather", r#"{"city":"Paris <3"}"#),
                        call("get_time", "{}")
                    ]
                ),
                "step {step}"
            );
        }
        // A `<` that opens no call, an unterminated call and a body that is no call stay text.
        let plain = "a < b <tool_c";
        let (content, calls) = read(HERMES, plain, 1);
        assert_eq!((content.as_str(), calls.len()), (plain, 0));
        let broken = "x<tool_call>not json</tool_call>y<tool_call>{\"name\"";
        let (content, calls) = read(HERMES, broken, 4);
        assert_eq!((content.as_str(), calls.len()), (broken, 0));
    }

    #[test]
    fn llama3_json_calls_are_the_whole_answer() {
        let format = LLAMA3_JSON;
        let text = " {\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}; {\"name\": \"f\", \"parameters\": {}}";
        assert_eq!(
            read(format.clone(), text, 5),
            (
                String::new(),
                vec![call("get_time", r#"{"tz":"UTC"}"#), call("f", "{}")]
            )
        );
        assert_eq!(
            read(format.clone(), "It is noon.", 3),
            ("It is noon.".to_string(), vec![])
        );
        assert_eq!(
            read(format, "{\"oops\": 1}", 3),
            ("{\"oops\": 1}".to_string(), vec![])
        );
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_kept() {
        let text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>";
        let format = CallFormat::Parsed {
            parser: ToolCallParser::Hermes,
            parallel: false,
        };
        assert_eq!(
            read(format, text, 3),
            (String::new(), vec![call("a", "{}")])
        );
    }

    #[test]
    fn parameters_describe_an_object() {
        let tool = |parameters: Value| {
            parse_tool(
                &json!({"type": "function", "function": {"name": "f", "parameters": parameters}}),
                "tools[0]",
            )
        };
        assert_eq!(
            tool(json!({})).unwrap().parameters,
            json!({"type": "object"})
        );
        let e = tool(json!({"type": "string"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
    }

    #[test]
    fn the_required_array_streams_each_calls_arguments() {
        let text = r#"[{"name":"get_weather","parameters":{"city":"a \"}\" b"}},{"name":"get_time","parameters":{"tz":"UTC"}}]"#;
        for step in [1, 2, 5, text.len()] {
            assert_eq!(
                read(CallFormat::Array, text, step),
                (
                    String::new(),
                    vec![
                        call("get_weather", r#"{"city":"a \"}\" b"}"#),
                        call("get_time", r#"{"tz":"UTC"}"#)
                    ]
                ),
                "step {step}"
            );
        }
        assert_eq!(
            read(CallFormat::Arguments("f".into()), r#"{"x":1}"#, 2),
            (String::new(), vec![call("f", r#"{"x":1}"#)])
        );
    }

    #[test]
    fn required_grammar_lists_every_tool_and_honours_parallel_calls() {
        let tools = parse_tools(
            Some(&json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                         {"type": "function", "function": {"name": "g"}}])),
            Some(&json!("required")),
            Some(false),
        )
        .unwrap()
        .unwrap();
        let Some(GrammarSpec::JsonSchema(schema)) = tools.grammar() else {
            panic!("required is a JSON schema");
        };
        assert_eq!(schema["maxItems"], 1);
        assert_eq!(schema["minItems"], 1);
        let names: Vec<&Value> = schema["items"]["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["properties"]["name"]["const"])
            .collect();
        assert_eq!(names, [&json!("f"), &json!("g")]);
        assert_eq!(tools.call_format(None).unwrap(), Some(CallFormat::Array));
    }

    #[test]
    fn templates_without_tools_get_the_hermes_prompt_and_turns() {
        let tools = parse_tools(
            Some(&json!([{"type": "function", "function": {"name": "f"}}])),
            None,
            None,
        )
        .unwrap()
        .unwrap();
        let messages = vec![
            ChatMessage {
                role: "user".into(),
                content: "hi".into(),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "assistant".into(),
                tool_calls: Some(vec![
                    json!({"function": {"name": "f", "arguments": {"a": 1}}}),
                ]),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "42".into(),
                tool_call_id: Some("c".into()),
                ..ChatMessage::default()
            },
        ];
        let out = hermes_messages(&messages, Some(&tools));
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(
            out[0].content.contains(
                r#"<tools>
{"type":"function","function":{"name":"f"}}
</tools>"#
            ),
            "{}",
            out[0].content
        );
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>"
        );
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("user", "<tool_response>\n42\n</tool_response>")
        );
    }
}
