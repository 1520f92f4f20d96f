//! The one start-up path of `generate`, `bench` and `serve`: open the model files, build
//! the tokenizer, pick the device and load the runner with its KV cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::backend::cpu::{CpuBackend, CpuOptions, KvCacheDtype, QuantizedWeights};
use crate::backend::cuda::{
    open_cuda_backend, resolve_device, CudaOptions, DecodeAttention, PrefillAttention,
};
use crate::backend::Device;
use crate::config::ModelConfig;
use crate::engine::{EngineConfig, LlmEngine};
use crate::kv_sizing::RunnerOptions;
use crate::model::{Model, ModelRunner};
use crate::tokenizer::Tokenizer;
use crate::weights::WeightSource;

/// Device flags shared by every subcommand that loads a model.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceArgs {
    /// Compute device, `cpu` or `cuda`; default: cuda when a CUDA driver and a GPU are present, else cpu.
    #[arg(long)]
    pub device: Option<Device>,
    /// Compute threads of the CPU backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Fraction of the GPU's memory the engine may use; sizes the KV cache on CUDA.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// CUDA: run every decode step eagerly, without CUDA graphs.
    #[arg(long)]
    pub enforce_eager: bool,
    /// CPU: how GGUF's quantised weights are multiplied. `auto` (or `fastest`): integer
    /// kernels on the blocks (activations rounded to 8 bits per block of 32: as llama.cpp
    /// rounds them for the 32-weight types, with finer scales for the K-quants) wherever the CPU has integer SIMD kernels (AVX2 or AVX-512 VNNI), else f16
    /// kernels on a dequantised copy, by that rule, so every process computes the same
    /// logits; `integer` and `dequantize` force one (`dequantize` reproduces transformers'
    /// f32 logits on the dequantised weights, at a third of the decode speed).
    #[arg(long, value_enum, default_value_t = QuantizedWeights::Auto)]
    pub quantized_weights: QuantizedWeights,
    /// CPU: what the KV cache stores: `f16` (the default, as llama.cpp's cache: twice the
    /// tokens per --kv-cache-memory and half the bytes a long context's decode reads) or
    /// `f32`. CUDA stores bf16.
    #[arg(long, value_enum)]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// CUDA: the prefill attention kernel: `mma` (tensor cores, FlashAttention-2 style;
    /// the default where the GPU is sm_80 or newer and the head dim is 16, 32, 64 or 128)
    /// or `scalar` (CUDA cores, the default elsewhere).
    #[arg(long, value_enum)]
    pub prefill_attention: Option<PrefillAttention>,
    /// CUDA: the decode attention kernel: `pipelined` (the default on sm_80 or newer: K and V
    /// rows copied into shared memory with cp.async two tiles ahead of the one computed) or
    /// `direct` (loaded into registers, then used; the default on older GPUs).
    #[arg(long, value_enum)]
    pub decode_attention: Option<DecodeAttention>,
    /// CUDA: run what has never run on a GPU, unverified: a block table per layer group,
    /// so that sliding-window layers keep only their windows (without it every layer keeps
    /// every token, and the KV cache is counted that way).
    #[arg(long)]
    pub cuda_unverified_kernels: bool,
}

/// Model, KV-cache and scheduler flags shared by `generate`, `bench` and `serve`: one set
/// of defaults (named after vLLM's flags where the meaning is the same).
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// A GGUF file or a Hugging Face directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Most sequences in one running batch.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks plus decodes).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Context limit per sequence (prompt + output); default: the model's maximum position, capped to the KV-cache capacity.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// CPU KV-cache memory budget, e.g. `512MiB`, `2GiB` or a byte count (on CUDA the cache is sized by --gpu-memory-utilization).
    #[arg(long, default_value = "1GiB")]
    pub kv_cache_memory: String,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Reuse KV blocks of shared prompt prefixes (on by default).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Models with recurrent layers (Qwen3.5, Qwen3-Next): the prefix cache keeps a
    /// checkpoint of their state at each prompt's last block boundary, at a chat's history
    /// end, and every this many blocks (0: not periodically). Each checkpoint holds
    /// `/version`'s `state_checkpoint_bytes` of the KV pool until evicted.
    #[arg(long, default_value_t = crate::engine::DEFAULT_STATE_CHECKPOINT_EVERY)]
    pub state_checkpoint_every: usize,
    /// A Jinja chat template file that replaces the model's own (vLLM's `--chat-template`).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

impl EngineArgs {
    /// Rejects zero sizes and unreadable memory budgets before anything is loaded.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_num_seqs > 0 && self.max_num_batched_tokens > 0 && self.block_size > 0,
            "--max-num-seqs, --max-num-batched-tokens and --block-size must be at least 1"
        );
        anyhow::ensure!(
            self.max_model_len != Some(0),
            "--max-model-len must be at least 1"
        );
        parse_memory(&self.kv_cache_memory)?;
        Ok(())
    }
}

