//! OpenAI `POST /v1/completions`: the prompt as text, or as token ids with `--prompt-ids`.

use anyhow::Result;
use serde_json::{json, Value};

use super::{openai, Api, StreamEvent};
use crate::load::workload::prompt::PromptBuilder;
use crate::load::workload::{PromptSource, RequestSpec};
use crate::wire::target::Target;

pub(super) struct Completions;

impl Api for Completions {
    fn path(&self) -> &'static str {
        "/v1/completions"
    }

    fn body(&self, target: &Target, spec: &RequestSpec, prompts: &PromptBuilder) -> Result<Value> {
        let mut body = openai::common_body(target, spec);
        body["prompt"] = match &spec.prompt {
            PromptSource::Blocks(blocks) if target.prompt_ids => json!(prompts.ids(blocks)),
            source => json!(source.text(prompts)),
        };
        Ok(body)
    }

    fn event<'a>(&self, data: &'a str) -> Result<StreamEvent<'a>, String> {
        openai::event(data, false)
    }
}
