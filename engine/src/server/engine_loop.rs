//! The engine loop: owns the `LlmEngine` on its own OS thread.
//!
//! Requests arrive through a channel; every request gets one bounded channel for its
//! outputs. The loop never waits on a client: when a channel is full the new output is
//! merged into a pending one and sent at a later step, and when a channel is closed
//! (the client went away) the request's sequences are aborted before the next step.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::error::ApiError;
use super::metrics::{Metrics, SeqTimings};
use crate::engine::{FinishReason, LlmEngine, SeqId, SeqUpdate, TokenLogprob};
use crate::grammar::TokenMatcher;
use crate::limits::CheckedSequence;

/// Outputs buffered per request before the loop starts merging them.
pub const EVENT_CHANNEL_CAPACITY: usize = 64;
/// How often an idle loop retries delivering to a full channel.
const FLUSH_RETRY: Duration = Duration::from_millis(2);
/// `Retry-After` seconds on a 429.
const RETRY_AFTER_SECONDS: u64 = 1;

/// A message to the engine loop.
pub enum Command {
    Add(AddRequest),
    /// Abort whatever is left and end the loop.
    Shutdown,
}

/// One HTTP request: its sequences in choice-index order.
pub struct AddRequest {
    /// Each choice's checked request and grammar matcher (structured output).
    pub seqs: Vec<(CheckedSequence, Option<TokenMatcher>)>,
    pub events: mpsc::Sender<SeqOutput>,
    /// `Ok` once queued; 429 when too many sequences are waiting.
    pub admitted: oneshot::Sender<Result<(), ApiError>>,
    pub arrival: Instant,
}

/// New output of one choice; several steps are merged when the client reads slowly.
#[derive(Debug, Clone, Default)]
pub struct SeqOutput {
    pub index: usize,
    /// Answer text.
    pub text: String,
    /// Reasoning text (a server with `--reasoning-parser`, chat requests).
    pub reasoning: String,
    pub logprobs: Vec<TokenLogprob>,
    /// Tokens sampled since the previous output of this choice.
    pub new_tokens: usize,
    pub finish: Option<FinishReason>,
    pub num_prompt_tokens: usize,
    pub num_output_tokens: usize,
    pub num_cached_prompt_tokens: usize,
    pub num_reasoning_tokens: usize,
    /// The sequence's timings, on its finishing output (stop or length).
    pub timings: Option<SeqTimings>,
}

impl SeqOutput {
    fn merge(&mut self, update: &SeqUpdate) {
        self.text.push_str(&update.text);
        self.reasoning.push_str(&update.reasoning_text);
        self.num_cached_prompt_tokens = update.num_cached_prompt_tokens;
        self.num_reasoning_tokens = update.num_reasoning_tokens;
        self.logprobs.extend(update.logprob.clone());
        self.new_tokens += usize::from(update.token.is_some());
        self.finish = update.finish;
        self.num_prompt_tokens = update.num_prompt_tokens;
        self.num_output_tokens = update.num_output_tokens;
    }
}

/// What the choices of one HTTP request share: where their outputs go and when it arrived.
struct RequestChannel {
    events: mpsc::Sender<SeqOutput>,
    arrival: Instant,
}

/// One live choice: its request's channel, its index among the request's choices, what it
/// has not delivered yet, and its timestamps. The slot is dropped once the choice has
/// finished and its last output is delivered, or when its client is gone.
struct SeqSlot {
    request: Arc<RequestChannel>,
    index: usize,
    pending: Option<SeqOutput>,
    finished: bool,
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

/// The loop's state; `run` consumes it.
pub struct EngineLoop {
    engine: LlmEngine,
    commands: Receiver<Command>,
    metrics: Arc<Metrics>,
    max_waiting: usize,
    /// Every choice the loop still owes output, by its sequence (ids rise with admission,
    /// so a request's choices are sent in index order, as they were queued).
    slots: BTreeMap<SeqId, SeqSlot>,
}

impl EngineLoop {
    pub fn new(
        engine: LlmEngine,
        commands: Receiver<Command>,
        metrics: Arc<Metrics>,
        max_waiting: usize,
    ) -> EngineLoop {
        EngineLoop {
            engine,
            commands,
            metrics,
            max_waiting,
            slots: BTreeMap::new(),
        }
    }