/// An engine ready to run, with what the callers report about it.
pub struct LoadedEngine {
    pub engine: LlmEngine,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub device: Device,
    /// Tokens the KV cache holds in sequences of `max_model_len` tokens.
    pub kv_capacity_tokens: usize,
    pub max_model_len: usize,
    /// What a decode step reads and a token caches, for the bandwidth bound.
    pub footprint: crate::model::Footprint,
    /// The layer groups the KV cache's blocks serve.
    pub kv_layer_groups: crate::layer_groups::LayerGroups,
    /// The positions the RoPE tables cover (LongRoPE's factors follow it).
    pub rope_positions: usize,
}

/// Loads the model and builds the engine from the shared flags: the one place where the
/// engine's configuration is decided.
pub fn load_engine(args: &EngineArgs) -> anyhow::Result<LoadedEngine> {
    args.check()?;
    let sizing = RunnerSizing {
        block_size: args.block_size,
        kv_cache_bytes: parse_memory(&args.kv_cache_memory)?,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_model_len: args.max_model_len,
    };
    let mut loaded = load_model(&args.model, &args.device, &sizing)?;
    if let Some(path) = &args.chat_template {
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("--chat-template: reading {}", path.display()))?;
        Arc::get_mut(&mut loaded.tokenizer)
            .context("the tokenizer is already shared; set the chat template before sharing it")?
            .set_chat_template(source, path)?;
    }
    let pool = loaded.runner.kv_pool();
    let positions = crate::model::max_positions(&loaded.config);
    let alone = pool.max_tokens_alone().unwrap_or(usize::MAX);
    // The runner refused a --max-model-len past the model's positions when it loaded.
    let max_model_len = match args.max_model_len {
        Some(len) if len > alone => anyhow::bail!(
            "--max-model-len {len} exceeds the {alone} tokens the KV cache holds for one sequence: raise --kv-cache-memory or lower --max-model-len"
        ),
        Some(len) => len,
        None if positions > alone => {
            tracing::warn!(
                "the model allows {positions} positions but the KV cache holds {alone} tokens of one sequence: max_model_len = {alone}"
            );
            alone
        }
        None => positions,
    };
    let kv_capacity_tokens = pool.capacity_tokens(max_model_len);
    let footprint = loaded.runner.footprint();
    let kv_layer_groups = loaded.runner.kv_layer_groups();
    let rope_positions = crate::model::rope_positions(&loaded.config, args.max_model_len)?;
    let engine = LlmEngine::new(
        loaded.runner,
        loaded.tokenizer.clone(),
        EngineConfig {
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_model_len,
            enable_prefix_caching: !args.no_enable_prefix_caching,
            state_checkpoint_every: args.state_checkpoint_every,
        },
    );
    Ok(LoadedEngine {
        engine,
        config: loaded.config,
        tokenizer: loaded.tokenizer,
        device: loaded.device,
        kv_capacity_tokens,
        max_model_len,
        footprint,
        kv_layer_groups,
        rope_positions,
    })
}

/// Parses `512MiB`, `2GiB`, `1.5GB`, `300M` or a plain byte count.
pub fn parse_memory(text: &str) -> anyhow::Result<usize> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .with_context(|| format!("--kv-cache-memory `{text}`: expected a size such as 512MiB"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => bail!(
            "--kv-cache-memory `{text}`: unknown unit `{other}` (use B, KiB, MiB, GiB, KB, MB, GB)"
        ),
    };
    let bytes = value * scale;
    if !(bytes >= 1.0 && bytes.is_finite()) {
        bail!("--kv-cache-memory `{text}` must be a positive size; the CPU backend has no utilisation fraction");
    }
    Ok(bytes as usize)
}

/// How big the runner's buffers and KV cache are.
#[derive(Debug, Clone, Copy)]
pub struct RunnerSizing {
    pub block_size: usize,
    /// KV-cache budget on the CPU (on CUDA the cache is sized from free device memory).
    pub kv_cache_bytes: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// The user's `--max-model-len`, if given.
    pub max_model_len: Option<usize>,
}

/// A model ready for an [`crate::engine::LlmEngine`].
pub struct LoadedModel {
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub runner: Box<dyn ModelRunner>,
    pub device: Device,
}

