//! Qwen3-Coder's XML tool calls (Qwen3-Coder, Qwen3.5, Qwen3.6) over a chat template,
//! vLLM's `qwen3_coder`:
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! anywhere in the answer, or opened by a bare `<function=NAME>` of a tool, as Qwen3-Coder
//! sometimes writes (llama.cpp reads those, and vLLM when not streaming). A value is text
//! (its one leading and one trailing newline are the syntax's), typed by its property's
//! schema ([`values`]); `required` and a named function are forced in the same syntax
//! ([`grammar`]) and read by the same reader.

mod grammar;
mod values;

use std::sync::Arc;

use serde_json::{Map, Value};

use super::template::CallSyntax;
use super::{kept, whole_call, AnswerReader, CallEvent, Reading};
use crate::grammar::GrammarSpec;
use crate::server::error::ApiError;
use crate::server::tools::Tools;

/// Qwen3-Coder's XML calls, the syntax of `--tool-call-parser qwen3_coder`.
#[derive(Debug)]
pub struct Qwen3Coder;

impl CallSyntax for Qwen3Coder {
    fn name(&self) -> &'static str {
        "qwen3_coder"
    }

    fn auto_reading(&self, tools: &Tools) -> Result<Reading, ApiError> {
        Ok(reading(tools))
    }

    fn tool_grammar(&self, tools: &Tools) -> Option<GrammarSpec> {
        grammar::tool_grammar(tools)
    }

    fn forced_reading(&self, tools: &Tools) -> Reading {
        reading(tools)
    }
}

/// The reading of answers to `tools`: each choice's reader shares them.
fn reading(tools: &Tools) -> Reading {
    let known = Arc::new(Known {
        bare_openers: tools
            .tools
            .iter()
            .map(|t| format!("{FUNCTION_OPEN}{}>", t.name))
            .collect(),
        tools: tools.clone(),
    });
    Reading::new(move || Box::new(XmlReader::new(known.clone())))
}

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAMETER_OPEN: &str = "<parameter=";
const PARAMETER_CLOSE: &str = "</parameter>";

/// What a reader knows of the request's tools.
struct Known {
    tools: Tools,
    /// `<function=NAME>` of each tool, which opens a call without `<tool_call>`.
    bare_openers: Vec<String>,
}

/// Where the reader is in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Answer text.
    Text,
    /// In a call, whose text the pending text begins with: opened by `<tool_call>`
    /// (`wrapped`) or by a bare `<function=NAME>`; `searched` bytes of it hold no close
    /// that ends it.
    Call { wrapped: bool, searched: usize },
    /// After a bare call, which a `</tool_call>` may still close.
    AfterBare,
}

/// Reads XML calls out of an answer as it arrives; a call is sent whole once it closes.
struct XmlReader {
    known: Arc<Known>,
    /// Text not read yet (a possible opener's start, or a call not closed).
    pending: String,
    calls: usize,
    place: Place,
    /// A call was just read: the whitespace that follows it is dropped.
    after_call: bool,
}

impl XmlReader {
    fn new(known: Arc<Known>) -> XmlReader {
        XmlReader {
            known,
            pending: String::new(),
            calls: 0,
            place: Place::Text,
            after_call: false,
        }
    }

