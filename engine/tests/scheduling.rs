//! Scheduler, KV-cache and engine behaviour against a mock model whose output depends on
//! the full context read back through the block table, so any block-table or
//! prefix-cache corruption changes the tokens versus a cache-free reference.

mod common;

use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context};
use engine::backend::RowSample;
use engine::engine::{EngineConfig, FinishReason, GenerationOutput, LlmEngine, SeqId};
use engine::limits::LimitError;
use engine::model::{ModelRunner, SeqInput, StepProfile};
use engine::sampler::{sample_row, SamplingParams};
use engine::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::golden;

const VOCAB: usize = 49152;
const EMPTY: u32 = u32::MAX;

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_model_path(&golden("llama-tiny")).expect("llama-tiny tokenizer"))
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Logits for a context: eight candidate tokens derived from a hash of every token,
/// the first one clearly the most likely, all others far below.
fn mock_logits(context: &[u32]) -> Vec<f32> {
    let h = context
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &t| mix(h ^ u64::from(t)));
    let mut logits = vec![-20.0f32; VOCAB];
    for k in 0..8u64 {
        // Token ids 0..=2 are special (EOS among them); keep them out of the candidates.
        let id = 3 + (mix(h.wrapping_add(k)) % (VOCAB as u64 - 3)) as usize;
        logits[id] = logits[id].max(3.0 - 0.4 * k as f32);
    }
    logits
}

/// Greedy continuation computed without any cache.
fn reference(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut context = prompt.to_vec();
    for _ in 0..n {
        let logits = mock_logits(&context);
        let best = (0..VOCAB).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        context.push(best as u32);
    }
    context[prompt.len()..].to_vec()
}

/// What the mock saw in one forward: `(start_pos, len, need_logits)` per entry.
type ForwardLog = Arc<Mutex<Vec<Vec<(usize, usize, bool)>>>>;

/// A paged "KV cache" that stores the token id written at each slot.
struct MockRunner {
    /// Rows of the mock's embedding table (ids at or past it are rejected).
    vocab: usize,
    /// Sequences whose sampling fails, by the first token of their prompt.
    failing_prompts: Vec<u32>,
    /// When set, every sampled token is this id.
    forced: Option<u32>,
    block_size: usize,
    num_blocks: usize,
    slots: Vec<u32>,
    log: ForwardLog,
}

impl MockRunner {
    fn new(num_blocks: usize, block_size: usize) -> (MockRunner, ForwardLog) {
        let log = ForwardLog::default();
        let runner = MockRunner {
            vocab: VOCAB,
            failing_prompts: Vec::new(),
            forced: None,
            block_size,
            num_blocks,
            slots: vec![EMPTY; num_blocks * block_size],
            log: log.clone(),
        };
        (runner, log)
    }

    fn slot(&self, table: &[u32], pos: usize) -> anyhow::Result<usize> {
        let block = *table
            .get(pos / self.block_size)
            .with_context(|| format!("block table too short for position {pos}"))?;
        ensure!(
            (block as usize) < self.num_blocks,
            "block {block} out of range"
        );
        Ok(block as usize * self.block_size + pos % self.block_size)
    }
}

impl MockRunner {
    /// Writes the batch into the mock cache and returns the sampled entries' logits.
    fn run(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.log.lock().unwrap().push(
            batch
                .iter()
                .map(|s| (s.start_pos, s.tokens.len(), s.sample.is_some()))
                .collect(),
        );
        // Write every entry first, as a real forward writes K/V of the whole batch.
        for input in batch {
            for (i, &t) in input.tokens.iter().enumerate() {
                let slot = self.slot(&input.block_tables[0], input.start_pos + i)?;
                self.slots[slot] = t;
            }
        }
        let mut rows = Vec::new();
        for input in batch.iter().filter(|s| s.sample.is_some()) {
            let end = input.start_pos + input.tokens.len();
            let context = (0..end)
                .map(|pos| {
                    let t = self.slots[self.slot(&input.block_tables[0], pos)?];
                    ensure!(t != EMPTY, "position {pos} read before it was written");
                    Ok(t)
                })
                .collect::<anyhow::Result<Vec<u32>>>()?;
            rows.push(mock_logits(&context));
        }
        Ok(rows)
    }
}

