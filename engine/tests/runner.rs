//! The runner contract on the CPU backend (the GPU checks the same in `tests/cuda.rs`): the
//! runner samples, only sampled rows come back, penalties and masks act, and seeded
//! sampling draws the same tokens as the CPU sampler did before sampling moved into the
//! runner.

mod common;

use engine::backend::cpu::{CpuAct, CpuBackend, CpuOptions, KvCacheDtype, QuantizedWeights};
use engine::backend::cuda::{DecodeAttention, PrefillAttention};
use engine::backend::Device;
use engine::engine::{EngineConfig, LlmEngine};
use engine::kv_sizing::{kv_bytes_per_token, RunnerOptions};
use engine::loader::{load_cpu_runner, load_cpu_runner_with, load_engine, DeviceArgs, EngineArgs};
use engine::sampler::SamplingParams;
use engine::tokenizer::Tokenizer;
use engine::weights::open_model;

use common::{golden_dir_with, smollm2_gguf};

#[test]
fn cpu_backend_keeps_the_sampling_contract() {
    let b = CpuBackend::new(&CpuOptions {
        threads: 1,
        f32_weights_as_f16: false,
        quantized: QuantizedWeights::Integer,
        kv_cache_dtype: KvCacheDtype::F32,
    })
    .expect("backend");
    common::check_sampling_contract(&b, |rows, cols, data| {
        CpuAct::from_rows(rows, cols, data.to_vec()).expect("activation")
    });
}

#[test]
fn cpu_runner_samples_its_own_logits() {
    let dir = golden_dir_with("qwen3-tiny/bf16", "model.safetensors");
    let (config, mut w) = open_model(&dir).expect("open model");
    let opts = RunnerOptions {
        block_size: 16,
        kv_cache_bytes: kv_bytes_per_token(&config, KvCacheDtype::F32.bytes()) * 16 * 16,
        max_model_len: None,
    };
    let mut r = load_cpu_runner(&config, w.as_mut(), &opts, 2).expect("load");
    common::check_runner_samples_its_logits(r.as_mut());
}

/// Seeded sampling on the CPU draws what it drew before sampling moved into the runner:
/// these token ids came from the engine as of commit ce3914a (the sampler read full logits
/// rows on the host), with top-k/top-p, min-p and all three penalties. The weights run as
/// they did then, dequantised to f16 (the integer kernels compute other logits, checked in
/// `tests/forward.rs`).
#[test]
fn seeded_cpu_sampling_draws_the_same_tokens_as_before() {
    let path = smollm2_gguf();
    let (config, mut weights) = open_model(&path).expect("open SmolLM2");
    let opts = RunnerOptions {
        block_size: 16,
        kv_cache_bytes: 64 << 20,
        max_model_len: None,
    };
    let cpu = CpuOptions {
        threads: 2,
        f32_weights_as_f16: true,
        quantized: QuantizedWeights::Dequantize,
        kv_cache_dtype: KvCacheDtype::F32,
    };
    let runner = load_cpu_runner_with(&config, weights.as_mut(), &opts, &cpu).expect("load");
    let tokenizer = std::sync::Arc::new(Tokenizer::from_model_path(&path).expect("tokenizer"));
    let config = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        max_model_len: 2048,
        enable_prefix_caching: true,
        state_checkpoint_every: 0,
    };
    let mut engine = LlmEngine::new(runner, tokenizer.clone(), config);
    let prompts: Vec<Vec<u32>> = ["Once upon a time", "The best way to learn Rust is"]
        .iter()
        .map(|p| tokenizer.encode(p, true).expect("encode"))
        .collect();
    let nucleus = SamplingParams {
        max_tokens: 24,
        temperature: 0.8,
        top_p: 0.9,
        top_k: 40,
        seed: Some(42),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let penalised = SamplingParams {
        max_tokens: 24,
        temperature: 1.0,
        min_p: 0.05,
        seed: Some(7),
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.3,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let want: [[u32; 24]; 4] = [
        [
            28, 339, 804, 288, 325, 253, 5636, 6949, 28, 253, 22230, 351, 253, 6521, 327, 2477, 28,
            564, 253, 1443, 929, 3156, 28, 339,
        ],
        [
            288, 1120, 351, 260, 10152, 30, 1385, 506, 253, 340, 11444, 12784, 338, 339, 3543, 804,
            28, 564, 288, 835, 36828, 28, 346, 737,
        ],
        [
            28, 260, 905, 436, 1811, 8441, 30, 533, 451, 7456, 6693, 282, 469, 1038, 4599, 2026,
            5286, 2747, 347, 354, 4507, 281, 1488, 346,
        ],
        [
            351, 253, 1578, 30, 216, 198, 57, 699, 338, 665, 359, 634, 617, 736, 2606, 469, 7543,
            284, 502, 856, 722, 346, 327, 750,
        ],
    ];
    let mut got = Vec::new();
    for params in [&nucleus, &penalised] {
        for out in engine.generate(prompts.clone(), params).expect("generate") {
            got.push(out.token_ids);
        }
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.as_slice(), w.as_slice(), "sequence {i}");
    }
}

/// A context longer than the positions the model serves is refused at start-up, not
/// discovered by a step (which would fail every running request).
#[test]
fn max_model_len_past_the_models_positions_is_refused() {
    let args = EngineArgs {
        model: golden_dir_with("llama-tiny", "model.safetensors"),
        max_num_seqs: 4,
        max_num_batched_tokens: 256,
        max_model_len: Some(3000),
        kv_cache_memory: "16MiB".into(),
        block_size: 16,
        enable_prefix_caching: false,
        no_enable_prefix_caching: false,
        state_checkpoint_every: 0,
        chat_template: None,
        device: DeviceArgs {
            device: Some(Device::Cpu),
            threads: 1,
            gpu_memory_utilization: 0.9,
            enforce_eager: false,
            quantized_weights: QuantizedWeights::Auto,
            kv_cache_dtype: None,
            prefill_attention: None,
            decode_attention: None,
            cuda_unverified_kernels: false,
        },
    };
    let err = load_engine(&args).err().expect("refused").to_string();
    assert!(
        err.contains("--max-model-len 3000 exceeds the 2048 positions"),
        "{err}"
    );
    let fits = EngineArgs {
        max_model_len: Some(2048),
        ..args
    };
    assert_eq!(load_engine(&fits).expect("loads").max_model_len, 2048);
    // A CUDA-only kernel choice is refused on the CPU, not ignored.
    let mut cuda_only = fits.clone();
    cuda_only.device.prefill_attention = Some(PrefillAttention::Mma);
    let err = load_engine(&cuda_only).err().expect("refused").to_string();
    assert!(
        err.contains("--prefill-attention and --decode-attention are CUDA options"),
        "{err}"
    );
    let mut cuda_only = fits.clone();
    cuda_only.device.decode_attention = Some(DecodeAttention::Pipelined);
    let err = load_engine(&cuda_only).err().expect("refused").to_string();
    assert!(
        err.contains("--prefill-attention and --decode-attention are CUDA options"),
        "{err}"
    );
}
