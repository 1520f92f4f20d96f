//! Llama 3.1 / 3.2's JSON tool calls over a chat template: an answer that opens with `{` is
//! one call object `{"name": ..., "parameters": {...}}`, or several separated by `;`; any
//! other answer is text.

use serde_json::Value;

use super::template::CallSyntax;
use super::{call_of, kept, whole_call, AnswerReader, CallEvent, Reading};
use crate::server::error::ApiError;
use crate::server::tools::Tools;

/// Llama 3 JSON calls, the syntax of `--tool-call-parser llama3_json`.
#[derive(Debug)]
pub struct Llama3Json;

impl CallSyntax for Llama3Json {
    fn name(&self) -> &'static str {
        "llama3_json"
    }

    fn auto_reading(&self, tools: &Tools) -> Result<Reading, ApiError> {
        let parallel = tools.parallel;
        Ok(Reading::new(move || {
            Box::new(Llama3JsonReader::new(parallel))
        }))
    }
}

/// Reads an answer as Llama 3 JSON calls: text is passed on until the answer shows it is
/// JSON, which is then read whole when the answer ends.
struct Llama3JsonReader {
    /// More than one call is kept (`parallel_tool_calls`).
    parallel: bool,
    pending: String,
    calls: usize,
    /// Whether the answer's first character was seen, and whether it opened JSON.
    decided: bool,
    json: bool,
}

impl Llama3JsonReader {
    fn new(parallel: bool) -> Llama3JsonReader {
        Llama3JsonReader {
            parallel,
            pending: String::new(),
            calls: 0,
            decided: false,
            json: false,
        }
    }
}

impl AnswerReader for Llama3JsonReader {
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.pending.push_str(text);
        if !self.decided {
            match self.pending.trim_start().chars().next() {
                None => return Vec::new(),
                Some(c) => {
                    self.decided = true;
                    self.json = c == '{';
                }
            }
        }
        if self.json {
            return Vec::new();
        }
        kept(
            vec![CallEvent::Content(std::mem::take(&mut self.pending))],
            self.parallel,
        )
    }

    fn finish(&mut self) -> Vec<CallEvent> {
        let rest = std::mem::take(&mut self.pending);
        let mut events = Vec::new();
        let calls = if self.json {
            parse_llama3_calls(&rest)
        } else {
            None
        };
        match calls {
            Some(calls) => {
                for (name, arguments) in calls {
                    whole_call(&mut self.calls, name, arguments, &mut events);
                }
            }
            None => events.push(CallEvent::Content(rest)),
        }
        kept(events, self.parallel)
    }

    fn called(&self) -> bool {
        self.calls > 0
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::formats::tests::{call, read};

    fn reader() -> Box<dyn AnswerReader> {
        Box::new(Llama3JsonReader::new(true))
    }

    #[test]
    fn llama3_json_calls_are_the_whole_answer() {
        let text = " {\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}; {\"name\": \"f\", \"parameters\": {}}";
        assert_eq!(
            read(reader(), text, 5),
            (
                String::new(),
                vec![call("get_time", r#"{"tz":"UTC"}"#), call("f", "{}")]
            )
        );
        assert_eq!(
            read(reader(), "It is noon.", 3),
            ("It is noon.".to_string(), vec![])
        );
        assert_eq!(
            read(reader(), "{\"oops\": 1}", 3),
            ("{\"oops\": 1}".to_string(), vec![])
        );
    }
}
