//! The limits a sequence must meet to be queued: the vocabulary, the context and the KV
//! cache, fixed when the engine is built. [`RequestLimits::check`] is the one place that
//! checks them, and its [`CheckedSequence`] is what the engine takes (the server checks
//! before it queues, so a bad request is a 400 even when the queue is full). "Admission"
//! is the scheduler's word for moving a waiting sequence into the batch; this is not that.

use crate::sampler::{InvalidParam, SamplingParams};

/// Why a sequence was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    #[error("prompt is empty")]
    EmptyPrompt,
    /// A prompt id (`param` is `prompt`) or stop id (`stop_token_ids`) past the vocabulary.
    #[error("token id {id} is out of vocabulary (size {vocab})")]
    OutOfVocabulary {
        param: &'static str,
        id: u32,
        vocab: usize,
    },
    #[error("prompt ({prompt} tokens) leaves no room for an answer in max_model_len ({limit})")]
    PromptTooLong { prompt: usize, limit: usize },
    #[error(
        "prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds max_model_len ({limit})"
    )]
    ContextLength {
        prompt: usize,
        max_tokens: usize,
        limit: usize,
    },
    #[error("prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds the {capacity} tokens the KV cache holds for one sequence")]
    KvCapacity {
        prompt: usize,
        max_tokens: usize,
        capacity: usize,
    },
    #[error(transparent)]
    Param(#[from] InvalidParam),
    /// A sequence checked against another engine's limits.
    #[error("the sequence was checked against other limits than this engine's")]
    OtherLimits,
}

/// An engine's limits (or a test's pretend engine's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    vocab_size: usize,
    max_model_len: usize,
    /// The longest sequence the KV cache holds alone; `None`: any (no layer keeps every
    /// token).
    kv_max_tokens: Option<usize>,
}

/// One sequence (a prompt and how to sample it) that met an engine's limits: only
/// [`RequestLimits::check`] makes one.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedSequence {
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    /// The limits it met (the engine takes only a sequence checked against its own).
    limits: RequestLimits,
}

impl CheckedSequence {
    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The prompt, its parameters and the limits they met, for the engine that queues it.
    pub(crate) fn into_parts(self) -> (Vec<u32>, SamplingParams, RequestLimits) {
        (self.prompt_ids, self.params, self.limits)
    }
}

impl RequestLimits {
    /// The limits of an engine (or of a test's pretend one): its vocabulary, context and KV
    /// cache. Outside this crate only an engine makes them.
    pub(crate) fn new(
        vocab_size: usize,
        max_model_len: usize,
        kv_max_tokens: Option<usize>,
    ) -> RequestLimits {
        RequestLimits {
            vocab_size,
            max_model_len,
            kv_max_tokens,
        }
    }

    /// Ids a prompt may hold: those both the model's embedding table and the tokenizer know.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The longest sequence (prompt + answer).
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Checks, in order: an empty prompt, prompt ids past the vocabulary, a prompt with no
    /// room in `max_model_len`, the sampling parameters' ranges, stop ids and `top_k` past
    /// the vocabulary, prompt + `max_tokens` beyond `max_model_len`, then beyond the KV cache.
    pub fn check(
        &self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
    ) -> Result<CheckedSequence, LimitError> {
        if prompt_ids.is_empty() {
            return Err(LimitError::EmptyPrompt);
        }
        let vocab = self.vocab_size;
        let out_of_vocabulary = |param, ids: &[u32]| {
            ids.iter()
                .find(|&&id| id as usize >= vocab)
                .map(|&id| LimitError::OutOfVocabulary { param, id, vocab })
        };
        if let Some(e) = out_of_vocabulary("prompt", &prompt_ids) {
            return Err(e);
        }
        let (prompt, limit) = (prompt_ids.len(), self.max_model_len);
        if prompt >= limit {
            return Err(LimitError::PromptTooLong { prompt, limit });
        }
        params.validate()?;
        if let Some(e) = out_of_vocabulary("stop_token_ids", &params.stop_token_ids) {
            return Err(e);
        }
        if params.top_k > vocab {
            return Err(LimitError::Param(InvalidParam {
                param: "top_k",
                message: format!(
                    "`top_k` must be at most the vocabulary size ({vocab}), got {}",
                    params.top_k
                ),
            }));
        }
        let max_tokens = params.max_tokens;
        let total = match prompt.checked_add(max_tokens) {
            Some(total) if total <= limit => total,
            _ => {
                return Err(LimitError::ContextLength {
                    prompt,
                    max_tokens,
                    limit,
                })
            }
        };
        if let Some(capacity) = self.kv_max_tokens.filter(|&c| total > c) {
            return Err(LimitError::KvCapacity {
                prompt,
                max_tokens,
                capacity,
            });
        }
        Ok(CheckedSequence {
            prompt_ids,
            params,
            limits: *self,
        })
    }
}

impl LimitError {
    /// The request field at fault, by its engine name: `prompt`, or a `SamplingParams` field.
    pub fn param(&self) -> &'static str {
        match self {
            LimitError::OutOfVocabulary { param, .. } => param,
            LimitError::ContextLength { .. } => "max_tokens",
            LimitError::Param(e) => e.param,
            LimitError::EmptyPrompt
            | LimitError::PromptTooLong { .. }
            | LimitError::KvCapacity { .. }
            | LimitError::OtherLimits => "prompt",
        }
    }

    /// The prompt and the answer do not fit the model's context (OpenAI's
    /// `context_length_exceeded`).
    pub fn exceeds_context(&self) -> bool {
        matches!(
            self,
            LimitError::PromptTooLong { .. } | LimitError::ContextLength { .. }
        )
    }
}
