//! The Hermes format (NousResearch's, which Qwen2.5 and Qwen3 also use) over a chat
//! template: calls written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//! anywhere in the answer. (The Hermes prompt, which any template that does not read
//! `tools` gets, is `template`'s.)

use serde_json::Value;

use super::template::CallSyntax;
use super::{call_of, kept, whole_call, AnswerReader, CallEvent, Reading};
use crate::server::error::ApiError;
use crate::server::tools::Tools;

/// Hermes calls, the syntax of `--tool-call-parser hermes`.
#[derive(Debug)]
pub struct Hermes;

impl CallSyntax for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn auto_reading(&self, tools: &Tools) -> Result<Reading, ApiError> {
        let parallel = tools.parallel;
        Ok(Reading::new(move || Box::new(HermesReader::new(parallel))))
    }
}

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// Reads Hermes calls out of an answer as it arrives.
struct HermesReader {
    /// More than one call is kept (`parallel_tool_calls`).
    parallel: bool,
    /// Text not read yet (a possible `<tool_call>`'s start, or a call not complete).
    pending: String,
    calls: usize,
    /// Inside `<tool_call>`.
    in_call: bool,
}

impl HermesReader {
    fn new(parallel: bool) -> HermesReader {
        HermesReader {
            parallel,
            pending: String::new(),
            calls: 0,
            in_call: false,
        }
    }

    fn read(&mut self, events: &mut Vec<CallEvent>) {
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CALL_CLOSE) else {
                    return;
                };
                let body = self.pending[..end].to_string();
                self.pending.drain(..end + CALL_CLOSE.len());
                self.in_call = false;
                let call = serde_json::from_str::<Value>(body.trim())
                    .ok()
                    .and_then(|value| call_of(&value));
                match call {
                    Some((name, arguments)) => whole_call(&mut self.calls, name, arguments, events),
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

impl AnswerReader for HermesReader {
    fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.pending.push_str(text);
        let mut events = Vec::new();
        self.read(&mut events);
        kept(events, self.parallel)
    }

    fn finish(&mut self) -> Vec<CallEvent> {
        let rest = std::mem::take(&mut self.pending);
        let text = if self.in_call {
            format!("{CALL_OPEN}{rest}")
        } else {
            rest
        };
        kept(vec![CallEvent::Content(text)], self.parallel)
    }

    fn called(&self) -> bool {
        self.calls > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::formats::tests::{call, read};

    fn reader(parallel: bool) -> Box<dyn AnswerReader> {
        Box::new(HermesReader::new(parallel))
    }

    #[test]
    fn hermes_calls_are_read_whatever_the_chunking() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris <3\"}}\n</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>";
        for step in [1, 2, 3, 7, text.len()] {
            assert_eq!(
                read(reader(true), text, step),
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
        let (content, calls) = read(reader(true), plain, 1);
        assert_eq!((content.as_str(), calls.len()), (plain, 0));
        let broken = "x<tool_call>not json</tool_call>y<tool_call>{\"name\"";
        let (content, calls) = read(reader(true), broken, 4);
        assert_eq!((content.as_str(), calls.len()), (broken, 0));
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_kept() {
        let text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>";
        assert_eq!(
            read(reader(false), text, 3),
            (String::new(), vec![call("a", "{}")])
        );
    }
}