impl ModelRunner for MockRunner {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>> {
        let rows = self.run(batch)?;
        let sampled = batch.iter().filter(|s| s.sample.is_some());
        let mut out = Vec::new();
        for (mut row, input) in rows.into_iter().zip(sampled) {
            let first = self.slots[self.slot(&input.block_tables[0], 0)?];
            out.push(if self.failing_prompts.contains(&first) {
                Err(anyhow::anyhow!("injected sampling failure"))
            } else {
                let mut sampled = sample_row(&mut row, input.sample.as_ref().expect("filtered"));
                if let Some(t) = self.forced {
                    sampled.token = t;
                }
                Ok(sampled)
            });
        }
        Ok(out)
    }

    fn logits(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.run(batch)
    }

    fn profile(&self) -> StepProfile {
        StepProfile::default()
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn kv_layer_groups(&self) -> engine::layer_groups::LayerGroups {
        engine::layer_groups::LayerGroups::full(1)
    }

    fn footprint(&self) -> engine::model::Footprint {
        engine::model::Footprint::default()
    }
}

struct Setup {
    num_blocks: usize,
    block_size: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
}

const ROOMY: Setup = Setup {
    num_blocks: 1024,
    block_size: 4,
    max_num_seqs: 64,
    max_num_batched_tokens: 512,
};

fn engine(setup: &Setup, tokenizer: &Arc<Tokenizer>) -> (LlmEngine, ForwardLog) {
    engine_with(setup, tokenizer, |_| {})
}

/// An engine over a mock runner adjusted by `tweak`.
fn engine_with(
    setup: &Setup,
    tokenizer: &Arc<Tokenizer>,
    tweak: impl FnOnce(&mut MockRunner),
) -> (LlmEngine, ForwardLog) {
    let (mut runner, log) = MockRunner::new(setup.num_blocks, setup.block_size);
    tweak(&mut runner);
    let config = EngineConfig {
        max_num_seqs: setup.max_num_seqs,
        max_num_batched_tokens: setup.max_num_batched_tokens,
        max_model_len: 4096,
        enable_prefix_caching: true,
        state_checkpoint_every: 0,
    };
    (
        LlmEngine::new(Box::new(runner), tokenizer.clone(), config),
        log,
    )
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// 16 prompts of mixed lengths; half share a 3-block prefix so the cache is exercised.
fn mixed_prompts(seed: u64) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let shared: Vec<u32> = (0..12).map(|_| rng.random_range(3..VOCAB as u32)).collect();
    (0..16)
        .map(|i| {
            let len = rng.random_range(1..60);
            let mut p: Vec<u32> = if i % 2 == 0 {
                shared.clone()
            } else {
                Vec::new()
            };
            p.extend((0..len).map(|_| rng.random_range(3..VOCAB as u32)));
            p
        })
        .collect()
}

fn tokens(outputs: &[GenerationOutput]) -> Vec<Vec<u32>> {
    outputs.iter().map(|o| o.token_ids.clone()).collect()
}

#[test]
fn greedy_outputs_are_batch_invariant() {
    let tok = tokenizer();
    let prompts = mixed_prompts(1);
    let params = greedy(24);
    let expected: Vec<Vec<u32>> = prompts.iter().map(|p| reference(p, 24)).collect();

    for (i, prompt) in prompts.iter().enumerate() {
        let (mut e, _) = engine(&ROOMY, &tok);
        let alone = e.generate(vec![prompt.clone()], &params).unwrap();
        assert_eq!(alone[0].token_ids, expected[i], "prompt {i} alone");
        assert_eq!(alone[0].finish, FinishReason::Length);
    }

    let (mut e, _) = engine(&ROOMY, &tok);
    let batch = e.generate(prompts.clone(), &params).unwrap();
    assert_eq!(tokens(&batch), expected, "batch of 16");
    assert_eq!(e.stats().num_preemptions, 0);

    // 72 tokens at most per sequence = 18 blocks; 24 blocks force preemption.
    let tight_kv = Setup {
        num_blocks: 24,
        ..ROOMY
    };
    let (mut e, _) = engine(&tight_kv, &tok);
    let preempted = e.generate(prompts.clone(), &params).unwrap();
    assert_eq!(tokens(&preempted), expected, "under preemption");
    assert!(
        e.stats().num_preemptions > 0,
        "the KV budget must force preemption"
    );
    e.check_invariants().unwrap();
    assert_eq!(e.stats().kv_blocks_used, 0);

    let tiny_budget = Setup {
        max_num_batched_tokens: 7,
        ..ROOMY
    };
    let (mut e, log) = engine(&tiny_budget, &tok);
    let chunked = e.generate(prompts, &params).unwrap();
    assert_eq!(tokens(&chunked), expected, "with chunked prefill");
    let log = log.lock().unwrap();
    assert!(log
        .iter()
        .all(|step| step.iter().map(|s| s.1).sum::<usize>() <= 7));
    assert!(
        log.iter()
            .flatten()
            .any(|&(start, len, need)| start > 0 && len > 1 && !need),
        "prompts must be split into chunks"
    );
}

#[test]
fn seeded_sampling_is_batch_invariant_and_survives_preemption() {
    let tok = tokenizer();
    let prompts = mixed_prompts(2);
    let params_for = |i: usize| SamplingParams {
        max_tokens: 20,
        temperature: 1.0,
        top_k: 4,
        seed: Some(1000 + i as u64),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let run = |setup: &Setup| {
        let (mut e, _) = engine(setup, &tok);
        let ids: Vec<SeqId> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| e.add_request(p.clone(), params_for(i)).unwrap())
            .collect();
        let mut out = vec![Vec::new(); ids.len()];
        while e.has_unfinished() {
            for u in e.step().unwrap() {
                out[ids.iter().position(|&id| id == u.id).unwrap()].extend(u.token);
            }
            e.check_invariants().unwrap();
        }
        (out, e.stats().num_preemptions)
    };
    let (roomy, _) = run(&ROOMY);
    let (tight, preemptions) = run(&Setup {
        num_blocks: 22,
        max_num_batched_tokens: 16,
        ..ROOMY
    });
    assert!(preemptions > 0);
    assert_eq!(roomy, tight);
    // Sampling really happened: some sequence left the greedy path.
    let greedy_paths: Vec<Vec<u32>> = prompts.iter().map(|p| reference(p, 20)).collect();
    assert_ne!(roomy, greedy_paths);
}

#[test]
fn shared_prefix_hits_three_blocks_and_computes_only_the_rest() {
    let tok = tokenizer();
    let (mut e, log) = engine(&ROOMY, &tok);
    let prefix: Vec<u32> = (100..112).collect();
    let mut a = prefix.clone();
    a.extend([7, 8, 9]);
    let mut b = prefix;
    b.extend([20, 21, 22, 23, 24]);
    let out_a = e.generate(vec![a.clone()], &greedy(5)).unwrap();
    assert_eq!(out_a[0].num_cached_prompt_tokens, 0);
    log.lock().unwrap().clear();
    let out_b = e.generate(vec![b.clone()], &greedy(5)).unwrap();
    assert_eq!(out_b[0].token_ids, reference(&b, 5));
    assert_eq!(out_b[0].num_cached_prompt_tokens, 12);
    let computed: usize = log.lock().unwrap().iter().flatten().map(|s| s.1).sum();
    // 5 uncached prompt tokens, then 4 decodes.
    assert_eq!(computed, 5 + 4);
    let stats = e.stats();
    assert_eq!(stats.prefix_cache_hits, 12);
    assert_eq!(stats.prefix_cache_queries, (a.len() + b.len()) as u64);
    assert_eq!(stats.kv_blocks_used, 0);
}

/// nano-vLLM bug 1: a prompt entirely in the cache left nothing to prefill.
#[test]
fn fully_cached_prompt_still_computes_its_last_token() {
    let tok = tokenizer();
    for len in [12usize, 13] {
        let (mut e, log) = engine(&ROOMY, &tok);
        let prompt: Vec<u32> = (300..300 + len as u32).collect();
        let first = e.generate(vec![prompt.clone()], &greedy(3)).unwrap();
        log.lock().unwrap().clear();
        let second = e.generate(vec![prompt.clone()], &greedy(3)).unwrap();
        assert_eq!(first[0].token_ids, reference(&prompt, 3));
        assert_eq!(second[0].token_ids, first[0].token_ids);
        // Only whole blocks before the last token are served from the cache.
        let cached = (len - 1) / 4 * 4;
        assert_eq!(second[0].num_cached_prompt_tokens, cached);
        let log = log.lock().unwrap();
        assert_eq!(
            log[0],
            vec![(cached, len - cached, true)],
            "prompt of {len}"
        );
    }
}

/// nano-vLLM bugs 2-4: a preempted sequence re-prefills prompt + generated tokens (not a
/// one-token "decode" because it already has outputs), partly from the prefix cache, and
/// continues exactly as it would have without preemption.
#[test]
fn preempted_sequence_reprefills_from_the_cache_and_continues_identically() {
    let tok = tokenizer();
    // Two 15-token prompts (4 blocks each), 9 blocks in all: when both need a fifth
    // block the later one is preempted. An 8-token budget splits the re-prefill.
    let setup = Setup {
        num_blocks: 9,
        max_num_batched_tokens: 8,
        ..ROOMY
    };
    let (mut e, log) = engine(&setup, &tok);
    let p0: Vec<u32> = (1000..1015).collect();
    let p1: Vec<u32> = (2000..2015).collect();
    let params = greedy(14);
    let out = e.generate(vec![p0.clone(), p1.clone()], &params).unwrap();
    assert_eq!(out[0].token_ids, reference(&p0, 14));
    assert_eq!(out[1].token_ids, reference(&p1, 14));
    let stats = e.stats();
    assert!(stats.num_preemptions >= 1);
    // The re-prefill found p1's cached blocks (prompt and generated tokens), counted apart
    // from first-admission hits, of which there are none (the prompts share nothing).
    assert!(
        stats.prefix_cache_preempted_hits >= 8,
        "hits after preemption: {}",
        stats.prefix_cache_preempted_hits
    );
    assert_eq!(stats.prefix_cache_hits, 0);
    let log = log.lock().unwrap();
    let reprefill = log
        .iter()
        .flatten()
        .any(|&(start, len, _)| start > 0 && len > 1 && start + len > p1.len());
    assert!(
        reprefill,
        "the preempted sequence must re-prefill its generated tokens: {log:?}"
    );
    e.check_invariants().unwrap();
    assert_eq!(e.stats().kv_blocks_used, 0);
}

#[test]
fn random_request_mix_leaks_no_blocks() {
    let tok = tokenizer();
    let setup = Setup {
        num_blocks: 40,
        block_size: 4,
        max_num_seqs: 12,
        max_num_batched_tokens: 48,
    };
    let (mut e, _) = engine(&setup, &tok);
    let mut rng = StdRng::seed_from_u64(7);
    let shared: Vec<u32> = (0..8).map(|_| rng.random_range(3..VOCAB as u32)).collect();
    let mut live: Vec<SeqId> = Vec::new();
    let (mut added, mut finished, mut aborted, mut stopped) = (0, 0, 0, 0);
    while added < 200 || e.has_unfinished() {
        if added < 200 && rng.random_bool(0.6) {
            let len = rng.random_range(1..40);
            let mut prompt = if rng.random_bool(0.5) {
                shared.clone()
            } else {
                Vec::new()
            };
            prompt.extend((0..len).map(|_| rng.random_range(3..VOCAB as u32)));
            let params = SamplingParams {
                max_tokens: rng.random_range(1..30),
                temperature: if rng.random_bool(0.5) { 0.0 } else { 0.9 },
                seed: Some(rng.random()),
                stop: if rng.random_bool(0.3) {
                    vec!["e".into()]
                } else {
                    vec![]
                },
                stop_token_ids: (0..20).map(|_| rng.random_range(3..VOCAB as u32)).collect(),
                ..SamplingParams::default()
            };
            live.push(e.add_request(prompt, params).unwrap());
            added += 1;
        }
        if !live.is_empty() && rng.random_bool(0.05) {
            let id = live.swap_remove(rng.random_range(0..live.len()));
            assert!(e.abort(id));
            assert!(!e.abort(id), "a second abort finds nothing");
            aborted += 1;
        }
        for u in e.step().unwrap() {
            if let Some(reason) = u.finish {
                live.retain(|&id| id != u.id);
                finished += 1;
                if reason == FinishReason::Stop {
                    stopped += 1;
                }
            }
        }
        e.check_invariants().unwrap();
    }
    assert_eq!(finished + aborted, 200);
    assert!(stopped > 0 && aborted > 0);
    let stats = e.stats();
    assert!(
        stats.num_preemptions > 0,
        "the mix must exercise preemption"
    );
    assert!(stats.prefix_cache_hits > 0);
    assert_eq!(
        (stats.kv_blocks_used, stats.num_running, stats.num_waiting),
        (0, 0, 0)
    );
}

#[test]
fn finish_reasons_and_stop_strings() {
    let tok = tokenizer();
    let (mut e, _) = engine(&ROOMY, &tok);
    let prompt: Vec<u32> = (500..520).collect();
    let full = e
        .generate(vec![prompt.clone()], &greedy(12))
        .unwrap()
        .remove(0);
    assert_eq!(full.finish, FinishReason::Length);
    assert_eq!(full.text, tok.decode(&full.token_ids, true).unwrap());

    // A stop token id: generation ends on it, its text is not emitted.
    let stop_id = full.token_ids[4];
    let params = SamplingParams {
        stop_token_ids: vec![stop_id],
        ..greedy(12)
    };
    let out = e.generate(vec![prompt.clone()], &params).unwrap().remove(0);
    let first = full.token_ids.iter().position(|&t| t == stop_id).unwrap();
    assert_eq!(out.token_ids, full.token_ids[..=first]);
    assert_eq!(out.finish, FinishReason::Stop);
    assert_eq!(
        out.text,
        tok.decode(&full.token_ids[..first], true).unwrap()
    );

    // A stop string spanning a token boundary: the text is cut before it.
    let text = &full.text;
    let prefix = tok.decode(&full.token_ids[..6], true).unwrap();
    assert!(text.starts_with(&prefix) && prefix.len() < text.len());
    // The last character of token 6's text and the first one after it.
    let start = prefix.char_indices().last().unwrap().0;
    let end = prefix.len() + text[prefix.len()..].chars().next().unwrap().len_utf8();
    let stop = text[start..end].to_string();
    let params = SamplingParams {
        stop: vec![stop.clone()],
        ..greedy(12)
    };
    let out = e.generate(vec![prompt.clone()], &params).unwrap().remove(0);
    assert_eq!(out.finish, FinishReason::Stop);
    let cut = text.find(&stop).unwrap();
    assert_eq!(out.text, text[..cut]);
    assert!(out.token_ids.len() < full.token_ids.len());

    // min_tokens delays a stop token id.
    let params = SamplingParams {
        stop_token_ids: vec![full.token_ids[0]],
        min_tokens: 3,
        ..greedy(12)
    };
    let out = e.generate(vec![prompt], &params).unwrap().remove(0);
    assert!(out.token_ids.len() >= 3);
    assert_eq!(e.stats().kv_blocks_used, 0);
}

#[test]
fn add_request_rejects_bad_input_clearly() {
    let tok = tokenizer();
    let (mut e, _) = engine(&ROOMY, &tok);
    let err = |r: Result<SeqId, LimitError>| r.unwrap_err().to_string();
    assert_eq!(err(e.add_request(vec![], greedy(4))), "prompt is empty");
    assert_eq!(
        err(e.add_request(vec![5, 99999], greedy(4))),
        "token id 99999 is out of vocabulary (size 49152)"
    );
    assert_eq!(
        err(e.add_request(vec![5; 4000], greedy(100))),
        "prompt (4000 tokens) + max_tokens (100) exceeds max_model_len (4096)"
    );
    let small = Setup {
        num_blocks: 4,
        ..ROOMY
    };
    let (mut e, _) = engine(&small, &tok);
    assert!(err(e.add_request(vec![5; 16], greedy(4))).contains("KV cache"));
    assert!(!e.has_unfinished());
}

/// The real CPU runner on the tiny Llama: greedy outputs are the same alone, in a batch
/// of 16, under a KV budget that forces preemption, and under a token budget that forces
/// chunked prefill.
#[test]
fn llama_tiny_greedy_is_batch_invariant() {
    use engine::backend::cpu::KvCacheDtype;
    use engine::kv_sizing::{kv_bytes_per_token, RunnerOptions};
    use engine::loader::load_cpu_runner;

    let dir = golden("llama-tiny");
    let tok = tokenizer();
    let run = |prompts: &[Vec<u32>], num_blocks: usize, budget: usize| {
        let (config, mut weights) = engine::weights::open_model(&dir).unwrap();
        let options = RunnerOptions {
            block_size: 4,
            kv_cache_bytes: kv_bytes_per_token(&config, KvCacheDtype::F32.bytes()) * 4 * num_blocks,
            max_model_len: None,
        };
        let runner = load_cpu_runner(&config, weights.as_mut(), &options, 2).unwrap();
        assert_eq!(runner.num_blocks(), num_blocks);
        let engine_config = EngineConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: budget,
            max_model_len: 2048,
            enable_prefix_caching: true,
            state_checkpoint_every: 0,
        };
        let mut e = LlmEngine::new(runner, tok.clone(), engine_config);
        let out = e.generate(prompts.to_vec(), &greedy(12)).unwrap();
        e.check_invariants().unwrap();
        (tokens(&out), e.stats().num_preemptions)
    };
    let prompts = mixed_prompts(3);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| run(std::slice::from_ref(p), 256, 512).0.remove(0))
        .collect();
    let (batched, _) = run(&prompts, 256, 512);
    assert_eq!(batched, alone, "batch of 16");
    let (preempted, preemptions) = run(&prompts, 24, 512);
    assert!(preemptions > 0);
    assert_eq!(preempted, alone, "under preemption");
    let (chunked, _) = run(&prompts, 256, 7);
    assert_eq!(chunked, alone, "with chunked prefill");
}