/// Opens `path` (a `.gguf` file or an HF directory) and loads it on the chosen device.
pub fn load_model(
    path: &Path,
    device: &DeviceArgs,
    sizing: &RunnerSizing,
) -> anyhow::Result<LoadedModel> {
    anyhow::ensure!(
        path.exists(),
        "model {} not found (run scripts/fetch-model.sh for the default model)",
        path.display()
    );
    let started = Instant::now();
    let (chosen, why) = resolve_device(device.device);
    tracing::info!("{why}");
    let (config, mut weights) = crate::weights::open_model(path)
        .with_context(|| format!("loading model {}", path.display()))?;
    let tokenizer = Arc::new(
        Tokenizer::from_model_path(path)
            .with_context(|| format!("loading the tokenizer of {}", path.display()))?,
    );
    let runner = match chosen {
        Device::Cpu => {
            anyhow::ensure!(
                device.prefill_attention.is_none() && device.decode_attention.is_none(),
                "--prefill-attention and --decode-attention are CUDA options, and the model runs \
                 on the CPU ({why}), whose backend has one kernel set"
            );
            anyhow::ensure!(
                !device.cuda_unverified_kernels,
                "--cuda-unverified-kernels is a CUDA option, and the model runs on the CPU \
                 ({why}), whose kernels are all verified"
            );
            let options = RunnerOptions {
                block_size: sizing.block_size,
                kv_cache_bytes: sizing.kv_cache_bytes,
                max_model_len: sizing.max_model_len,
            };
            // GGUF's quantised weights stay quantised (integer kernels); its f32 tensors
            // other than norms become f16, which halves the bytes every decode step reads
            // at a logit error far below the greedy margins (engine/tests/forward.rs).
            let cpu = CpuOptions {
                threads: device.threads,
                f32_weights_as_f16: path
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf")),
                quantized: device.quantized_weights,
                kv_cache_dtype: device.kv_cache_dtype.unwrap_or(KvCacheDtype::F16),
            };
            load_cpu_runner_with(&config, weights.as_mut(), &options, &cpu)?
        }
        Device::Cuda => {
            anyhow::ensure!(
                device.kv_cache_dtype.is_none(),
                "--kv-cache-dtype is a CPU option: the CUDA backend stores its KV cache in bf16"
            );
            let options = CudaOptions {
                block_size: sizing.block_size,
                gpu_memory_utilization: device.gpu_memory_utilization,
                max_num_seqs: sizing.max_num_seqs,
                max_num_batched_tokens: sizing.max_num_batched_tokens,
                enforce_eager: device.enforce_eager,
                prefill_attention: device.prefill_attention,
                decode_attention: device.decode_attention,
                max_model_len: sizing.max_model_len,
                unverified_kernels: device.cuda_unverified_kernels,
                ..CudaOptions::default()
            };
            load_cuda_runner(&config, weights.as_mut(), &options)?
        }
    };
    tracing::info!(
        "loaded {} on {chosen} in {:.2}s: {} KV blocks of {} tokens",
        path.display(),
        started.elapsed().as_secs_f64(),
        runner.num_blocks(),
        runner.block_size()
    );
    Ok(LoadedModel {
        config,
        tokenizer,
        runner,
        device: chosen,
    })
}

/// Loads a model onto the CPU with weights kept in their file dtype (quantised ones on the
/// integer kernels) and an f32 KV cache: the exact reference the golden tests compare.
pub fn load_cpu_runner(
    config: &ModelConfig,
    weights: &mut dyn WeightSource,
    opts: &RunnerOptions,
    threads: usize,
) -> anyhow::Result<Box<dyn ModelRunner>> {
    let cpu = CpuOptions {
        threads,
        f32_weights_as_f16: false,
        quantized: QuantizedWeights::Integer,
        kv_cache_dtype: KvCacheDtype::F32,
    };
    load_cpu_runner_with(config, weights, opts, &cpu)
}

/// Loads a model onto the CPU with explicit backend options (use
/// `quantized: QuantizedWeights::Dequantize` to run a GGUF file's quantised weights dequantised).
pub fn load_cpu_runner_with(
    config: &ModelConfig,
    weights: &mut dyn WeightSource,
    opts: &RunnerOptions,
    cpu: &CpuOptions,
) -> anyhow::Result<Box<dyn ModelRunner>> {
    let backend = CpuBackend::new(cpu)?;
    Ok(Box::new(Model::load(backend, config, weights, opts)?))
}

/// Loads a model onto a GPU with a bf16 KV cache sized from free memory; fails with
/// `backend::cuda::NO_DRIVER` (never panics) on a machine without a CUDA driver.
pub fn load_cuda_runner(
    config: &ModelConfig,
    weights: &mut dyn WeightSource,
    opts: &CudaOptions,
) -> anyhow::Result<Box<dyn ModelRunner>> {
    let (backend, runner_opts) =
        open_cuda_backend(config, weights.contains("lm_head.weight"), opts)?;
    Ok(Box::new(Model::load(
        backend,
        config,
        weights,
        &runner_opts,
    )?))
}