    /// Runs until `Command::Shutdown` or until every command sender is gone.
    pub fn run(mut self) {
        self.metrics.set_stats(self.engine.stats());
        while self.receive() {
            self.reap_disconnected();
            if self.engine.has_unfinished() {
                let step_start = Instant::now();
                let metrics = &self.metrics;
                match self.engine.step_observed(|stats| metrics.set_stats(stats)) {
                    Ok(updates) => {
                        if let Some(step) = self.engine.last_step() {
                            self.metrics.record_step(step);
                        }
                        self.dispatch(&updates, step_start)
                    }
                    Err(e) => self.fail_all(&e),
                }
            }
            self.flush();
            // A busy engine's next step sets the gauges once it is scheduled; an idle one
            // shows its last requests gone here.
            if !self.engine.has_unfinished() {
                self.metrics.set_stats(self.engine.stats());
            }
        }
        self.abort_all();
        self.metrics.set_stats(self.engine.stats());
    }

    /// Takes new commands: blocks only when there is nothing else to do.
    fn receive(&mut self) -> bool {
        if !self.engine.has_unfinished() {
            let command = if self.has_pending() {
                match self.commands.recv_timeout(FLUSH_RETRY) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match self.commands.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return false,
                }
            };
            if let Some(c) = command {
                if !self.handle(c) {
                    return false;
                }
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(c) => {
                    if !self.handle(c) {
                        return false;
                    }
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => {
                    return self.engine.has_unfinished() || self.has_pending()
                }
            }
        }
    }

    fn has_pending(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Returns false on shutdown.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Shutdown => false,
            Command::Add(request) => {
                self.admit(request);
                true
            }
        }
    }

    fn admit(&mut self, request: AddRequest) {
        if request.seqs.len() > self.max_waiting {
            // Retrying could never succeed, so this is the client's error, not overload.
            let _ = request.admitted.send(Err(ApiError::invalid(
                "n",
                format!(
                    "the request needs {} sequences (prompts × n) but the server queues at most {} (--max-waiting-requests)",
                    request.seqs.len(),
                    self.max_waiting
                ),
            )));
            return;
        }
        let waiting = self.engine.stats().num_waiting;
        if waiting + request.seqs.len() > self.max_waiting {
            let _ = request
                .admitted
                .send(Err(ApiError::overloaded(waiting, RETRY_AFTER_SECONDS)));
            return;
        }
        let mut ids = Vec::with_capacity(request.seqs.len());
        for (checked, grammar) in request.seqs {
            match self.engine.add_checked(checked, grammar) {
                Ok(id) => ids.push(id),
                // Requests are checked against this engine's limits before they are sent.
                Err(e) => {
                    for &id in &ids {
                        self.engine.abort(id);
                    }
                    let _ = request
                        .admitted
                        .send(Err(ApiError::internal(format!("{e}"))));
                    return;
                }
            }
        }
        if request.admitted.send(Ok(())).is_err() {
            for &id in &ids {
                self.engine.abort(id);
            }
            return;
        }
        let channel = Arc::new(RequestChannel {
            events: request.events,
            arrival: request.arrival,
        });
        for (index, id) in ids.into_iter().enumerate() {
            let slot = SeqSlot {
                request: channel.clone(),
                index,
                pending: None,
                finished: false,
                scheduled: None,
                first_token: None,
                last_token: None,
            };
            self.slots.insert(id, slot);
        }
    }

    /// Drops the slots of every request whose client is gone, aborting their sequences.
    fn reap_disconnected(&mut self) {
        let gone: Vec<SeqId> = self
            .slots
            .iter()
            .filter(|(_, slot)| slot.request.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.drop_slot(id);
        }
    }

    /// Drops a slot; a sequence still running is aborted.
    fn drop_slot(&mut self, id: SeqId) {
        let Some(slot) = self.slots.remove(&id) else {
            return;
        };
        if !slot.finished {
            self.engine.abort(id);
            self.metrics.record_finished(FinishReason::Abort, None);
        }
    }

    fn abort_all(&mut self) {
        let ids: Vec<SeqId> = self.slots.keys().copied().collect();
        for id in ids {
            self.drop_slot(id);
        }
    }

