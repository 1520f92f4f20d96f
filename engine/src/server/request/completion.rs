//! `/v1/completions`: prompts as text or token ids.

use serde_json::Value;

use super::constraints::request_constraint;
use super::fields::CompletionFields;
use super::sampling::{check_unsupported_values, sampling_params};
use super::{
    check_model, choices, count, encode, read_generation_body, read_streaming, room_after,
    GenerateRequest, ModelInfo, RequestFields,
};
use crate::server::error::ApiError;
use crate::tokenizer::Tokenizer;

/// Most prompts in one completions request.
const MAX_PROMPTS: usize = 1024;
/// A completion's `max_tokens` when absent (OpenAI's default).
const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// Validates a `/v1/completions` body.
pub fn completion_request(
    body: &[u8],
    info: &ModelInfo,
    tokenizer: &Tokenizer,
) -> Result<GenerateRequest, ApiError> {
    let (shared, own, constraint_fields) = read_generation_body::<CompletionFields>(body)?;
    check_unsupported_values(&shared)?;
    let model = check_model(shared.model.clone(), info)?;
    if own.echo == Some(true) {
        return Err(ApiError::invalid("echo", "`echo: true` is not supported"));
    }
    if own.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    let mut params = sampling_params(&shared)?;
    params.logprobs = own.logprobs.map(|k| count(Some(k)));
    let streaming = read_streaming(shared.stream, shared.stream_options.as_ref())?;
    let n = choices(shared.n)?;
    let prompts = completion_prompts(own.prompt.as_ref(), tokenizer)?;
    params.max_tokens = match shared.max_tokens {
        Some(n) => count(Some(n)),
        None => DEFAULT_COMPLETION_TOKENS.min(room_after(&prompts, info)),
    };
    Ok(GenerateRequest {
        model,
        prompts,
        params,
        n,
        streaming,
        constraint: request_constraint(&constraint_fields)?,
        reading: None,
        fields: RequestFields::COMPLETION,
    })
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
fn completion_prompts(
    prompt: Option<&Value>,
    tokenizer: &Tokenizer,
) -> Result<Vec<Vec<u32>>, ApiError> {
    const EXPECTED: &str =
        "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let prompts = match prompt {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(text)) => vec![encode(tokenizer, text, "prompt", true)?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("prompt", "`prompt` must not be empty"))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|v| match v {
                    Value::String(text) => encode(tokenizer, text, "prompt", true),
                    _ => Err(ApiError::wrong_type("prompt", EXPECTED)),
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![token_ids(items, "prompt")?],
            Value::Array(_) => items
                .iter()
                .map(|v| match v {
                    Value::Array(ids) => token_ids(ids, "prompt"),
                    _ => Err(ApiError::wrong_type("prompt", EXPECTED)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(ApiError::wrong_type("prompt", EXPECTED)),
        },
        Some(_) => return Err(ApiError::wrong_type("prompt", EXPECTED)),
    };
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    Ok(prompts)
}

/// A non-empty list of token ids (the engine checks them against the vocabulary).
fn token_ids(items: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be empty"),
        ));
    }
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::wrong_type(param, "a list of non-negative integer token ids")
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_must_be_a_non_empty_list_of_non_negative_integers() {
        let ids = [serde_json::json!(3), serde_json::json!(10)];
        assert_eq!(token_ids(&ids, "prompt").unwrap(), vec![3, 10]);
        assert!(token_ids(&[], "prompt").is_err());
        let e = token_ids(&[serde_json::json!(-1)], "prompt").unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("prompt"), Some("invalid_type"))
        );
    }
}