#[test]
fn updates_carry_logprobs_counts_and_stats() {
    let tok = tokenizer();
    let (mut e, _) = engine(&ROOMY, &tok);
    let prompt: Vec<u32> = (700..710).collect();
    let params = SamplingParams {
        logprobs: Some(3),
        ..greedy(4)
    };
    let id = e.add_request(prompt.clone(), params).unwrap();
    let mut updates = Vec::new();
    while e.has_unfinished() {
        updates.extend(e.step().unwrap());
    }
    let expected = reference(&prompt, 4);
    assert_eq!(updates.len(), 4);
    for (i, u) in updates.iter().enumerate() {
        assert_eq!((u.id, u.token), (id, Some(expected[i])));
        assert_eq!((u.num_prompt_tokens, u.num_output_tokens), (10, i + 1));
        let lp = u.logprob.as_ref().unwrap();
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0], (expected[i], lp.logprob));
        assert!(lp.logprob < 0.0 && lp.top[1].1 < lp.logprob);
    }
    assert_eq!(updates[3].finish, Some(FinishReason::Length));
    assert!(updates[..3].iter().all(|u| u.finish.is_none()));
    let stats = e.stats();
    assert_eq!(
        (stats.prompt_tokens_total, stats.generation_tokens_total),
        (10, 4)
    );
    assert_eq!(stats.kv_blocks_total, ROOMY.num_blocks);
}