    /// A failed step ends every request (their channels close without a finish).
    fn fail_all(&mut self, error: &anyhow::Error) {
        tracing::error!(
            "engine step failed, aborting {} sequences: {error:#}",
            self.slots.len()
        );
        self.abort_all();
    }

    fn dispatch(&mut self, updates: &[SeqUpdate], step_start: Instant) {
        let now = Instant::now();
        for update in updates {
            let Some(slot) = self.slots.get_mut(&update.id) else {
                continue;
            };
            slot.scheduled.get_or_insert(step_start);
            if update.token.is_some() {
                slot.first_token.get_or_insert(now);
                slot.last_token = Some(now);
            }
            let index = slot.index;
            slot.pending
                .get_or_insert_with(|| SeqOutput {
                    index,
                    ..SeqOutput::default()
                })
                .merge(update);
            if let Some(reason) = update.finish {
                slot.finished = true;
                let timings = matches!(reason, FinishReason::Stop | FinishReason::Length)
                    .then(|| seq_timings(slot, now, update.num_output_tokens));
                if let Some(output) = slot.pending.as_mut() {
                    output.timings = timings;
                }
                self.metrics.record_finished(reason, timings);
            }
        }
    }

    /// Sends pending outputs without waiting; drops the slots that are fully delivered,
    /// and those whose client is gone.
    fn flush(&mut self) {
        let mut delivered = Vec::new();
        for (&id, slot) in &mut self.slots {
            if let Some(output) = slot.pending.take() {
                let empty = output.new_tokens == 0
                    && output.text.is_empty()
                    && output.reasoning.is_empty()
                    && output.finish.is_none();
                if !empty {
                    if let Err(mpsc::error::TrySendError::Full(output)) =
                        slot.request.events.try_send(output)
                    {
                        slot.pending = Some(output);
                    }
                }
            }
            if slot.finished && slot.pending.is_none() {
                delivered.push(id);
            }
        }
        for id in delivered {
            self.slots.remove(&id);
        }
        // A send that found the channel closed: that request's slots go.
        self.reap_disconnected();
    }
}

