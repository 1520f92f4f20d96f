//! OpenAI `POST /v1/chat/completions`: the prompt as one user message, or a conversation
//! as chat messages (an answer's calls in `tool_calls`, each result a `tool` message) with
//! the tools in chat's nested `function` form.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::{one_message_body, openai, Api, Conversation, Message, StreamEvent};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::RequestSpec;
use crate::wire::target::Target;

pub(super) struct Chat;

impl Api for Chat {
    fn path(&self) -> &'static str {
        "/v1/chat/completions"
    }

    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value> {
        one_message_body(self, target, spec, prompts)
    }

    fn conversation_body(
        &self,
        target: &Target,
        spec: &RequestSpec,
        conversation: Conversation<'_>,
    ) -> Result<Value> {
        if target.prompt_ids {
            bail!("--prompt-ids needs the completions backend");
        }
        let mut body = openai::common_body(target, spec);
        body["messages"] = conversation.messages.iter().map(message).collect();
        if !conversation.tools.is_empty() {
            body["tools"] = conversation
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {"name": t.name,
                        "description": t.description, "parameters": t.parameters}})
                })
                .collect();
            body["tool_choice"] = json!(if conversation.require_call {
                "required"
            } else {
                "auto"
            });
        }
        Ok(body)
    }

    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String> {
        openai::event(data, true)
    }
}

/// One message as chat writes it.
fn message(m: &Message) -> Value {
    match m {
        Message::System(text) => json!({"role": "system", "content": text}),
        Message::User(text) => json!({"role": "user", "content": text}),
        Message::Assistant { text, calls } if calls.is_empty() => {
            json!({"role": "assistant", "content": text})
        }
        Message::Assistant { text, calls } => json!({
            "role": "assistant",
            "content": if text.is_empty() { Value::Null } else { json!(text) },
            "tool_calls": calls.iter().map(|c| json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})).collect::<Vec<_>>(),
        }),
        Message::ToolResult { call_id, output } => {
            json!({"role": "tool", "tool_call_id": call_id, "content": output})
        }
    }
}
