//! Times the CPU runner's forward pass: prefill (2 × 256 tokens), single-stream decode and
//! 16-sequence decode, as wall-clock tok/s and tok/s per CPU-time (for a busy machine).
//!
//! `cargo run --release -p engine --example forward_bench -- [MODEL] [THREADS]`
//! MODEL is an HF directory or a GGUF file (linear weights stored as f16); without it a
//! random model with SmolLM2-135M's shapes is used. THREADS defaults to all cores.
//!
//! Variants: `PREFILL_ONLY=N` times one N-token prefill; `DECODE_ONLY=1` times 200
//! batch-1 decode steps; `-- ops` (with `THREADS=n` in the environment) times the
//! matmul op alone at SmolLM2's decode and prefill shapes.

use std::time::Instant;

use engine::backend::cpu::{CpuOptions, KvCacheDtype, QuantizedWeights};
use engine::config::{
    Activation, AttentionSpan, Family, Ffn, LayerSpec, Mixer, ModelConfig, NormPlacement,
    NormWeights, RopeSpec,
};
use engine::kv_sizing::{kv_bytes_per_token, RunnerOptions};
use engine::loader::load_cpu_runner_with;
use engine::model::{ModelRunner, SeqInput};
use engine::sampler::SampleSpec;
use engine::weights::{open_model, HostTensor, TensorData, WeightSource};

/// Random weights with the shapes a config implies.
struct RandomWeights {
    config: ModelConfig,
    seed: u64,
}

impl RandomWeights {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let c = &self.config;
        let (h, i, hd) = (c.hidden_size, c.layers[0].ffn.width(), c.head_dim);
        let (q, kv) = (c.num_heads * hd, c.num_kv_heads * hd);
        let suffix = name
            .rsplit_once("layers.")
            .map_or(name, |(_, s)| s.split_once('.').map_or(s, |(_, s)| s));
        Some(match suffix {
            "model.embed_tokens.weight" => vec![c.vocab_size, h],
            "model.norm.weight" | "input_layernorm.weight" | "post_attention_layernorm.weight" => {
                vec![h]
            }
            "self_attn.q_proj.weight" => vec![q, h],
            "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kv, h],
            "self_attn.o_proj.weight" => vec![h, q],
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![i, h],
            "mlp.down_proj.weight" => vec![h, i],
            _ => return None,
        })
    }
}

