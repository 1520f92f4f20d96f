//! `/tokenize` and `/detokenize`: a prompt, or chat messages rendered as a chat request
//! would render them, as token ids, and back.

use super::body::Body;
use super::chat::chat_messages;
use super::fields::{DetokenizeBody, TokenizeBody};
use super::{check_model, encode, ModelInfo};
use crate::server::error::ApiError;
use crate::server::formats::Conversation;
use crate::tokenizer::Tokenizer;

/// A checked `/tokenize` body.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    pub tokens: Vec<u32>,
    /// `return_token_strs`: answer each token's string too.
    pub token_strs: bool,
}

/// Validates a `/tokenize` body: `prompt` (special tokens added unless
/// `add_special_tokens: false`) or `messages` rendered by the model's chat format as a chat
/// request's are, without tools (with the
/// generation prompt unless `add_generation_prompt: false`; special tokens only with
/// `add_special_tokens: true`), as vLLM's.
pub fn tokenize_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<TokenizeRequest, ApiError> {
    let mut body = Body::parse(body)?;
    let b: TokenizeBody = body.read()?;
    body.finish()?;
    check_model(b.model, info)?;
    let token_strs = b.return_token_strs.unwrap_or(false);
    let tokens = match (b.prompt, b.messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "give `prompt` or `messages`, not both",
            ))
        }
        (Some(text), None) => {
            if b.add_generation_prompt.is_some() || b.chat_template_kwargs.is_some() {
                return Err(ApiError::invalid(
                    "prompt",
                    "`add_generation_prompt` and `chat_template_kwargs` go with `messages`",
                ));
            }
            let add_special = b.add_special_tokens.unwrap_or(true);
            tokenizer.encode(&text, add_special).map_err(|e| {
                ApiError::invalid("prompt", format!("cannot tokenize `prompt`: {e:#}"))
            })?
        }
        (None, Some(messages)) => {
            let messages = chat_messages(Some(messages))?;
            let text = info.format.render(
                Conversation {
                    messages: &messages,
                    tools: None,
                    template_kwargs: b.chat_template_kwargs.as_ref(),
                    reasoning_effort: None,
                    add_generation_prompt: b.add_generation_prompt.unwrap_or(true),
                },
                tokenizer,
            )?;
            encode(
                tokenizer,
                &text,
                "messages",
                b.add_special_tokens.unwrap_or(false),
            )?
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` or `messages` is required",
            ))
        }
    };
    Ok(TokenizeRequest { tokens, token_strs })
}

/// Validates a `/detokenize` body (`tokens`, a list of ids of the vocabulary).
pub fn detokenize_request(body: &[u8], info: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let mut body = Body::parse(body)?;
    let b: DetokenizeBody = body.read()?;
    body.finish()?;
    check_model(b.model, info)?;
    let vocab = info.limits.vocab_size();
    let tokens = b
        .tokens
        .ok_or_else(|| ApiError::invalid("tokens", "`tokens` is required"))?;
    tokens
        .into_iter()
        .map(|id| match u32::try_from(id) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => Err(ApiError::invalid(
                "tokens",
                format!("token id {id} is out of the vocabulary (size {vocab})"),
            )),
        })
        .collect()
}
