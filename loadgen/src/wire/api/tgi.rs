//! Hugging Face TGI's native `POST /generate_stream`: `{"inputs", "parameters"}` in, one
//! event per token out (`token.text`, `special` for end-of-sequence tokens), the last one
//! with `details.finish_reason`; no `[DONE]` and no usage on the stream, so output tokens are
//! counted from the token events. TGI has no way to ignore EOS: short outputs are flagged.

use std::borrow::Cow;

use anyhow::{bail, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Api, StreamEvent};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::RequestSpec;
use crate::wire::target::Target;

pub(super) struct Tgi;

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default)]
    error: Option<String>,
    #[serde(default, borrow)]
    token: Option<Token<'a>>,
    #[serde(default)]
    details: Option<Details>,
}

#[derive(Deserialize)]
struct Token<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    finish_reason: Option<serde::de::IgnoredAny>,
}

impl Api for Tgi {
    fn path(&self) -> &'static str {
        "/generate_stream"
    }

    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value> {
        if target.prompt_ids {
            bail!("--prompt-ids needs the completions backend");
        }
        Ok(json!({
            "inputs": spec.prompt.text(prompts),
            "parameters": {"max_new_tokens": spec.output_len, "details": true},
        }))
    }

    fn fields_of<'b>(&self, body: &'b mut Value) -> &'b mut Value {
        &mut body["parameters"]
    }

    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String> {
        let event: Event = serde_json::from_str(data).map_err(|e| e.to_string())?;
        if let Some(error) = event.error {
            return Ok(StreamEvent {
                error: Some(error),
                ..StreamEvent::default()
            });
        }
        let has_choice = event.token.is_some();
        Ok(StreamEvent {
            text: event.token.filter(|t| !t.special).map(|t| t.text),
            has_choice,
            finished: event.details.is_some_and(|d| d.finish_reason.is_some()),
            ..StreamEvent::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_events_and_the_final_details() {
        let e = Tgi
            .event(r#"{"index":1,"token":{"id":5,"text":"tok ","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#)
            .unwrap();
        assert_eq!(e.text.as_deref(), Some("tok "));
        assert!(e.has_choice && !e.finished && !e.done);
        let last = Tgi
            .event(r#"{"index":2,"token":{"id":2,"text":"</s>","logprob":0.0,"special":true},"generated_text":"tok ","details":{"finish_reason":"eos_token","generated_tokens":2,"seed":null}}"#)
            .unwrap();
        assert_eq!(last.text, None);
        assert!(last.finished);
        let error = Tgi
            .event(r#"{"error":"Input validation error","error_type":"validation"}"#)
            .unwrap();
        assert_eq!(error.error.as_deref(), Some("Input validation error"));
        assert!(Tgi.event("not json").is_err());
    }
}