impl WeightSource for RandomWeights {
    fn load(&mut self, name: &str) -> anyhow::Result<HostTensor> {
        let shape = self
            .shape(name)
            .ok_or_else(|| anyhow::anyhow!("no tensor {name}"))?;
        let n: usize = shape.iter().product();
        let is_norm = shape.len() == 1;
        let data = (0..n)
            .map(|_| {
                self.seed = self
                    .seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (self.seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if is_norm {
                    1.0 + 0.1 * u
                } else {
                    0.1 * u
                }
            })
            .collect();
        Ok(HostTensor {
            shape,
            data: TensorData::F32(data),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.shape(name).is_some()
    }
}

/// Seconds of CPU time (user + system) this process has used, from `/proc/self/stat`
/// (Linux; 0 elsewhere). With other processes on the machine, `tokens / (cpu / threads)`
/// estimates the rate on an idle machine.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Prints wall-clock and CPU-time-normalised rates for `tokens` processed since `(t, cpu)`.
fn report(what: &str, tokens: usize, t: Instant, cpu: f64, threads: usize) {
    let wall = t.elapsed().as_secs_f64();
    let busy = (cpu_seconds() - cpu) / threads as f64;
    println!(
        "{what}: {:.1} tok/s wall ({:.2} ms per step-token), {:.1} tok/s per CPU-time of {threads} threads",
        tokens as f64 / wall,
        wall * 1e3 / tokens as f64,
        tokens as f64 / busy
    );
}

fn smollm2_config() -> ModelConfig {
    ModelConfig {
        family: Family::Llama,
        vocab_size: 49152,
        hidden_size: 576,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        embedding_scale: 1.0,
        final_logit_softcap: None,
        norm_weights: NormWeights::AsStored,
        layers: vec![
            LayerSpec {
                mixer: Mixer::Attention { output_gate: false },
                attention: AttentionSpan::Full,
                rope: RopeSpec {
                    theta: 100000.0,
                    rotary_dim: 64,
                    scaling: None,
                },
                qk_norm: false,
                qkv_bias: false,
                o_bias: false,
                sinks: false,
                attn_scale: 1.0 / 8.0,
                attn_softcap: None,
                norms: NormPlacement::Pre,
                activation: Activation::Silu,
                ffn: Ffn::Dense {
                    intermediate_size: 1536,
                },
                shared_expert: None,
            };
            30
        ],
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("ops") {
        return op_bench();
    }
    let threads = args.get(2).map(|t| t.parse()).transpose()?.unwrap_or(0);
    let (config, mut weights): (ModelConfig, Box<dyn WeightSource>) = match args.get(1) {
        Some(path) => open_model(path.as_ref())?,
        None => {
            let config = smollm2_config();
            (config.clone(), Box::new(RandomWeights { config, seed: 1 }))
        }
    };
    let bs = 16;
    let opts = RunnerOptions {
        block_size: bs,
        kv_cache_bytes: kv_bytes_per_token(&config, KvCacheDtype::F16.bytes()) * 16 * 512,
        max_model_len: None,
    };
    let cpu = CpuOptions {
        threads,
        f32_weights_as_f16: true,
        quantized: QuantizedWeights::Auto,
        kv_cache_dtype: KvCacheDtype::F16,
    };
    let n_threads = match threads {
        0 => std::thread::available_parallelism()?.get(),
        t => t,
    };
    let t = Instant::now();
    let mut r: Box<dyn ModelRunner> = load_cpu_runner_with(&config, weights.as_mut(), &opts, &cpu)?;
    println!("load: {:.2}s", t.elapsed().as_secs_f64());

    let prompt: Vec<u32> = (0..256u32)
        .map(|i| (i * 7919) % config.vocab_size as u32)
        .collect();
    let blocks_per_seq = 512 / bs;
    // One table per layer group, disjoint (the groups share the caches).
    let groups = r.kv_groups().len() as u32;
    let grouped = |ids: std::ops::Range<u32>| -> Vec<Vec<u32>> {
        (0..groups)
            .map(|g| ids.clone().map(|b| b * groups + g).collect())
            .collect()
    };
    let table = |s: usize| grouped((s * blocks_per_seq) as u32..((s + 1) * blocks_per_seq) as u32);

    if let Some(len) = std::env::var("PREFILL_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let long: Vec<u32> = (0..len as u32)
            .map(|i| (i * 7919) % config.vocab_size as u32)
            .collect();
        let tb = grouped(0..len.div_ceil(bs) as u32);
        let (t, cpu) = (Instant::now(), cpu_seconds());
        r.forward(&[SeqInput {
            state_restores: &[],
            state_saves: &[],
            tokens: &long,
            start_pos: 0,
            block_tables: &tb,
            sample: Some(SampleSpec::GREEDY),
        }])?;
        report(&format!("prefill ({len} tokens)"), len, t, cpu, n_threads);
        return Ok(());
    }
    if std::env::var_os("DECODE_ONLY").is_some() {
        let tb = table(0);
        r.forward(&[SeqInput {
            state_restores: &[],
            state_saves: &[],
            tokens: &prompt[..64],
            start_pos: 0,
            block_tables: &tb,
            sample: None,
        }])?;
        let t = Instant::now();
        for s in 0..200 {
            r.forward(&[SeqInput {
                state_restores: &[],
                state_saves: &[],
                tokens: &[5],
                start_pos: 64 + s,
                block_tables: &tb,
                sample: Some(SampleSpec::GREEDY),
            }])?;
        }
        println!(
            "decode batch 1: {:.1} ms/step",
            t.elapsed().as_secs_f64() * 1e3 / 200.0
        );
        return Ok(());
    }

    // Prefill: 2 × 256 tokens, one sequence each.
    r.forward(&[SeqInput {
        state_restores: &[],
        state_saves: &[],
        tokens: &prompt[..16],
        start_pos: 0,
        block_tables: &table(0),
        sample: Some(SampleSpec::GREEDY),
    }])?;
    let (t, cpu) = (Instant::now(), cpu_seconds());
    for s in 0..2 {
        let tb = table(s);
        r.forward(&[SeqInput {
            state_restores: &[],
            state_saves: &[],
            tokens: &prompt,
            start_pos: 0,
            block_tables: &tb,
            sample: Some(SampleSpec::GREEDY),
        }])?;
    }
    report("prefill (2 x 256 tokens)", 512, t, cpu, n_threads);

    // Decode, batch 1: 64 steps after the 256-token prompt of sequence 0.
    let tb = table(0);
    let steps = 64;
    let (t, cpu) = (Instant::now(), cpu_seconds());
    for s in 0..steps {
        r.forward(&[SeqInput {
            state_restores: &[],
            state_saves: &[],
            tokens: &[5],
            start_pos: 256 + s,
            block_tables: &tb,
            sample: Some(SampleSpec::GREEDY),
        }])?;
    }
    report("decode batch 1", steps, t, cpu, n_threads);

    // Decode, batch 16: sequences with 64-token prompts.
    let tables: Vec<Vec<Vec<u32>>> = (0..16).map(table).collect();
    for tb in &tables {
        r.forward(&[SeqInput {
            state_restores: &[],
            state_saves: &[],
            tokens: &prompt[..64],
            start_pos: 0,
            block_tables: tb,
            sample: None,
        }])?;
    }
    let steps = 16;
    let (t, cpu) = (Instant::now(), cpu_seconds());
    for s in 0..steps {
        let batch: Vec<SeqInput> = tables
            .iter()
            .map(|tb| SeqInput {
                state_restores: &[],
                state_saves: &[],
                tokens: &[5],
                start_pos: 64 + s,
                block_tables: tb,
                sample: Some(SampleSpec::GREEDY),
            })
            .collect();
        r.forward(&batch)?;
    }
    report("decode batch 16", 16 * steps, t, cpu, n_threads);
    Ok(())
}

/// Times single ops with SmolLM2's decode shapes (run with `ops` as the only argument).
fn op_bench() -> anyhow::Result<()> {
    use engine::backend::cpu::{CpuAct, CpuBackend};
    use engine::backend::{Backend, LayerOps, StepOps};
    let threads = std::env::var("THREADS")
        .ok()
        .map(|t| t.parse())
        .transpose()?
        .unwrap_or(0);
    let b = CpuBackend::new(&CpuOptions {
        threads,
        f32_weights_as_f16: true,
        quantized: QuantizedWeights::Auto,
        kv_cache_dtype: KvCacheDtype::F16,
    })?;
    for &(m, n, k) in &[
        (1usize, 3072usize, 576usize),
        (1, 576, 1536),
        (1, 49152, 576),
        (4, 3072, 576),
        (16, 3072, 576),
        (32, 3072, 576),
        (64, 3072, 576),
        (128, 3072, 576),
        (256, 3072, 576),
        (256, 576, 1536),
    ] {
        let w = b.upload_weight(
            "w",
            HostTensor {
                shape: vec![n, k],
                data: TensorData::F32(vec![0.01; n * k]),
            },
        )?;
        let x = CpuAct::from_rows(m, k, vec![0.5; m * k])?;
        let mut out = b.new_act();
        let iters = (2_000_000_000 / (m * n * k * 2)).clamp(3, 2000);
        b.install(|| b.matmul(&x, &w, None, &mut out))?;
        let t = Instant::now();
        for _ in 0..iters {
            b.install(|| b.matmul(&x, &w, None, &mut out))?;
        }
        let dt = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "matmul m={m} n={n} k={k}: {:.1} us, {:.1} GFLOP/s, {:.1} GB/s weights",
            dt * 1e6,
            2.0 * (m * n * k) as f64 / dt / 1e9,
            (n * k * 2) as f64 / dt / 1e9
        );
    }
    Ok(())
}