fn seq_timings(slot: &SeqSlot, now: Instant, num_output_tokens: usize) -> SeqTimings {
    let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
    let first = slot.first_token.unwrap_or(now);
    let last = slot.last_token.unwrap_or(now);
    let scheduled = slot.scheduled.unwrap_or(now);
    let arrival = slot.request.arrival;
    SeqTimings {
        queue: secs(arrival, scheduled),
        ttft: secs(arrival, first),
        e2e: secs(arrival, now),
        tpot: (num_output_tokens > 1).then(|| secs(first, last) / (num_output_tokens - 1) as f64),
        prefill: secs(scheduled, first),
        decode: secs(first, last),
        inference: secs(scheduled, last),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(
        token: Option<u32>,
        text: &str,
        finish: Option<FinishReason>,
        outputs: usize,
    ) -> SeqUpdate {
        SeqUpdate {
            id: 1,
            token,
            text: text.to_string(),
            reasoning_text: String::new(),
            logprob: token.map(|t| TokenLogprob {
                token: t,
                logprob: -0.5,
                top: Vec::new(),
            }),
            finish,
            num_prompt_tokens: 3,
            num_output_tokens: outputs,
            num_cached_prompt_tokens: 0,
            num_reasoning_tokens: 0,
        }
    }

    #[test]
    fn merged_outputs_keep_every_token_and_the_finish() {
        let mut out = SeqOutput::default();
        out.merge(&update(None, "", None, 0));
        out.merge(&update(Some(7), "ab", None, 1));
        out.merge(&update(Some(8), "", None, 2));
        out.merge(&update(Some(9), "c", Some(FinishReason::Length), 3));
        assert_eq!(out.text, "abc");
        assert_eq!(out.new_tokens, 3);
        assert_eq!(
            out.logprobs.iter().map(|l| l.token).collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
        assert_eq!(
            (out.finish, out.num_output_tokens, out.num_prompt_tokens),
            (Some(FinishReason::Length), 3, 3)
        );
    }

    /// A runner that fails its first `fail_steps` whole steps, then samples token 300.
    struct FlakyRunner {
        fail_steps: usize,
    }

    impl crate::model::ModelRunner for FlakyRunner {
        fn forward(
            &mut self,
            batch: &[crate::model::SeqInput<'_>],
        ) -> anyhow::Result<Vec<crate::backend::RowSample>> {
            if self.fail_steps > 0 {
                self.fail_steps -= 1;
                anyhow::bail!("injected device failure");
            }
            Ok(batch
                .iter()
                .filter(|s| s.sample.is_some())
                .map(|_| {
                    Ok(crate::sampler::Sampled {
                        token: 300,
                        logprobs: None,
                    })
                })
                .collect())
        }

        fn logits(&mut self, _: &[crate::model::SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
            anyhow::bail!("no logits")
        }

        fn profile(&self) -> crate::model::StepProfile {
            crate::model::StepProfile::default()
        }

        fn vocab_size(&self) -> usize {
            1000
        }

        fn num_blocks(&self) -> usize {
            64
        }

        fn block_size(&self) -> usize {
            16
        }

        fn kv_layer_groups(&self) -> crate::layer_groups::LayerGroups {
            crate::layer_groups::LayerGroups::full(1)
        }

        fn footprint(&self) -> crate::model::Footprint {
            crate::model::Footprint::default()
        }
    }

    /// Queues a 3-token greedy request checked against the loop's engine's `limits`; its
    /// outputs.
    fn add(
        commands: &std::sync::mpsc::Sender<Command>,
        limits: &crate::limits::RequestLimits,
    ) -> mpsc::Receiver<SeqOutput> {
        let params = crate::sampler::SamplingParams {
            max_tokens: 3,
            temperature: 0.0,
            ignore_eos: true,
            ..crate::sampler::SamplingParams::default()
        };
        let checked = limits.check(vec![5, 6, 7], params).unwrap();
        let (events, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let (admitted, admitted_rx) = oneshot::channel();
        commands
            .send(Command::Add(AddRequest {
                seqs: vec![(checked, None)],
                events,
                admitted,
                arrival: Instant::now(),
            }))
            .unwrap();
        admitted_rx.blocking_recv().unwrap().unwrap();
        rx
    }

    /// An engine loop on its own thread over the tiny model's tokenizer and a runner whose
    /// first `fail_steps` steps fail; its command channel, thread, metrics and the engine's
    /// limits.
    fn start_loop(
        fail_steps: usize,
    ) -> (
        std::sync::mpsc::Sender<Command>,
        std::thread::JoinHandle<()>,
        Arc<Metrics>,
        crate::limits::RequestLimits,
    ) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/llama-tiny");
        let tokenizer = Arc::new(crate::tokenizer::Tokenizer::from_model_path(&dir).unwrap());
        let engine = LlmEngine::new(
            Box::new(FlakyRunner { fail_steps }),
            tokenizer,
            crate::engine::EngineConfig::default(),
        );
        let limits = engine.limits();
        let metrics = Arc::new(Metrics::new("m"));
        let (commands, commands_rx) = std::sync::mpsc::channel();
        let looping = EngineLoop::new(engine, commands_rx, metrics.clone(), 8);
        let thread = std::thread::spawn(move || looping.run());
        (commands, thread, metrics, limits)
    }

    /// A step that fails as a whole ends the requests it was running (their channels close
    /// without a finish, which the handlers turn into a 500), and the loop serves the next one.
    #[test]
    fn a_failed_step_ends_its_requests_and_the_loop_serves_the_next() {
        let (commands, thread, metrics, limits) = start_loop(1);

        let mut first = add(&commands, &limits);
        let mut finishes = Vec::new();
        while let Some(out) = first.blocking_recv() {
            finishes.extend(out.finish);
        }
        assert!(
            finishes.is_empty(),
            "the failed request got no finish: {finishes:?}"
        );

        let mut second = add(&commands, &limits);
        let mut last = None;
        while let Some(out) = second.blocking_recv() {
            if out.finish.is_some() {
                last = Some(out);
            }
        }
        let last = last.expect("the next request is served");
        assert_eq!(
            (last.finish, last.num_output_tokens),
            (Some(FinishReason::Length), 3)
        );
        commands.send(Command::Shutdown).unwrap();
        thread.join().unwrap();
        let text = metrics.render();
        assert!(text.contains("finished_reason=\"abort\"} 1"), "{text}");
        assert!(
            text.contains("vllm:num_requests_running{model_name=\"m\"} 0"),
            "{text}"
        );
    }
}
