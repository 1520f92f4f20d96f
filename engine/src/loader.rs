//! The one start-up path of `generate`, `bench` and `serve`: open the model files, build
//! the tokenizer, pick the device and load the runner with its KV cache.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use crate::backend::cpu::{load_cpu_runner_with, CpuOptions};
use crate::backend::cuda::{load_cuda_runner, resolve_device, CudaOptions, Device};
use crate::config::ModelConfig;
use crate::model::{ModelRunner, RunnerOptions};
use crate::tokenizer::Tokenizer;

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
}

/// How big the runner's buffers and KV cache are.
#[derive(Debug, Clone, Copy)]
pub struct RunnerSizing {
    pub block_size: usize,
    /// KV-cache budget on the CPU (on CUDA the cache is sized from free device memory).
    pub kv_cache_bytes: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
}

/// A model ready for an [`crate::engine::LlmEngine`].
pub struct LoadedModel {
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub runner: Box<dyn ModelRunner>,
    pub device: Device,
}

impl LoadedModel {
    /// Tokens the KV cache holds.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.runner.num_blocks() * self.runner.block_size()
    }
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
            let options = RunnerOptions {
                block_size: sizing.block_size,
                kv_cache_bytes: sizing.kv_cache_bytes,
            };
            // GGUF's quantised weights arrive dequantised to f32; f16 halves the bytes every
            // decode step reads, at a logit error far below the greedy margins (engine/tests/forward.rs).
            let cpu = CpuOptions {
                threads: device.threads,
                f32_weights_as_f16: path
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf")),
            };
            load_cpu_runner_with(&config, weights.as_mut(), &options, &cpu)?
        }
        Device::Cuda => {
            let options = CudaOptions {
                block_size: sizing.block_size,
                gpu_memory_utilization: device.gpu_memory_utilization,
                max_num_seqs: sizing.max_num_seqs,
                max_num_batched_tokens: sizing.max_num_batched_tokens,
                enforce_eager: device.enforce_eager,
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