/// A sequence whose sampling fails is finished with `FinishReason::Error` and its blocks
/// freed; the others of its steps finish as they would alone.
#[test]
fn one_failing_sequence_finishes_alone_with_an_error() {
    let tok = tokenizer();
    let prompts: Vec<Vec<u32>> = vec![vec![5, 6, 7, 8, 9], vec![777, 6, 7], vec![11, 12]];
    let expected: Vec<Vec<u32>> = [0, 2].iter().map(|&i| reference(&prompts[i], 12)).collect();
    let (mut e, _) = engine_with(&ROOMY, &tok, |r| r.failing_prompts = vec![777]);
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| e.add_request(p.clone(), greedy(12)).unwrap())
        .collect();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut finish = vec![None; 3];
    while e.has_unfinished() {
        for u in e.step().expect("a step survives one sequence's failure") {
            let i = ids.iter().position(|&id| id == u.id).unwrap();
            tokens[i].extend(u.token);
            if u.finish.is_some() {
                finish[i] = u.finish;
            }
        }
        e.check_invariants().unwrap();
    }
    assert_eq!(
        finish,
        vec![
            Some(FinishReason::Length),
            Some(FinishReason::Error),
            Some(FinishReason::Length)
        ]
    );
    assert!(tokens[1].is_empty(), "the failing sequence sampled nothing");
    assert_eq!(vec![tokens[0].clone(), tokens[2].clone()], expected);
    assert_eq!(e.stats().kv_blocks_used, 0, "every block freed");
}