    fn read(&mut self, events: &mut Vec<CallEvent>) {
        loop {
            match self.place {
                Place::Text => match self.opener() {
                    Some((at, wrapped)) => {
                        let before: String = self.pending.drain(..at).collect();
                        self.push_content(before, events);
                        self.place = Place::Call {
                            wrapped,
                            searched: 0,
                        };
                    }
                    None => {
                        let cut = self.pending.len() - self.held();
                        let text: String = self.pending.drain(..cut).collect();
                        self.push_content(text, events);
                        return;
                    }
                },
                Place::Call { wrapped, searched } => {
                    let close = if wrapped { CALL_CLOSE } else { FUNCTION_CLOSE };
                    let Some(found) = self.pending[searched..].find(close) else {
                        // The close may yet end in the last bytes.
                        let mut searched = self.pending.len().saturating_sub(close.len() - 1);
                        while !self.pending.is_char_boundary(searched) {
                            searched -= 1;
                        }
                        self.place = Place::Call { wrapped, searched };
                        return;
                    };
                    let at = searched + found;
                    let end = at + close.len();
                    let body = if wrapped {
                        &self.pending[CALL_OPEN.len()..at]
                    } else {
                        &self.pending[..end]
                    };
                    match parse_call(body, &self.known.tools) {
                        // The close is in a parameter's value: the call goes on.
                        Parsed::Open => {
                            self.place = Place::Call {
                                wrapped,
                                searched: at + 1,
                            }
                        }
                        Parsed::Call(name, arguments) => {
                            self.pending.drain(..end);
                            whole_call(&mut self.calls, name, arguments, events);
                            self.after_call = true;
                            self.place = if wrapped {
                                Place::Text
                            } else {
                                Place::AfterBare
                            };
                        }
                        // Not a call after all: the text is kept as answer text.
                        Parsed::Malformed => {
                            let text: String = self.pending.drain(..end).collect();
                            self.push_content(text, events);
                            self.place = Place::Text;
                        }
                    }
                }
                Place::AfterBare => {
                    let rest = self.pending.trim_start();
                    if rest.starts_with(CALL_CLOSE) {
                        let end = self.pending.len() - rest.len() + CALL_CLOSE.len();
                        self.pending.drain(..end);
                    } else if CALL_CLOSE.starts_with(rest) {
                        return;
                    }
                    self.place = Place::Text;
                }
            }
        }
    }

    /// Where the first call opens in the pending text, and whether with `<tool_call>`.
    fn opener(&self) -> Option<(usize, bool)> {
        let wrapped = self.pending.find(CALL_OPEN).map(|at| (at, true));
        let bare = (self.known.bare_openers.iter())
            .filter_map(|o| self.pending.find(o.as_str()))
            .min()
            .map(|at| (at, false));
        wrapped.into_iter().chain(bare).min()
    }

    /// How many bytes at the end of the pending text may begin an opener (held back).
    fn held(&self) -> usize {
        std::iter::once(CALL_OPEN)
            .chain(self.known.bare_openers.iter().map(String::as_str))
            .flat_map(|o| {
                (1..o.len()).filter(|&k| o.is_char_boundary(k) && self.pending.ends_with(&o[..k]))
            })
            .max()
            .unwrap_or(0)
    }

    /// Answer text, less the whitespace right after a call (however it arrives).
    fn push_content(&mut self, text: String, events: &mut Vec<CallEvent>) {
        let text = match self.after_call {
            true => text.trim_start(),
            false => &text,
        };
        if !text.is_empty() {
            self.after_call = false;
            events.push(CallEvent::Content(text.to_string()));
        }
    }
}

impl AnswerReader for XmlReader {
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.pending.push_str(text);
        let mut events = Vec::new();
        self.read(&mut events);
        kept(events, self.known.tools.parallel)
    }

    /// What is held is text: an opener's start, or a call that never closed.
    fn finish(&mut self) -> Vec<CallEvent> {
        self.place = Place::Text;
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        self.push_content(rest, &mut events);
        kept(events, self.known.tools.parallel)
    }

    fn called(&self) -> bool {
        self.calls > 0
    }
}

/// What a call's text holds.
#[derive(Debug, PartialEq)]
enum Parsed {
    /// A call: its name and its arguments as a JSON object.
    Call(String, String),
    /// A parameter's value is not closed yet.
    Open,
    /// Not a call.
    Malformed,
}

/// Reads `<function=NAME>`, its parameters and `</function>` (with only whitespace around),
/// typing each value by `tools`' schema of that function. A value ends at the first
/// `</parameter>` that another parameter, `</function>` or the end of `body` follows
/// (a value may hold `</parameter>` otherwise); a later key replaces an earlier one.
fn parse_call(body: &str, tools: &Tools) -> Parsed {
    let Some(rest) = body.trim_start().strip_prefix(FUNCTION_OPEN) else {
        return Parsed::Malformed;
    };
    let Some((name, mut rest)) = rest.split_once('>').filter(|(n, _)| is_name(n)) else {
        return Parsed::Malformed;
    };
    let properties = (tools.tools.iter())
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(FUNCTION_CLOSE) {
            return match after.trim().is_empty() {
                true => Parsed::Call(name.to_string(), Value::Object(arguments).to_string()),
                false => Parsed::Malformed,
            };
        }
        let Some((key, value)) = (rest.strip_prefix(PARAMETER_OPEN))
            .and_then(|p| p.split_once('>'))
            .filter(|(k, _)| !k.is_empty() && !k.contains(['<', '\n']))
        else {
            return Parsed::Malformed;
        };
        let Some((text, after)) = parameter_value(value) else {
            return Parsed::Open;
        };
        let schema = properties.and_then(|p| p.get(key));
        arguments.insert(key.to_string(), values::typed(text, schema));
        rest = after;
    }
}

