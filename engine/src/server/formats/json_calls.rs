//! Tool calls as the JSON that a grammar enforces, whatever the model's own syntax: the
//! `required` choice's array of `{"name", "parameters"}` objects and a named function's
//! arguments, with the readers that stream them.

use serde_json::{json, Value};

use super::{start_call, AnswerReader, CallEvent, Reading};
use crate::grammar::GrammarSpec;
use crate::server::tools::{ToolChoice, Tools};

/// The grammar that enforces a tool choice as JSON: `required` is a JSON array of calls to
/// the tools (one call without `parallel_tool_calls`), a named function its arguments.
pub fn grammar(tools: &Tools) -> Option<GrammarSpec> {
    match &tools.choice {
        ToolChoice::None | ToolChoice::Auto => None,
        ToolChoice::Named(name) => tools
            .tools
            .iter()
            .find(|t| &t.name == name)
            .map(|t| GrammarSpec::JsonSchema(t.parameters.clone())),
        ToolChoice::Required => {
            let calls: Vec<Value> = tools
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
            if !tools.parallel {
                array["maxItems"] = json!(1);
            }
            Some(GrammarSpec::JsonSchema(array))
        }
    }
}

/// The reading of the `required` array.
pub fn array_reading() -> Reading {
    Reading::new(|| {
        Box::new(ArrayReader {
            text: String::new(),
            calls: 0,
            scan: ArrayScan::default(),
        })
    })
}

/// The reading of a named function's arguments (the whole answer).
pub fn arguments_reading(name: String) -> Reading {
    Reading::new(move || {
        Box::new(ArgumentsReader {
            name: name.clone(),
            started: false,
        })
    })
}

/// Reads the `required` array as it arrives.
struct ArrayReader {
    /// The answer so far (the scan keeps its place in it).
    text: String,
    calls: usize,
    scan: ArrayScan,
}

impl AnswerReader for ArrayReader {
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.text.push_str(text);
        let mut events = Vec::new();
        let calls = &mut self.calls;
        self.scan
            .scan(&self.text, &mut |name| start_call(calls, name), &mut events);
        super::kept(events, true)
    }

    fn finish(&mut self) -> Vec<CallEvent> {
        Vec::new()
    }

    fn called(&self) -> bool {
        self.calls > 0
    }
}

/// Reads a named function's arguments: the call starts with the answer.
struct ArgumentsReader {
    name: String,
    started: bool,
}

impl AnswerReader for ArgumentsReader {
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        let mut events = Vec::new();
        if !self.started {
            self.started = true;
            let mut calls = 0;
            events.push(start_call(&mut calls, self.name.clone()));
        }
        if !text.is_empty() {
            events.push(CallEvent::Arguments {
                index: 0,
                delta: text.to_string(),
            });
        }
        events
    }

    fn finish(&mut self) -> Vec<CallEvent> {
        Vec::new()
    }

    fn called(&self) -> bool {
        self.started
    }
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
    use crate::server::formats::template::{NoParser, TemplateFormat, TemplatePrompt};
    use crate::server::formats::tests::{call, read};
    use crate::server::formats::ChatFormat;
    use crate::server::tools::parse_tools;

    #[test]
    fn the_required_array_streams_each_calls_arguments() {
        let text = r#"[{"name":"get_weather","parameters":{"city":"a \"}\" b"}},{"name":"get_time","parameters":{"tz":"UTC"}}]"#;
        for step in [1, 2, 5, text.len()] {
            assert_eq!(
                read(array_reading().reader(), text, step),
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
            read(arguments_reading("f".into()).reader(), r#"{"x":1}"#, 2),
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
        let Some(GrammarSpec::JsonSchema(schema)) = grammar(&tools) else {
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
        // Without a tool-call parser, the array the grammar enforces is read as the calls.
        let plain = TemplateFormat {
            template: TemplatePrompt::default(),
            think: None,
            calls: NoParser,
        };
        let reading = plain.reading(Some(&tools)).unwrap().unwrap();
        assert_eq!(
            read(reading.reader(), r#"[{"name":"f","parameters":{}}]"#, 3),
            (String::new(), vec![call("f", "{}")])
        );
    }
}