/// Prompt ids are checked against the smaller of the model's and the tokenizer's vocabularies.
#[test]
fn prompt_ids_past_the_models_vocabulary_are_rejected() {
    let tok = tokenizer();
    let (mut e, _) = engine_with(&ROOMY, &tok, |r| r.vocab = 1000);
    assert_eq!(e.vocab_size(), 1000);
    let err = e.add_request(vec![5, 999, 1000], greedy(4)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "token id 1000 is out of vocabulary (size 1000)"
    );
    assert!(e.add_request(vec![5, 999], greedy(4)).is_ok());
}

/// A finish in the middle of a multi-byte character keeps its bytes (as U+FFFD) instead of
/// dropping them: the decoder is flushed when a sequence ends.
#[test]
fn the_decoder_is_flushed_when_a_sequence_ends() {
    let tok = tokenizer();
    // "\u{c3}" in the byte-level alphabet is the first byte of a two-byte UTF-8 character.
    let lead = tok.token_to_id("\u{c3}").expect("byte token");
    let (mut e, _) = engine_with(&ROOMY, &tok, |r| r.forced = Some(lead));
    let out = e.generate(vec![vec![5, 6, 7]], &greedy(1)).unwrap();
    assert_eq!(out[0].token_ids, vec![lead]);
    assert_eq!(out[0].text, "\u{fffd}");
}

