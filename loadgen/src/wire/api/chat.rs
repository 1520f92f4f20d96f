//! OpenAI `POST /v1/chat/completions`: the prompt as one user message.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::{openai, prompt_text, Api, StreamEvent};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::RequestSpec;
use crate::wire::target::Target;

pub(super) struct Chat;

impl Api for Chat {
    fn path(&self) -> &'static str {
        "/v1/chat/completions"
    }

    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value> {
        if target.prompt_ids {
            bail!("--prompt-ids needs the completions backend");
        }
        let mut body = openai::common_body(target, spec);
        body["messages"] = json!([{"role": "user", "content": prompt_text(&spec.prompt, prompts)}]);
        Ok(body)
    }

    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String> {
        openai::event(data, true)
    }
}
