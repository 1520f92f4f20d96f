//! The engine loop: schedule → one forward → sample → update sequences, detokenise,
//! check stop conditions, and release the blocks of finished sequences at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context};
use rayon::prelude::*;

use crate::backend::RowSample;
pub use crate::generation::FinishReason;
use crate::generation::Generation;
use crate::grammar::TokenMatcher;
use crate::kv_cache::BlockManager;
use crate::limits::{CheckedSequence, LimitError, RequestLimits};
use crate::model::{ModelRunner, SeqInput};
use crate::reasoning::ThinkMarkers;
use crate::sampler::{Sampled, SamplingParams};
use crate::scheduler::{ScheduledChunk, Scheduler, SchedulerConfig};
pub use crate::sequence::SeqId;
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Per-step token budget (decodes + prefill chunks).
    pub max_num_batched_tokens: usize,
    /// Context limit (prompt + output).
    pub max_model_len: usize,
    pub enable_prefix_caching: bool,
    /// A model with recurrent layers checkpoints its state for the prefix cache every this
    /// many blocks, beside each prompt's last block boundary (0: there only).
    pub state_checkpoint_every: usize,
}

/// `--state-checkpoint-every`'s default, in blocks.
pub const DEFAULT_STATE_CHECKPOINT_EVERY: usize = 0;

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 2048,
            enable_prefix_caching: true,
            state_checkpoint_every: DEFAULT_STATE_CHECKPOINT_EVERY,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What one step produced for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqUpdate {
    pub id: SeqId,
    /// The sampled token (None for a prefill chunk that sampled nothing).
    pub token: Option<u32>,
    /// New detokenised answer text that is final (stop strings already cut); may be empty.
    pub text: String,
    /// New reasoning text (with `split_reasoning`); may be empty.
    pub reasoning_text: String,
    pub logprob: Option<TokenLogprob>,
    /// Some(..) on the last update of the sequence.
    pub finish: Option<FinishReason>,
    pub num_prompt_tokens: usize,
    /// After this update.
    pub num_output_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_prompt_tokens: usize,
    /// Of the output tokens, those spent reasoning (markers included).
    pub num_reasoning_tokens: usize,
}

impl SeqUpdate {
    /// `seq`'s counts with no token and no text: a prefill chunk's update, the base of a
    /// sampled token's, or (with `finish`) a failed sequence's last.
    fn counts(
        id: SeqId,
        seq: Option<&Sequence>,
        num_reasoning_tokens: usize,
        finish: Option<FinishReason>,
    ) -> SeqUpdate {
        let (num_prompt_tokens, num_output_tokens, num_cached_prompt_tokens) =
            seq.map_or((0, 0, 0), |s| {
                (
                    s.num_prompt_tokens,
                    s.num_output_tokens(),
                    s.num_cached_prompt_tokens,
                )
            });
        SeqUpdate {
            id,
            token: None,
            text: String::new(),
            reasoning_text: String::new(),
            logprob: None,
            finish,
            num_prompt_tokens,
            num_output_tokens,
            num_cached_prompt_tokens,
            num_reasoning_tokens,
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    /// In tokens (as vLLM counts), first admissions only.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Tokens of re-admissions after preemption, and those served by the cache.
    pub prefix_cache_preempted_queries: u64,
    pub prefix_cache_preempted_hits: u64,
    /// Blocks the prefix cache holds for checkpoints of recurrent state.
    pub state_checkpoint_blocks: usize,
    /// Checkpoints of recurrent state taken.
    pub state_checkpoints_total: u64,
    pub num_preemptions: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
}

/// What one step computed: decode tokens only, prefill chunks beside decodes, or prefill
/// chunks only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    DecodeOnly,
    Mixed,
    PrefillOnly,
}

impl StepKind {
    pub const ALL: [StepKind; 3] = [StepKind::DecodeOnly, StepKind::Mixed, StepKind::PrefillOnly];