#[test]
fn a_step_shows_its_sequences_running_before_its_forward() {
    let tok = tokenizer();
    let (mut e, _) = engine(&ROOMY, &tok);
    e.add_request((3..40).collect(), greedy(2)).unwrap();
    e.add_request((3..20).collect(), greedy(2)).unwrap();
    let before = e.stats();
    assert_eq!((before.num_running, before.num_waiting), (0, 2));
    let mut seen = None;
    e.step_observed(|stats| seen = Some((stats.num_running, stats.num_waiting)))
        .unwrap();
    assert_eq!(seen, Some((2, 0)), "both prefills run in this step");
}

/// On each sliding family (Gemma 3's five sliding layers to one full, gpt-oss's
/// alternation, Mistral's window on every layer; windows of 5 tokens, blocks of 16) and
/// each hybrid one (Qwen3.5's and Qwen3-Next's Gated DeltaNet beside full attention), a
/// request sharing a 2,000-token prefix with a finished one takes the prefix from the
/// cache (the full groups' blocks and each sliding group's window at token 2,000; for
/// the hybrids, up to the last checkpoint of the recurrent state, every 4 blocks: 1,984)
/// and generates the cold run's greedy tokens with its logprobs.
#[test]
fn sliding_and_hybrid_families_serve_a_shared_prefix_from_the_cache_as_a_cold_run() {
    use engine::backend::cpu::KvCacheDtype;
    use engine::kv_sizing::{kv_bytes_per_token, RunnerOptions};
    use engine::layer_groups::{GroupKind, LayerGroups};
    use engine::loader::load_cpu_runner;

    let tok = tokenizer();
    let families = [
        "gemma3-tiny",
        "gpt-oss-tiny",
        "mistral-tiny-window",
        "qwen35-tiny",
        "qwen3next-tiny",
    ];
    for family in families {
        // The fixture with room for 4,096 positions (its weights do not depend on them).
        let fixture = common::workspace()
            .join("engine/tests/fixtures/families")
            .join(family);
        let dir = tempfile::tempdir().unwrap();
        for file in ["config.json", "model.safetensors"] {
            std::fs::copy(fixture.join(file), dir.path().join(file)).unwrap();
        }
        let config_path = dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        config["max_position_embeddings"] = 4096.into();
        std::fs::write(&config_path, config.to_string()).unwrap();
        let engine = || {
            let (config, mut weights) = engine::weights::open_model(dir.path()).unwrap();
            let groups = LayerGroups::of(&config, 1).kinds();
            assert!(
                groups
                    .iter()
                    .any(|k| matches!(k, GroupKind::Sliding { .. } | GroupKind::Recurrent { .. })),
                "{family}: {groups:?}"
            );
            let options = RunnerOptions {
                block_size: 16,
                // What 300 blocks cost if every layer kept every token.
                kv_cache_bytes: kv_bytes_per_token(&config, KvCacheDtype::F32.bytes()) * 16 * 300,
                max_model_len: Some(4096),
            };
            let runner = load_cpu_runner(&config, weights.as_mut(), &options, 2).unwrap();
            let vocab = config.vocab_size as u32;
            let engine_config = EngineConfig {
                max_num_seqs: 4,
                max_num_batched_tokens: 512,
                max_model_len: 4096,
                enable_prefix_caching: true,
                state_checkpoint_every: 4,
            };
            (LlmEngine::new(runner, tok.clone(), engine_config), vocab)
        };
        let (mut warm, vocab) = engine();
        let prefix: Vec<u32> = (0..2000u32).map(|i| (i * 37 + 11) % vocab).collect();
        let with_tail = |tail: &[u32]| -> Vec<u32> { prefix.iter().chain(tail).copied().collect() };
        let params = SamplingParams {
            logprobs: Some(0),
            ..greedy(8)
        };
        // A first prompt 20 tokens past the prefix: its last block boundary (2,016) is past
        // the shared part, so a hybrid's hit comes from its periodic checkpoints.
        let first_tail: Vec<u32> = (1..=20).collect();
        warm.generate(vec![with_tail(&first_tail)], &params)
            .unwrap();
        let hit = warm
            .generate(vec![with_tail(&[7, 8, 9, 10])], &params)
            .unwrap();
        warm.check_invariants().unwrap();
        let cached = if family.starts_with("qwen3") {
            1984
        } else {
            2000
        };
        assert_eq!(hit[0].num_cached_prompt_tokens, cached, "{family}");
        assert_eq!(warm.stats().prefix_cache_hits, cached as u64, "{family}");
        let (mut cold, _) = engine();
        let want = cold
            .generate(vec![with_tail(&[7, 8, 9, 10])], &params)
            .unwrap();
        assert_eq!(want[0].num_cached_prompt_tokens, 0);
        assert_eq!(hit[0].token_ids, want[0].token_ids, "{family}");
        assert_eq!(hit[0].logprobs.len(), 8, "{family}");
        assert_eq!(want[0].logprobs.len(), 8, "{family}");
        for (a, b) in hit[0].logprobs.iter().zip(&want[0].logprobs) {
            assert!(
                (a - b).abs() < 1e-4,
                "{family}: logprob {a} against {b} cold"
            );
        }
    }
}

