//! Answering one request from its choices' outputs: collected into one body, or streamed
//! as server-sent events, with the request's usage and timings.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{stream, Stream, StreamExt};
use tokio::sync::mpsc;

use super::protocol::{Timings, Usage};
use super::writer::ChunkWriter;
use crate::engine::FinishReason;
use crate::server::engine_loop::SeqOutput;
use crate::server::error::ApiError;
use crate::server::formats::AnswerReader;
use crate::server::request::GenerateRequest;

/// Prompt tokens (and those of them served from the prefix cache, as the first choice of
/// each prompt found them) are counted once per prompt; completion and reasoning tokens
/// over every choice, whose latest outputs `choices` are, in choice-index order.
fn request_usage(request: &GenerateRequest, choices: &[SeqOutput]) -> Usage {
    let cached = choices
        .iter()
        .step_by(request.n.max(1))
        .map(|c| c.num_cached_prompt_tokens)
        .sum();
    let reasoning = choices.iter().map(|c| c.num_reasoning_tokens).sum();
    Usage::new(
        request.prompts.iter().map(Vec::len).sum(),
        choices.iter().map(|c| c.num_output_tokens).sum(),
        cached,
    )
    .with_reasoning(request.params.split_reasoning.then_some(reasoning))
}

/// The request's timings: those of the choice that finished last (arrival to its last
/// token the longest), with that choice's prompt and token counts.
fn request_timings(request: &GenerateRequest, choices: &[SeqOutput]) -> Option<Timings> {
    let (choice, t) = choices
        .iter()
        .filter_map(|c| Some((c, c.timings?)))
        .max_by(|(_, a), (_, b)| {
            (a.queue + a.prefill + a.decode).total_cmp(&(b.queue + b.prefill + b.decode))
        })?;
    let prompt = request
        .prompts
        .get(choice.index / request.n.max(1))
        .map_or(0, Vec::len);
    Some(Timings::new(
        &t,
        prompt,
        choice.num_cached_prompt_tokens,
        choice.num_output_tokens,
    ))
}

pub fn engine_failed() -> ApiError {
    ApiError::internal(
        "Generation stopped early: the engine failed or is shutting down (see the server log).",
    )
}

pub async fn collect_response(
    writer: ChunkWriter,
    request: GenerateRequest,
    mut events: mpsc::Receiver<SeqOutput>,
) -> Response {
    let total = request.prompts.len() * request.n;
    let mut choices: Vec<SeqOutput> = (0..total)
        .map(|index| SeqOutput {
            index,
            ..SeqOutput::default()
        })
        .collect();
    let mut finished = 0;
    while finished < total {
        let Some(out) = events.recv().await else {
            return engine_failed().into_response();
        };
        let choice = &mut choices[out.index];
        choice.text.push_str(&out.text);
        choice.reasoning.push_str(&out.reasoning);
        choice.logprobs.extend(out.logprobs);
        choice.num_output_tokens = out.num_output_tokens;
        choice.num_cached_prompt_tokens = out.num_cached_prompt_tokens;
        choice.num_reasoning_tokens = out.num_reasoning_tokens;
        if out.finish.is_some() {
            choice.finish = out.finish;
            choice.timings = out.timings;
            finished += 1;
        }
    }
    let usage = request_usage(&request, &choices);
    let timings = request_timings(&request, &choices);
    writer.full_response(choices, usage, timings)
}

/// Where a stream is: role chunks sent, choices still open, tokens so far.
struct StreamState {
    writer: ChunkWriter,
    request: GenerateRequest,
    events: mpsc::Receiver<SeqOutput>,
    text_lens: Vec<usize>,
    /// Each choice's answer reader (its chat format's) (empty without either).
    readers: Vec<Box<dyn AnswerReader>>,
    /// Each choice's latest counts (its text is not kept).
    counts: Vec<SeqOutput>,
    open: usize,
    started: bool,
    done: bool,
}

impl StreamState {
    /// The next batch of SSE payloads; `None` when the stream is over.
    async fn next_payloads(&mut self) -> Option<Vec<String>> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            let lens: Vec<usize> = self
                .request
                .prompts
                .iter()
                .flat_map(|p| std::iter::repeat_n(p.len(), self.request.n))
                .collect();
            let chunks = self.writer.role_chunks(&lens);
            if !chunks.is_empty() {
                return Some(chunks);
            }
        }
        if self.open == 0 {
            self.done = true;
            let mut tail = Vec::new();
            if self.request.streaming.include_usage {
                tail.push(self.writer.usage_chunk(
                    request_usage(&self.request, &self.counts),
                    request_timings(&self.request, &self.counts),
                ));
            }
            tail.push("[DONE]".to_string());
            return Some(tail);
        }
        match self.events.recv().await {
            Some(out) => {
                let chunk = self.writer.output_chunk(
                    &out,
                    self.text_lens[out.index],
                    self.readers.get_mut(out.index),
                );
                self.text_lens[out.index] += out.text.len();
                let counts = &mut self.counts[out.index];
                counts.num_output_tokens = out.num_output_tokens;
                counts.num_cached_prompt_tokens = out.num_cached_prompt_tokens;
                counts.num_reasoning_tokens = out.num_reasoning_tokens;
                if out.finish.is_some() {
                    counts.timings = out.timings;
                    self.open -= 1;
                }
                if out.finish == Some(FinishReason::Error) {
                    let error = ApiError::internal(format!(
                        "Generation of choice {} failed; the other choices go on (see the server log).",
                        out.index
                    ));
                    return Some(vec![chunk, error.body().to_string()]);
                }
                Some(vec![chunk])
            }
            None => {
                self.done = true;
                Some(vec![
                    engine_failed().body().to_string(),
                    "[DONE]".to_string(),
                ])
            }
        }
    }
}

/// The chat stream's SSE payloads (chunks as JSON text, error bodies, `[DONE]`).
pub fn chat_payloads(
    writer: ChunkWriter,
    request: GenerateRequest,
    events: mpsc::Receiver<SeqOutput>,
) -> impl Stream<Item = String> {
    let total = request.prompts.len() * request.n;
    let readers = (0..total).filter_map(|_| writer.answer_reader()).collect();
    let state = StreamState {
        writer,
        request,
        events,
        text_lens: vec![0; total],
        readers,
        counts: vec![SeqOutput::default(); total],
        open: total,
        started: false,
        done: false,
    };
    let payloads = stream::unfold(state, |mut state| async move {
        state.next_payloads().await.map(|p| (p, state))
    });
    payloads.flat_map(stream::iter)
}

pub fn stream_response(
    writer: ChunkWriter,
    request: GenerateRequest,
    events: mpsc::Receiver<SeqOutput>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(chat_payloads(writer, request, events).map(|data| Ok(Event::default().data(data))))
}