/// A parameter's value text (less the syntax's newline on each side) and what follows its
/// `</parameter>`; `None` while no `</parameter>` ends it.
fn parameter_value(text: &str) -> Option<(&str, &str)> {
    let mut from = 0;
    loop {
        let at = from + text[from..].find(PARAMETER_CLOSE)?;
        let after = &text[at + PARAMETER_CLOSE.len()..];
        let next = after.trim_start();
        if next.is_empty() || next.starts_with(PARAMETER_OPEN) || next.starts_with(FUNCTION_CLOSE) {
            let value = &text[..at];
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            return Some((value, after));
        }
        from = at + 1;
    }
}

/// A function name: not empty, and none of the characters that show it to be something
/// else (template syntax, markup, quotes, whitespace), as vLLM checks.
fn is_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['{', '}', '<', '>', '"', '\'', ' ', '\t', '\n', '\r'])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::server::formats::template::{TemplateFormat, TemplatePrompt};
    use crate::server::formats::tests::{call, read};
    use crate::server::formats::{ChatFormat, Conversation};
    use crate::server::tools::parse_tools;
    use crate::tokenizer::{ChatMessage, Tokenizer};

    fn tools(parallel: bool) -> Tools {
        let weather = json!({"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "metric": {"type": "boolean"}, "hours": {"type": "array", "items": {"type": "integer"}}}});
        let time = json!({"type": "object", "properties": {"tz": {"type": "string"}}});
        parse_tools(
            Some(&json!([
                {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
                {"type": "function", "function": {"name": "get_time", "parameters": time}},
            ])),
            None,
            Some(parallel),
        )
        .unwrap()
        .unwrap()
    }

    fn reader(parallel: bool) -> Box<dyn AnswerReader> {
        reading(&tools(parallel)).reader()
    }

    /// `text` read whole, checked to read the same in pieces of every size.
    fn read_every_way(parallel: bool, text: &str) -> (String, Vec<(String, String)>) {
        let whole = read(reader(parallel), text, text.len());
        for step in 1..text.len() {
            assert_eq!(
                read(reader(parallel), text, step),
                whole,
                "step {step}: {text:?}"
            );
        }
        whole
    }

    const TIME_CALL: &str =
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn calls_are_read_typed_by_their_schema_whatever_the_chunking() {
        let text = format!(
            "Let me check, café <3 <tool_call>\n<function=get_weather>\n\
             <parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n3\n</parameter>\n\
             <parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n\
             <parameter=note>\n7\n</parameter>\n</function>\n</tool_call>\n{TIME_CALL}\nDone."
        );
        assert_eq!(
            read_every_way(true, &text),
            (
                "Let me check, café <3 Done.".to_string(),
                vec![
                    call(
                        "get_weather",
                        r#"{"city":"São Paulo","days":3,"metric":true,"hours":[9,12],"note":"7"}"#
                    ),
                    call("get_time", r#"{"tz":"UTC"}"#),
                ]
            )
        );
        // Without parallel calls only the first is kept.
        assert_eq!(
            read_every_way(false, &format!("{TIME_CALL}\n{TIME_CALL}")),
            (String::new(), vec![call("get_time", r#"{"tz":"UTC"}"#)])
        );
    }

    /// A value keeps its inner newlines and any markup that does not end it, `</tool_call>`
    /// included; a function no tool names has its values as strings.
    #[test]
    fn values_hold_markup_that_does_not_end_them() {
        let text = "<tool_call>\n<function=write>\n<parameter=code>\n\nx = \"</tool_call>\"\n\
                    y = \"</parameter>\"\n\n</parameter>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            read_every_way(true, text),
            (
                String::new(),
                vec![call(
                    "write",
                    r#"{"code":"\nx = \"</tool_call>\"\ny = \"</parameter>\"\n","n":"1"}"#
                )]
            )
        );
    }

    /// Qwen3-Coder sometimes leaves `<tool_call>` out: `<function=NAME>` of a tool opens a
    /// call, and a `</tool_call>` right after it is dropped; other `<function` text is text.
    #[test]
    fn a_tools_bare_function_opens_a_call() {
        let text =
            "<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>\nok";
        assert_eq!(
            read_every_way(true, text),
            ("ok".to_string(), vec![call("get_time", r#"{"tz":"CET"}"#)])
        );
        let plain = "#include <functional>\n<function=nope>\n</function> <function=get_time";
        assert_eq!(read_every_way(true, plain), (plain.to_string(), vec![]));
    }

    #[test]
    fn malformed_and_unclosed_calls_stay_text() {
        for text in [
            // No `</function>`.
            "a<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</tool_call>b",
            // Not XML; a name that is template syntax.
            "<tool_call>{\"name\": \"get_time\"}</tool_call>",
            "<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>",
            // Cut off in a value, or before the call closes.
            "x <tool_call>\n<function=get_time>\n<parameter=tz>\nUT",
            "x <tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n",
            "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</func",
        ] {
            assert_eq!(read_every_way(true, text), (text.to_string(), vec![]));
        }
        // A malformed call does not hide the next one.
        let text = format!("<tool_call>oops</tool_call> {TIME_CALL}");
        assert_eq!(
            read_every_way(true, &text),
            (
                "<tool_call>oops</tool_call> ".to_string(),
                vec![call("get_time", r#"{"tz":"UTC"}"#)]
            )
        );
    }

    /// What may begin `<tool_call>` is held back, and sent once it turns out not to.
    #[test]
    fn a_possible_opener_is_held_until_it_is_not_one() {
        let mut r = reader(true);
        assert_eq!(r.push("a <tool_c"), vec![CallEvent::Content("a ".into())]);
        assert_eq!(r.push("al"), vec![]);
        assert_eq!(
            r.push("m> b"),
            vec![CallEvent::Content("<tool_calm> b".into())]
        );
        assert_eq!(
            r.push(" <function=get_t"),
            vec![CallEvent::Content(" ".into())]
        );
        assert_eq!(
            r.finish(),
            vec![CallEvent::Content("<function=get_t".into())]
        );
        assert!(!r.called());
    }

    /// Qwen3.5's own template (`templates/qwen3_5.jinja`) renders the tools and a turn's
    /// earlier calls, their arguments as the objects the request's JSON strings were read
    /// into, and the tool results.
    #[test]
    fn qwen3_5s_template_renders_tools_calls_and_results() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let template = root.join("templates/qwen3_5.jinja");
        let mut tokenizer =
            Tokenizer::from_model_path(&root.join("../shared/golden/llama-tiny")).unwrap();
        let source = std::fs::read_to_string(&template).unwrap();
        tokenizer.set_chat_template(source, &template).unwrap();
        let format = TemplateFormat {
            template: TemplatePrompt::of(&tokenizer, Map::new()),
            think: None,
            calls: Qwen3Coder,
        };
        let message = |role: &str, content: &str| ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        };
        let messages = [
            message("user", "Weather in Oslo?"),
            ChatMessage {
                tool_calls: Some(vec![json!({"type": "function", "id": "c1", "function": {
                    "name": "get_weather",
                    "arguments": {"city": "Oslo", "days": 2, "hours": [9, 12]}}})]),
                ..message("assistant", "")
            },
            ChatMessage {
                tool_call_id: Some("c1".into()),
                ..message("tool", "rain")
            },
        ];
        let tools = tools(true);
        let text = format
            .render(
                Conversation {
                    messages: &messages,
                    tools: Some(&tools),
                    template_kwargs: None,
                    reasoning_effort: None,
                    add_generation_prompt: true,
                },
                &tokenizer,
            )
            .unwrap();
        assert!(
            text.starts_with("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{"),
            "{text}"
        );
        assert!(text.contains("\"name\":\"get_time\""), "{text}");
        assert!(
            text.ends_with(
                "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n\
                 <think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n\
                 <parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n\
                 <parameter=hours>\n[9,12]\n</parameter>\n</function>\n</tool_call><|im_end|>\n\
                 <|im_start|>user\n<tool_response>\nrain\n</tool_response><|im_end|>\n\
                 <|im_start|>assistant\n<think>\n"
            ),
            "{text}"
        );
    }
}