/// Qwen3.5 and Qwen3-Next served (their Gated DeltaNet states in the pool's blocks): six
/// prompts, some longer than a 64-token chunk, batched with chunked prefill in a pool
/// small enough to preempt (a preempted sequence restarts from its checkpoints or from
/// position 0), with checkpoints every block, give each prompt's solo greedy tokens (a
/// repeated prompt from the first one's checkpoint); aborted requests beside them, and
/// every block, state and checkpoint comes back to the pool.
#[test]
fn hybrid_families_serve_batches_and_preemptions_as_solo_runs() {
    use engine::backend::cpu::KvCacheDtype;
    use engine::engine::PrefixCaching;
    use engine::kv_sizing::{layer_block_bytes, RunnerOptions};
    use engine::layer_groups::GroupKind;
    use engine::loader::load_cpu_runner;

    let tok = tokenizer();
    for family in ["qwen35-tiny", "qwen3next-tiny"] {
        let dir = common::workspace()
            .join("engine/tests/fixtures/families")
            .join(family);
        // A pool of `blocks` blocks (of one layer each: the groups have one layer).
        let engine = |blocks: usize, max_num_seqs: usize| {
            let (config, mut weights) = engine::weights::open_model(&dir).unwrap();
            let options = RunnerOptions {
                block_size: 16,
                kv_cache_bytes: layer_block_bytes(&config, 16, KvCacheDtype::F32.bytes()) * blocks,
                max_model_len: Some(512),
            };
            let runner = load_cpu_runner(&config, weights.as_mut(), &options, 2).unwrap();
            let groups = runner.kv_groups();
            assert_eq!(
                groups
                    .iter()
                    .filter(|g| matches!(g, GroupKind::Recurrent { .. }))
                    .count(),
                3,
                "{family}: {groups:?}"
            );
            let engine_config = EngineConfig {
                max_num_seqs,
                max_num_batched_tokens: 96,
                max_model_len: 512,
                enable_prefix_caching: true,
                state_checkpoint_every: 1,
            };
            LlmEngine::new(runner, tok.clone(), engine_config)
        };
        let vocab = 256u32;
        // Each prompt one short of a block's end, so that decoding takes a block at once.
        let prompts: Vec<Vec<u32>> = [47usize, 79, 127, 31, 79, 15]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                (0..n as u32)
                    .map(|t| (t * 31 + 7 * i as u32 + 3) % vocab)
                    .collect()
            })
            .collect();
        // Prompts 1 and 4 are the same: 4 finds 1's checkpoint at its last block boundary.
        let mut prompts = prompts;
        prompts[4] = prompts[1].clone();
        let params = greedy(12);
        let mut solo = engine(100, 1);
        assert_eq!(solo.prefix_caching(), PrefixCaching::On);
        let mut want: Vec<Vec<u32>> = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let out = solo.generate(vec![p.clone()], &params).unwrap();
            let cached = if i == 4 { 64 } else { 0 };
            assert_eq!(
                out[0].num_cached_prompt_tokens, cached,
                "{family}: prompt {i}"
            );
            want.push(out[0].token_ids.clone());
        }
        solo.check_invariants().unwrap();
        assert_eq!(solo.stats().num_running, 0);
        // The first two prompts' states (2 blocks per DeltaNet group) and blocks take 20
        // of 21; both decoding past their blocks' ends need 22.
        let mut batched = engine(21, 4);
        // Two requests aborted three steps in, holding states, blocks and checkpoints.
        let doomed = [
            batched.add_request(prompts[2].clone(), greedy(40)).unwrap(),
            batched.add_request(prompts[0].clone(), greedy(40)).unwrap(),
        ];
        for _ in 0..3 {
            batched.step().unwrap();
            batched.check_invariants().unwrap();
        }
        for id in doomed {
            assert!(batched.abort(id), "{family}: request {id} was live");
        }
        batched.check_invariants().unwrap();
        let got = batched.generate(prompts.clone(), &params).unwrap();
        batched.check_invariants().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&g.token_ids, w, "{family}: prompt {i}");
        }
        let stats = batched.stats();
        assert!(stats.num_preemptions > 0, "{family}: no preemption");
        assert_eq!(
            (stats.kv_blocks_used, stats.num_running),
            (0, 0),
            "{family}"
        );
    }
}