    pub fn name(self) -> &'static str {
        match self {
            StepKind::DecodeOnly => "decode-only",
            StepKind::Mixed => "mixed",
            StepKind::PrefillOnly => "prefill-only",
        }
    }
}

/// The last step's kind, the tokens it computed (prefill chunks' and decodes') and its
/// seconds, for the server's step telemetry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    pub kind: StepKind,
    pub tokens: u64,
    pub secs: f64,
}

/// Step-level timing for offline benchmarks: steps with any prefill work versus
/// decode-only steps, and where the decode steps' time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimings {
    pub prefill_steps: u64,
    pub prefill_secs: f64,
    /// Tokens computed by prefill chunks (prompt, or prompt + output when re-prefilling).
    pub prefill_tokens: u64,
    /// Of `prefill_secs`, the mixture-of-experts FFNs' ([`crate::model::StepProfile::experts_secs`]).
    pub prefill_experts_secs: f64,
    /// Of `prefill_secs`, the Gated DeltaNet layers' ([`crate::model::StepProfile::delta_net_secs`]).
    pub prefill_delta_net_secs: f64,
    pub decode_steps: u64,
    pub decode_secs: f64,
    /// Tokens sampled in decode-only steps.
    pub decode_tokens: u64,
    /// Grammar masks computed (structured output), over all steps.
    pub grammar_masks: u64,
    /// Seconds spent computing them, summed over the threads that computed them.
    pub grammar_mask_secs: f64,
    /// Seconds spent advancing grammars past sampled tokens (on the engine thread).
    pub grammar_accept_secs: f64,
    /// Decode steps, summed: where their time went.
    pub decode: StepBreakdown,
}

/// Seconds of a set of steps by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepBreakdown {
    /// Host: the scheduler's decision and the batch's inputs (block tables, sampling specs).
    pub schedule_secs: f64,
    /// Host: the runner's input checks, metadata build and upload.
    pub prepare_secs: f64,
    /// Device: the forward pass (GPU time from events on CUDA).
    pub forward_secs: f64,
    /// Of `forward_secs`, the mixture-of-experts FFNs ([`crate::model::StepProfile::experts_secs`]).
    pub experts_secs: f64,
    /// Of `forward_secs`, the Gated DeltaNet layers ([`crate::model::StepProfile::delta_net_secs`]).
    pub delta_net_secs: f64,
    /// Device: penalties, sampling and logprobs (GPU time from events on CUDA).
    pub sample_secs: f64,
    /// The runner's whole call as the host saw it.
    pub runner_wall_secs: f64,
    /// Host: appending tokens, detokenising, stop checks, freeing finished sequences.
    pub update_secs: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerationOutput {
    pub token_ids: Vec<u32>,
    /// Each generated token's log-probability, when the parameters ask for logprobs.
    pub logprobs: Vec<f32>,
    pub text: String,
    pub finish: FinishReason,
    pub num_cached_prompt_tokens: usize,
}

/// Whether prompts reuse the blocks of earlier ones with the same prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixCaching {
    On,
    /// Turned off (`--no-enable-prefix-caching`).
    Off,
}

impl PrefixCaching {
    /// As `/version` reports it.
    pub fn describe(self) -> serde_json::Value {
        match self {
            PrefixCaching::On => serde_json::json!({"enabled": true}),
            PrefixCaching::Off => {
                serde_json::json!({"enabled": false, "reason": "--no-enable-prefix-caching"})
            }
        }
    }
}

pub struct LlmEngine {
    runner: Box<dyn ModelRunner>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    prefix_caching: PrefixCaching,
    /// The sequences, each with its generation.
    scheduler: Scheduler<Generation>,
    limits: RequestLimits,
    /// The model's think markers, when the server splits reasoning (`--reasoning-parser`).
    think_markers: Option<ThinkMarkers>,
    next_id: SeqId,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
    timings: StepTimings,
    /// The step [`LlmEngine::step_observed`] last ran.
    last_step: Option<StepRecord>,
}

