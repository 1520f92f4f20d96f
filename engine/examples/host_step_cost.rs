//! The engine's own cost per decode step, with a runner that does no model work.
//!
//! 256 sequences with 1,000-token prompts decode together (temperature 0.6, seeded,
//! `ignore_eos`); the runner answers every step at once with a token per sequence, so a
//! step's wall time is the host's share alone: scheduling, building the batch and its
//! sampling specs, appending tokens, detokenising and stop checks. Prints the median and
//! p90 over the decode steps (at least 100).
//!
//! `cargo run --release -p engine --example host_step_cost [-- TOKENIZER_DIR]` (default:
//! `../shared/golden/qwen3-tiny/bf16`, a 151,936-token Qwen tokenizer).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use engine::backend::RowSample;
use engine::engine::{EngineConfig, LlmEngine};
use engine::model::{ModelRunner, SeqInput, StepProfile};
use engine::sampler::{Sampled, SamplingParams};
use engine::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NUM_SEQS: usize = 256;
const PROMPT_LEN: usize = 1000;
const OUTPUT_LEN: usize = 160;
const BLOCK_SIZE: usize = 16;

/// A runner that computes nothing: each sampled entry gets an ordinary text token derived
/// from its seed and draw counter.
struct NullRunner {
    num_blocks: usize,
}

impl ModelRunner for NullRunner {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>> {
        Ok(batch
            .iter()
            .filter_map(|s| s.sample)
            .map(|spec| {
                let token = 1000 + ((spec.seed.wrapping_mul(31) + spec.draw * 7919) % 20_000);
                Ok(Sampled {
                    token: token as u32,
                    logprobs: None,
                })
            })
            .collect())
    }

    fn logits(&mut self, _batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        anyhow::bail!("the null runner has no logits")
    }

    fn profile(&self) -> StepProfile {
        StepProfile::default()
    }

    fn vocab_size(&self) -> usize {
        151_936
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        BLOCK_SIZE
    }

    fn kv_layer_groups(&self) -> engine::layer_groups::LayerGroups {
        engine::layer_groups::LayerGroups::full(1)
    }

    fn footprint(&self) -> engine::model::Footprint {
        engine::model::Footprint::default()
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/qwen3-tiny/bf16")
        });
    let tokenizer = Arc::new(Tokenizer::from_model_path(&dir)?);
    let per_seq = (PROMPT_LEN + OUTPUT_LEN).div_ceil(BLOCK_SIZE);
    let runner = NullRunner {
        num_blocks: NUM_SEQS * per_seq,
    };
    let config = EngineConfig {
        max_num_seqs: NUM_SEQS,
        max_num_batched_tokens: 16_384,
        max_model_len: 4096,
        enable_prefix_caching: true,
        state_checkpoint_every: 0,
    };
    let mut engine = LlmEngine::new(Box::new(runner), tokenizer, config);
    let mut rng = StdRng::seed_from_u64(0);
    for i in 0..NUM_SEQS {
        let prompt = (0..PROMPT_LEN)
            .map(|_| rng.random_range(1000..20_000))
            .collect();
        let params = SamplingParams {
            max_tokens: OUTPUT_LEN,
            temperature: 0.6,
            seed: Some(i as u64),
            ignore_eos: true,
            ..SamplingParams::default()
        };
        engine.add_request(prompt, params)?;
    }
    let mut decode_steps = Vec::new();
    while engine.has_unfinished() {
        let before = engine.timings().decode_steps;
        let started = Instant::now();
        let updates = engine.step()?;
        let secs = started.elapsed().as_secs_f64();
        let decoding = engine.timings().decode_steps > before;
        if decoding && updates.len() == NUM_SEQS {
            decode_steps.push(secs);
        }
    }
    anyhow::ensure!(
        decode_steps.len() >= 100,
        "only {} full decode steps",
        decode_steps.len()
    );
    decode_steps.sort_by(f64::total_cmp);
    let t = engine.timings();
    let per = |x: f64| 1e3 * x / t.decode_steps as f64;
    println!(
        "host cost per decode step, batch {NUM_SEQS}, {PROMPT_LEN}-token prompts: median {:.3} ms, p90 {:.3} ms over {} steps",
        1e3 * percentile(&decode_steps, 0.5),
        1e3 * percentile(&decode_steps, 0.9),
        decode_steps.len()
    );
    println!(
        "  mean per decode step: schedule + batch {:.3} ms, runner {:.3} ms, update {:.3} ms",
        per(t.decode.schedule_secs),
        per(t.decode.runner_wall_secs),
        per(t.decode.update_secs)
    );
    Ok(())
}
