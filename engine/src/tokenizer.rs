//! Tokenizer (from `tokenizer.json` or GGUF metadata), chat templates and
//! streaming detokenisation.
//!
//! INTERFACE STUB: the bodies are filled in by the tokenizer work; signatures are the contract.

use std::path::Path;

/// One chat message as the OpenAI API carries it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct Tokenizer {}

impl Tokenizer {
    /// From a model path: an HF directory (`tokenizer.json`, `tokenizer_config.json`,
    /// `chat_template.jinja`) or a `.gguf` file (vocab, merges, template in its metadata).
    pub fn from_model_path(_path: &Path) -> anyhow::Result<Tokenizer> {
        todo!()
    }
    /// Encodes text; `add_special` adds BOS/EOS only where the model says so.
    pub fn encode(&self, _text: &str, _add_special: bool) -> anyhow::Result<Vec<u32>> {
        todo!()
    }
    pub fn decode(&self, _ids: &[u32], _skip_special: bool) -> anyhow::Result<String> {
        todo!()
    }
    pub fn vocab_size(&self) -> usize {
        todo!()
    }
    /// Token ids that end generation (EOS and e.g. `<|im_end|>`/`<|eot_id|>`).
    pub fn eos_token_ids(&self) -> &[u32] {
        todo!()
    }
    /// Renders the model's own chat template.
    pub fn apply_chat_template(
        &self,
        _messages: &[ChatMessage],
        _add_generation_prompt: bool,
    ) -> anyhow::Result<String> {
        todo!()
    }
}

/// Streaming detokeniser: feed ids one by one, get the new text, never half a UTF-8 character.
pub struct IncrementalDecoder {}

impl IncrementalDecoder {
    pub fn new(_tokenizer: std::sync::Arc<Tokenizer>, _skip_special: bool) -> IncrementalDecoder {
        todo!()
    }
    /// Returns the text that became final with this token (possibly empty).
    pub fn push(&mut self, _id: u32) -> anyhow::Result<String> {
        todo!()
    }
}