impl LlmEngine {
    pub fn new(
        runner: Box<dyn ModelRunner>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> LlmEngine {
        let pool = runner.kv_pool();
        let prefix_caching = if config.enable_prefix_caching {
            PrefixCaching::On
        } else {
            PrefixCaching::Off
        };
        let block_manager = BlockManager::new(
            pool.num_blocks,
            pool.block_size,
            pool.groups.clone(),
            config.enable_prefix_caching,
        )
        .with_state_checkpoints(config.state_checkpoint_every);
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: config.max_num_seqs,
                max_num_batched_tokens: config.max_num_batched_tokens,
            },
            block_manager,
        );
        let limits = RequestLimits::new(
            tokenizer.vocab_size().min(runner.vocab_size()),
            config.max_model_len,
            pool.max_tokens_alone(),
        );
        LlmEngine {
            runner,
            tokenizer,
            config,
            prefix_caching,
            scheduler,
            limits,
            think_markers: None,
            next_id: 0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            timings: StepTimings::default(),
            last_step: None,
        }
    }

    /// Splits the output of sequences with `split_reasoning` at these markers.
    pub fn set_think_markers(&mut self, markers: ThinkMarkers) {
        self.think_markers = Some(markers);
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Whether prompts reuse cached blocks, and if not why.
    pub fn prefix_caching(&self) -> PrefixCaching {
        self.prefix_caching
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Ids a prompt may hold: those both the model's embedding table and the tokenizer know.
    pub fn vocab_size(&self) -> usize {
        self.limits.vocab_size()
    }

    /// The limits every sequence must meet, for a caller that checks them before handing
    /// sequences over (the server, before it queues them).
    pub fn limits(&self) -> RequestLimits {
        self.limits
    }

    /// Checks a prompt and its parameters against [`limits`](Self::limits) and queues them.
    pub fn add_request(
        &mut self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
    ) -> Result<SeqId, LimitError> {
        let checked = self.limits.check(prompt_ids, params)?;
        self.add_checked(checked, None)
    }

    /// Queues a sequence checked against this engine's [`limits`](Self::limits) (one checked
    /// against other limits is refused); with `grammar` (structured output) every sampled
    /// answer token is drawn from the grammar's mask, and the sequence stops as soon as the
    /// grammar is complete.
    pub fn add_checked(
        &mut self,
        sequence: CheckedSequence,
        grammar: Option<TokenMatcher>,
    ) -> Result<SeqId, LimitError> {
        let (prompt_ids, params, limits) = sequence.into_parts();
        if limits != self.limits {
            return Err(LimitError::OtherLimits);
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut seq = Sequence::new(id, id, prompt_ids);
        seq.history_tokens = params.history_tokens;
        let generation = Generation::new(
            &seq.token_ids,
            params,
            grammar,
            self.tokenizer.clone(),
            self.think_markers,
        );
        self.scheduler.add(seq, generation);
        Ok(id)
    }

    /// Removes a waiting or running sequence and frees its blocks at once; returns false
    /// if unknown or finished.
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.scheduler.remove(id).is_some()
    }

    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    pub fn stats(&self) -> EngineStats {
        let bm = self.scheduler.block_manager();
        let cache = bm.prefix_cache_stats();
        EngineStats {
            num_running: self.scheduler.num_running(),
            num_waiting: self.scheduler.num_waiting(),
            kv_blocks_total: bm.num_blocks(),
            kv_blocks_used: bm.num_used_blocks(),
            prefix_cache_queries: cache.queries,
            prefix_cache_hits: cache.hits,
            prefix_cache_preempted_queries: cache.preempted_queries,
            prefix_cache_preempted_hits: cache.preempted_hits,
            state_checkpoint_blocks: bm.num_checkpoint_blocks(),
            state_checkpoints_total: cache.checkpoints_saved,
            num_preemptions: self.scheduler.num_preemptions(),
            prompt_tokens_total: self.prompt_tokens_total,
            generation_tokens_total: self.generation_tokens_total,
        }
    }

    /// Accumulated step timings since creation or the last `reset_timings`.
    pub fn timings(&self) -> StepTimings {
        self.timings
    }

    /// The last step run, if any: its kind, tokens and seconds.
    pub fn last_step(&self) -> Option<StepRecord> {
        self.last_step
    }

    pub fn reset_timings(&mut self) {
        self.timings = StepTimings::default();
    }

    /// Checks KV-cache bookkeeping (for tests): reference counts match block tables, no
    /// leaked or doubly free block.
    pub fn check_invariants(&self) -> anyhow::Result<()> {
        self.scheduler.check_invariants()
    }

    /// One scheduler step + one forward that samples on the device. Returns the updates of
    /// this step.
    pub fn step(&mut self) -> anyhow::Result<Vec<SeqUpdate>> {
        self.step_observed(|_| {})
    }

    /// [`LlmEngine::step`], showing `scheduled` the statistics once the step is scheduled and
    /// before its forward: the sequences it runs count as running for the whole forward (as
    /// vLLM's gauges count a request in its prefill), not only from the next step on.
    pub fn step_observed(
        &mut self,
        scheduled: impl FnOnce(EngineStats),
    ) -> anyhow::Result<Vec<SeqUpdate>> {
        let started = Instant::now();
        let chunks = self.scheduler.schedule()?;
        scheduled(self.stats());
        if chunks.is_empty() {
            ensure!(
                !self.has_unfinished(),
                "scheduler made no progress with {} running and {} waiting sequences",
                self.scheduler.num_running(),
                self.scheduler.num_waiting()
            );
            return Ok(Vec::new());
        }
        let (sampled, schedule_secs) = self.forward(&chunks, started)?;
        let computed = Instant::now();
        self.scheduler.on_computed(&chunks)?;
        let mut results = sampled.into_iter();
        let mut updates = Vec::with_capacity(chunks.len());
        for chunk in &chunks {
            let (seq, generation) = self.entry(chunk.id)?;
            if seq.num_computed_tokens < seq.num_tokens() {
                let reasoning = generation.reasoning_tokens();
                updates.push(SeqUpdate::counts(chunk.id, Some(seq), reasoning, None));
                continue;
            }
            let row = results
                .next()
                .context("model returned too few sampled rows")?;
            // One sequence's failure (its sampling, its detokenisation, a panic in its stop
            // handling) ends that sequence only.
            let id = chunk.id;
            let appended = row.and_then(|sampled| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.append_sampled(id, sampled)
                }))
                .unwrap_or_else(|panic| Err(anyhow::anyhow!("panicked: {}", panic_text(&panic))))
            });
            updates.push(match appended {
                Ok(update) => update,
                Err(e) => self.fail_sequence(id, &e),
            });
        }
        let update_secs = computed.elapsed().as_secs_f64();
        self.record_timing(&chunks, &updates, started, schedule_secs, update_secs);
        Ok(updates)
    }

    /// Ends a sequence that failed on its own: its blocks are freed at once and its last
    /// update says `FinishReason::Error`.
    fn fail_sequence(&mut self, id: SeqId, error: &anyhow::Error) -> SeqUpdate {
        tracing::warn!("sequence {id} failed and was finished with an error: {error:#}");
        let removed = self.scheduler.remove(id);
        let reasoning = removed.as_ref().map_or(0, |(_, r)| r.reasoning_tokens());
        let seq = removed.as_ref().map(|(s, _)| s);
        SeqUpdate::counts(id, seq, reasoning, Some(FinishReason::Error))
    }

    /// A live sequence with its generation.
    fn entry(&self, id: SeqId) -> anyhow::Result<(&Sequence, &Generation)> {
        self.scheduler
            .get(id)
            .with_context(|| format!("unknown sequence {id}"))
    }

    /// Builds the batch (with each sampled sequence's spec) and runs the runner; returns
    /// its results and the host seconds spent since `started` before the runner was called.
    fn forward(
        &mut self,
        chunks: &[ScheduledChunk],
        started: Instant,
    ) -> anyhow::Result<(Vec<RowSample>, f64)> {
        // The uniform draws advance each sequence's own stream, so they come first (they
        // need the generations mutably, the specs borrow them).
        let mut uniforms = Vec::with_capacity(chunks.len());
        for c in chunks {
            let (seq, generation) = self
                .scheduler
                .get_mut(c.id)
                .with_context(|| format!("scheduled sequence {} vanished", c.id))?;
            let samples = c.start + c.len == seq.num_tokens();
            uniforms.push(samples.then(|| generation.next_uniform()));
        }
        self.compute_grammar_masks(chunks, &uniforms);
        let mut inputs = Vec::with_capacity(chunks.len());
        for (c, uniform) in chunks.iter().zip(uniforms) {
            let (seq, generation) = self
                .scheduler
                .get(c.id)
                .with_context(|| format!("scheduled sequence {} vanished", c.id))?;
            inputs.push(SeqInput {
                tokens: &seq.token_ids[c.start..c.start + c.len],
                start_pos: c.start,
                block_tables: &seq.block_tables,
                state_restores: &seq.state_restores,
                state_saves: &seq.state_saves,
                sample: uniform.map(|u| generation.sample_spec(seq.num_output_tokens(), u)),
            });
        }
        let wanted = inputs.iter().filter(|i| i.sample.is_some()).count();
        let schedule_secs = started.elapsed().as_secs_f64();
        let sampled = self
            .runner
            .forward(&inputs)
            .context("model forward failed")?;
        ensure!(
            sampled.len() == wanted,
            "model returned {} sampled rows for {wanted} sequences",
            sampled.len()
        );
        Ok((sampled, schedule_secs))
    }

    /// The grammar masks of this step's sampled, constrained sequences, computed in parallel
    /// (each is independent) before the forward that applies them.
    fn compute_grammar_masks(&mut self, chunks: &[ScheduledChunk], samples: &[Option<f64>]) {
        // Lookups only: a step without constrained sequences allocates nothing here.
        let ids: Vec<SeqId> = chunks
            .iter()
            .zip(samples)
            .filter(|(c, u)| {
                u.is_some()
                    && self
                        .scheduler
                        .get(c.id)
                        .is_some_and(|(_, r)| r.constrained())
            })
            .map(|(c, _)| c.id)
            .collect();
        if ids.is_empty() {
            return;
        }
        let mut constrained: Vec<&mut Generation> = self
            .scheduler
            .records_mut()
            .filter(|(id, _)| ids.contains(id))
            .map(|(_, r)| r)
            .collect();
        let secs: f64 = constrained.par_iter_mut().map(|r| r.compute_mask()).sum();
        self.timings.grammar_masks += constrained.len() as u64;
        self.timings.grammar_mask_secs += secs;
    }

    /// Appends a sampled token to its sequence and hands it to the generation, which
    /// releases its text and decides whether the sequence ends; a finished sequence's
    /// blocks are freed at once.
    fn append_sampled(&mut self, id: SeqId, sampled: Sampled) -> anyhow::Result<SeqUpdate> {
        let token = sampled.token;
        self.scheduler.append_token(id, token)?;
        let (seq, generation) = self
            .scheduler
            .get_mut(id)
            .with_context(|| format!("unknown sequence {id}"))?;
        let counts = SeqUpdate::counts(id, Some(seq), 0, None);
        // Counted before the generation takes it: a token whose handling fails was generated.
        self.generation_tokens_total += 1;
        if counts.num_output_tokens == 1 {
            self.prompt_tokens_total += counts.num_prompt_tokens as u64;
        }
        let outcome = generation.on_token(token, counts.num_output_tokens)?;
        let num_reasoning_tokens = generation.reasoning_tokens();
        self.timings.grammar_accept_secs += outcome.grammar_accept_secs;
        if outcome.finish.is_some() {
            self.scheduler.remove(id);
        }
        Ok(SeqUpdate {
            token: Some(token),
            text: outcome.text,
            reasoning_text: outcome.reasoning_text,
            logprob: sampled.logprobs.map(|l| TokenLogprob {
                token,
                logprob: l.logprob,
                top: l.top,
            }),
            finish: outcome.finish,
            num_reasoning_tokens,
            ..counts
        })
    }

    fn record_timing(
        &mut self,
        chunks: &[ScheduledChunk],
        updates: &[SeqUpdate],
        started: Instant,
        schedule_secs: f64,
        update_secs: f64,
    ) {
        let secs = started.elapsed().as_secs_f64();
        let prefills = chunks.iter().filter(|c| c.is_prefill).count();
        self.last_step = Some(StepRecord {
            kind: match prefills {
                0 => StepKind::DecodeOnly,
                n if n == chunks.len() => StepKind::PrefillOnly,
                _ => StepKind::Mixed,
            },
            tokens: chunks.iter().map(|c| c.len as u64).sum(),
            secs,
        });
        let runner = self.runner.profile();
        let t = &mut self.timings;
        if chunks.iter().any(|c| c.is_prefill) {
            t.prefill_steps += 1;
            t.prefill_secs += secs;
            t.prefill_experts_secs += runner.experts_secs;
            t.prefill_delta_net_secs += runner.delta_net_secs;
            t.prefill_tokens += chunks
                .iter()
                .filter(|c| c.is_prefill)
                .map(|c| c.len as u64)
                .sum::<u64>();
        } else {
            t.decode_steps += 1;
            t.decode_secs += secs;
            t.decode_tokens += updates.iter().filter(|u| u.token.is_some()).count() as u64;
            let d = &mut t.decode;
            d.schedule_secs += schedule_secs;
            d.prepare_secs += runner.prepare_secs;
            d.forward_secs += runner.forward_secs;
            d.experts_secs += runner.experts_secs;
            d.delta_net_secs += runner.delta_net_secs;
            d.sample_secs += runner.sample_secs;
            d.runner_wall_secs += runner.wall_secs;
            d.update_secs += update_secs;
        }
    }

    /// Runs all prompts batched together to completion (for `engine generate` and tests).
    pub fn generate(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &SamplingParams,
    ) -> anyhow::Result<Vec<GenerationOutput>> {
        let mut ids = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.into_iter().enumerate() {
            match self.add_request(prompt, params.clone()) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    for &id in &ids {
                        self.abort(id);
                    }
                    return Err(anyhow::Error::new(e).context(format!("prompt {i}")));
                }
            }
        }
        let index: HashMap<SeqId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let mut outputs: Vec<Option<GenerationOutput>> = vec![None; ids.len()];
        let mut partial: Vec<(Vec<u32>, Vec<f32>, String)> =
            vec![(Vec::new(), Vec::new(), String::new()); ids.len()];
        let mut remaining = ids.len();
        while remaining > 0 {
            for update in self.step()? {
                let Some(&i) = index.get(&update.id) else {
                    continue;
                };
                let (tokens, logprobs, text) = &mut partial[i];
                tokens.extend(update.token);
                logprobs.extend(update.logprob.map(|l| l.logprob));
                text.push_str(&update.text);
                if let Some(finish) = update.finish {
                    outputs[i] = Some(GenerationOutput {
                        token_ids: std::mem::take(tokens),
                        logprobs: std::mem::take(logprobs),
                        text: std::mem::take(text),
                        finish,
                        num_cached_prompt_tokens: update.num_cached_prompt_tokens,
                    });
                    remaining -= 1;
                }
            }
        }
        outputs
            .into_iter()
            .enumerate()
            .map(|(i, o)| o.with_context(|| format!("prompt {i} produced no output")))
            .collect()
    }
}

/// The message of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
