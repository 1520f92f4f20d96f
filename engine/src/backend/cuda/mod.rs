//! The CUDA backend: bf16 weights and activations on one GPU, f32 accumulation, GEMMs in
//! cuBLAS and the other ops in the CUDA C kernels of `kernels/` (compiled with NVRTC at
//! start-up). Needs no CUDA at build time (cudarc loads the libraries dynamically).
//!
//! Activations are bf16 (the embedding gather copies bf16 rows), so every op rounds where
//! transformers' bf16 forward rounds; logits are widened to f32 on the device before they
//! cross to the host. The Qwen3 q/k norm and RoPE are deferred until `attention`, which runs
//! them fused with the KV-cache write (one kernel); any other op first flushes them.
//! Everything runs on one stream, so cudarc's cross-stream event tracking is turned off.

mod attention;
mod device;
mod experts;
mod graph;
mod kernels;
mod ops;
mod recurrent;
mod sample_words;
mod sampling;
mod sizing;
mod step;

use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{anyhow, bail, ensure, Context};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute_enum};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg,
};
use half::bf16;

use attention::Pending;
pub use device::{
    compute_flops, cuda_available, device_name, driver_present, gpu_count, memory_bandwidth,
    resolve_device, NO_DRIVER,
};
use experts::ExpertScratch;
pub use experts::{CudaExperts, ExpertBiases};
pub use graph::{bucket_for, graph_buckets, table_bucket};
pub use kernels::{
    all_kernel_names, compile_cubin, compile_source_cubin, cubin_kernels, decode_async_smem_bytes,
    decode_kernel_name, missing_kernels, nvrtc_present, prefill_fa_kernel, prefill_fa_smem_bytes,
    prefill_kernel_name, prefill_smem_bytes, program, sliding_twin, DecodeAttention, KernelSet,
    PREFILL_FA_DIMS, SOURCES,
};
pub use sizing::{activation_reserve_bytes, kv_cache_tokens, weight_bytes_bf16};
pub use step::CudaStep;
use step::{GraphState, StepBuffers};

use super::{refuse_what_it_lacks, AttentionOps, Backend, Tensors};
use crate::config::{Activation, Ffn, Mixer, ModelConfig};
use crate::kv_sizing::{kv_bytes_per_token, layer_block_bytes, RunnerOptions};
use crate::layer_groups::LayerGroups;
use crate::weights::{HostTensor, TensorData};

/// Which kernel computes prefill attention. Unless one is named, the tensor-core kernel
/// runs where it can (sm_80 or newer, an instantiated head dim), else the CUDA-core one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefillAttention {
    /// The CUDA-core kernel (`prefill_attention_np*`, any head dim up to 256, any GPU).
    Scalar,
    /// The tensor-core kernel, FlashAttention-2 style, with cp.async tiles, ldmatrix
    /// fragments and two query heads of a GQA group a block (`prefill_attention_fa_d*_h*`;
    /// head dims 16, 32, 64 and 128; sm_80 or newer). Checked on an H200 against
    /// transformers.
    Mma,
}

/// How the CUDA runner is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOptions {
    /// CUDA device ordinal.
    pub ordinal: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Fraction of the GPU's memory the engine may use (weights, activations, KV cache).
    pub gpu_memory_utilization: f64,
    /// Scheduler limit on sequences per step (sizes the logits reserve and graph buckets).
    pub max_num_seqs: usize,
    /// Scheduler limit on tokens per step (sizes the activation reserve).
    pub max_num_batched_tokens: usize,
    /// Exact KV-cache size in tokens instead of sizing from free memory (tests).
    pub kv_cache_tokens: Option<usize>,
    /// Run decode steps eagerly instead of replaying CUDA graphs.
    pub enforce_eager: bool,
    /// The prefill attention kernel; `None` picks the tensor-core one where it can run.
    pub prefill_attention: Option<PrefillAttention>,
    /// The decode attention kernel; `None` picks the pipelined one where it can run.
    pub decode_attention: Option<DecodeAttention>,
    /// The longest sequence served (`--max-model-len`); `None`: the model's maximum position.
    pub max_model_len: Option<usize>,
    /// Runs what has never run on a GPU (`--cuda-unverified-kernels`): a block table per
    /// layer group, so that sliding layers keep only their windows (issue 61).
    pub unverified_kernels: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            ordinal: 0,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            kv_cache_tokens: None,
            enforce_eager: false,
            prefill_attention: None,
            decode_attention: None,
            max_model_len: None,
            unverified_kernels: false,
        }
    }
}

/// Opens the GPU, compiles the kernels, sizes the bf16 KV cache from free memory (or
/// `opts.kv_cache_tokens`) and the step buffers from the scheduler's limits; returns the
/// backend and the options `Model::load` sizes its cache with. Fails with [`NO_DRIVER`]
/// (never panics) on a machine without a CUDA driver.
pub fn open_cuda_backend(
    config: &ModelConfig,
    separate_lm_head: bool,
    opts: &CudaOptions,
) -> anyhow::Result<(CudaBackend, RunnerOptions)> {
    let gpus = gpu_count().map_err(|why| anyhow!(why))?;
    ensure!(
        opts.ordinal < gpus,
        "--device cuda: GPU {} requested but the driver reports {gpus}",
        opts.ordinal
    );
    ensure!(opts.block_size > 0, "KV block size must be positive");
    let mut backend = CudaBackend::new(opts.ordinal, KernelSet::for_model(config))?;
    backend.set_unverified_kernels(opts.unverified_kernels);
    // Before the KV cache is sized from the model's weights.
    refuse_what_it_lacks(&backend, config)?;
    let backend = backend
        .with_prefill_attention(opts.prefill_attention, config.head_dim)?
        .with_decode_attention(
            opts.decode_attention,
            config.num_heads / config.num_kv_heads,
            config.head_dim,
        )?;
    // The budget as if every layer kept every token; layer groups that keep windows make
    // more blocks of it (`Model::load`).
    let all_layers_token_bytes = kv_bytes_per_token(config, backend.kv_value_bytes());
    let tokens = match opts.kv_cache_tokens {
        Some(t) => t / opts.block_size * opts.block_size,
        None => {
            let (free, total) = backend
                .ctx
                .mem_get_info()
                .context("reading free GPU memory")?;
            let weights_bytes = weight_bytes_bf16(config, separate_lm_head);
            let reserve =
                activation_reserve_bytes(config, opts.max_num_batched_tokens, opts.max_num_seqs);
            let bytes = all_layers_token_bytes;
            kv_cache_tokens(
                free,
                total,
                opts.gpu_memory_utilization,
                weights_bytes,
                reserve,
                bytes,
                opts.block_size,
            )
        }
    };
    ensure!(
        tokens >= opts.block_size,
        "--gpu-memory-utilization {}: no room for a KV cache on GPU {} after the weights",
        opts.gpu_memory_utilization,
        opts.ordinal
    );
    // `Model::load` counts blocks in bytes per token; translate the token count.
    let runner_opts = RunnerOptions {
        block_size: opts.block_size,
        kv_cache_bytes: tokens * all_layers_token_bytes,
        max_model_len: opts.max_model_len,
    };
    // A sequence's table spans its whole context; with layer groups keeping windows the
    // pool holds more tokens than `tokens`, so only the context limits it.
    let groups = LayerGroups::kept(
        config,
        backend.keeps_windows,
        layer_block_bytes(config, opts.block_size, backend.kv_value_bytes()),
    );
    let context = opts
        .max_model_len
        .unwrap_or(config.max_position_embeddings)
        .max(1);
    let max_tokens_per_seq = if backend.keeps_windows {
        context
    } else {
        tokens.min(context)
    };
    let max_blocks_per_seq = max_tokens_per_seq.div_ceil(opts.block_size);
    let num_groups = groups.groups.len();
    backend.reserve_step_buffers(
        opts.max_num_batched_tokens,
        opts.max_num_seqs,
        num_groups,
        max_blocks_per_seq,
        config.vocab_size,
    )?;
    let recurrent = config
        .layers
        .iter()
        .any(|l| matches!(l.mixer, Mixer::GatedDeltaNet(_)));
    let graphs = if opts.enforce_eager {
        "decode runs eagerly (--enforce-eager)".to_string()
    } else if recurrent {
        // Padding rows of a graph-captured step would run the recurrence on block 0's pages.
        "decode runs eagerly (the model has recurrent layers)".to_string()
    } else {
        backend.state()?.graphs.buckets = graph_buckets(opts.max_num_seqs);
        format!(
            "decode steps of up to {} sequences replay CUDA graphs",
            opts.max_num_seqs
        )
    };
    tracing::info!(
        "CUDA KV cache: {} tokens ({} blocks of {}), {:.2} GiB bf16; {graphs}",
        tokens,
        tokens / opts.block_size,
        opts.block_size,
        (tokens * all_layers_token_bytes) as f64 / (1u64 << 30) as f64
    );
    Ok((backend, runner_opts))
}

/// A bf16 activation matrix `[rows, cols]` in a grow-only device buffer.
#[derive(Default)]
pub struct CudaAct {
    buf: Option<CudaSlice<bf16>>,
    rows: usize,
    cols: usize,
}

impl CudaAct {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn slice(&self) -> anyhow::Result<&CudaSlice<bf16>> {
        self.buf
            .as_ref()
            .ok_or_else(|| anyhow!("activation used before it was written"))
    }
}

/// A linear weight `[rows = N, cols = K]` in bf16.
pub struct CudaWeight {
    data: CudaSlice<bf16>,
    rows: usize,
    cols: usize,
}

/// A 1-D f32 parameter.
pub struct CudaParam {
    data: CudaSlice<f32>,
    len: usize,
}

/// One layer's paged K and V, each `[num_blocks * block_size, num_kv_heads, head_dim]` bf16.
pub struct CudaKvCache {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

/// cuBLAS workspace (what PyTorch gives a handle on Hopper).
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Mutable backend state (ops take `&self`).
#[derive(Default)]
struct State {
    pending: Option<Pending>,
    part_acc: Option<CudaSlice<f32>>,
    part_ml: Option<CudaSlice<f32>>,
    experts: ExpertScratch,
    delta_net: recurrent::DeltaNetScratch,
    step: StepBuffers,
    graphs: GraphState,
}

/// Grows `buf` to hold at least `len` elements (contents are not kept).
fn ensure_len<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    len: usize,
    what: &str,
) -> anyhow::Result<bool> {
    if buf.as_ref().is_none_or(|b| b.len() < len) {
        // SAFETY: every reader of these buffers reads only what the same step wrote.
        *buf = Some(
            unsafe { stream.alloc::<T>(len.max(1)) }
                .with_context(|| format!("allocating {what}"))?,
        );
        return Ok(true);
    }
    Ok(false)
}

/// A kernel argument.
#[derive(Clone, Copy)]
enum KArg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    I64(i64),
}

/// A kernel choice: the one `named` (the preferred one only where `usable` passes), else the
/// preferred one where `usable` passes and the fallback elsewhere, logging why after `what`.
fn choose_kernel<K: Copy + PartialEq>(
    named: Option<K>,
    (preferred, fallback): (K, K),
    usable: impl Fn() -> anyhow::Result<()>,
    what: &str,
) -> anyhow::Result<K> {
    match named {
        Some(k) if k == preferred => usable().map(|()| k),
        Some(k) => Ok(k),
        None => Ok(match usable() {
            Ok(()) => preferred,
            Err(why) => {
                tracing::info!("{what}: {why:#}");
                fallback
            }
        }),
    }
}

fn int(v: usize, what: &str) -> anyhow::Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{what} = {v} does not fit a kernel's int argument"))
}

/// Rounds weight values to bf16, the storage type of every CUDA weight.
fn to_bf16(data: TensorData) -> Vec<bf16> {
    match data {
        TensorData::BF16(v) => v,
        TensorData::F16(v) => v.iter().map(|x| bf16::from_f32(x.to_f32())).collect(),
        TensorData::F32(v) => v.iter().map(|&x| bf16::from_f32(x)).collect(),
        quant @ (TensorData::Quant(..) | TensorData::QuantParts(_)) => {
            quant.to_f32().iter().map(|&x| bf16::from_f32(x)).collect()
        }
    }
}

/// The CUDA implementation of [`Backend`].
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: kernels::Kernels,
    prefill_attention: PrefillAttention,
    /// Direct until [`CudaBackend::with_decode_attention`] has raised the pipelined kernel's
    /// shared-memory limit and chosen it.
    decode_attention: DecodeAttention,
    /// The plain set, or the extended one for a model that needs it ([`KernelSet::for_model`]).
    kernel_set: KernelSet,
    num_sms: usize,
    state: Mutex<State>,
    /// Timing events for [`StepOps::record_mark`](crate::backend::StepOps::record_mark).
    marks: [CudaEvent; 3],
    /// cuBLAS's workspace, set once so that GEMMs allocate nothing while a graph is captured.
    _blas_workspace: CudaSlice<u8>,
    /// Whether attention reads a block table per layer group ([`CudaOptions::unverified_kernels`]).
    keeps_windows: bool,
    /// Whether the kernels that have never run on a GPU run ([`CudaOptions::unverified_kernels`]):
    /// the Gated DeltaNet's and its neighbours' gates (recurrent.rs).
    unverified_kernels: bool,
}

/// A kernel's name, and its sliding twin's where `set` has the twins.
fn with_twin(name: &str, set: KernelSet) -> Vec<String> {
    match set {
        KernelSet::Plain => vec![name.to_string()],
        KernelSet::Extended => vec![name.to_string(), sliding_twin(name)],
    }
}

impl CudaBackend {
    /// The GPU's compute capability (major, minor).
    fn compute_capability(&self) -> anyhow::Result<(i32, i32)> {
        self.ctx
            .compute_capability()
            .context("reading the GPU's compute capability")
    }

    /// Opens GPU `ordinal`, compiles the kernels of `set` for it and creates the cuBLAS
    /// handle.
    pub fn new(ordinal: usize, set: KernelSet) -> anyhow::Result<Self> {
        gpu_count().map_err(|why| anyhow!(why))?;
        // SAFETY: these only try to dlopen the libraries.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            bail!("--device cuda: NVRTC not found (libnvrtc.so not loadable); the kernels are compiled at start-up");
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            bail!("--device cuda: cuBLAS not found (libcublas.so not loadable)");
        }
        let ctx =
            CudaContext::new(ordinal).with_context(|| format!("opening CUDA device {ordinal}"))?;
        // SAFETY: the backend uses a single stream, so no cross-stream synchronisation is needed;
        // this must happen before any allocation. It also keeps graph capture free of event records.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().context("creating the CUDA stream")?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| anyhow!("creating the cuBLAS handle: {e:?}"))?;
        let kernels = kernels::Kernels::load(&ctx, set)?;
        for np in kernels::PREFILL_PAIRS {
            let name = format!("prefill_attention_np{np}");
            for name in with_twin(&name, set) {
                let smem = int(prefill_smem_bytes(8 * np), "prefill shared memory")?;
                kernels
                    .get(&name)?
                    .set_attribute(
                        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem,
                    )
                    .context("raising the prefill kernel's shared-memory limit")?;
            }
        }
        let num_sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .context("reading the SM count")? as usize;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".to_string());
        tracing::info!("CUDA device {ordinal}: {name}, {num_sms} SMs");
        let mut workspace = stream
            .alloc_zeros::<u8>(BLAS_WORKSPACE_BYTES)
            .context("allocating the cuBLAS workspace")?;
        let (ws, _) = workspace.device_ptr_mut(&stream);
        // SAFETY: the workspace outlives the handle (both live as long as the backend).
        let status = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                ws as *mut std::ffi::c_void,
                BLAS_WORKSPACE_BYTES,
            )
        };
        ensure!(
            status == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
            "setting the cuBLAS workspace: {status:?}"
        );
        let timed = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let marks = [timed()?, timed()?, timed()?];
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            kernels,
            prefill_attention: PrefillAttention::Scalar,
            decode_attention: DecodeAttention::Direct,
            kernel_set: set,
            num_sms,
            state: Mutex::new(State::default()),
            marks,
            _blas_workspace: workspace,
            keeps_windows: false,
            unverified_kernels: false,
        })
    }

    fn state(&self) -> anyhow::Result<MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| anyhow!("CUDA backend state lock poisoned"))
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[KArg],
    ) -> anyhow::Result<()> {
        let f = self.kernels.get(name)?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                KArg::Ptr(v) => b.arg(v),
                KArg::I32(v) => b.arg(v),
                KArg::F32(v) => b.arg(v),
                KArg::I64(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: every launch site passes the argument list of the kernel's signature in
        // kernels/*.cu, with buffers sized for the grid it launches.
        unsafe { b.launch(cfg) }.with_context(|| format!("launching kernel `{name}`"))?;
        Ok(())
    }

    /// Resizes `a` to `[rows, cols]` (growing its buffer if needed) and returns its pointer.
    fn shape(&self, a: &mut CudaAct, rows: usize, cols: usize) -> anyhow::Result<u64> {
        let need = (rows * cols).max(1);
        if a.buf.as_ref().is_none_or(|b| b.len() < need) {
            // SAFETY: every op writes the whole `[rows, cols]` region before it is read.
            a.buf = Some(
                unsafe { self.stream.alloc::<bf16>(need) }
                    .context("allocating an activation buffer")?,
            );
            self.state()?.graphs.epoch += 1;
        }
        a.rows = rows;
        a.cols = cols;
        Ok(self.ptr(a.slice()?))
    }

    /// Runs (or not) what has never run on a GPU ([`CudaOptions::unverified_kernels`]).
    pub fn set_unverified_kernels(&mut self, on: bool) {
        self.keeps_windows = on;
        self.unverified_kernels = on;
    }

    /// Uploads a row-major f32 matrix as a bf16 activation (tests and host-built inputs).
    pub fn upload_act(&self, rows: usize, cols: usize, data: &[f32]) -> anyhow::Result<CudaAct> {
        ensure!(
            data.len() == rows * cols,
            "upload_act: {} values for {rows}x{cols}",
            data.len()
        );
        let host: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
        let buf = self
            .stream
            .clone_htod(&host)
            .context("uploading an activation")?;
        Ok(CudaAct {
            buf: Some(buf),
            rows,
            cols,
        })
    }
}

impl Tensors for CudaBackend {
    type Act = CudaAct;
    type Weight = CudaWeight;
    type Param = CudaParam;
    type KvCache = CudaKvCache;
    type Step = CudaStep;
    type Experts = CudaExperts;
}

impl Backend for CudaBackend {
    fn new_act(&self) -> CudaAct {
        CudaAct::default()
    }

    fn upload_weight(&self, name: &str, tensor: HostTensor) -> anyhow::Result<CudaWeight> {
        let (rows, cols) = tensor.matrix_dims(name)?;
        let host = to_bf16(tensor.data);
        let data = self
            .stream
            .clone_htod(&host)
            .with_context(|| format!("uploading weight `{name}`"))?;
        Ok(CudaWeight { data, rows, cols })
    }

    fn upload_param(&self, name: &str, tensor: HostTensor) -> anyhow::Result<CudaParam> {
        let host = tensor.into_param(name)?;
        let len = host.len();
        let data = self
            .stream
            .clone_htod(&host)
            .with_context(|| format!("uploading parameter `{name}`"))?;
        Ok(CudaParam { data, len })
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.rows * w.cols * std::mem::size_of::<bf16>()
    }

    /// Gated DeltaNet layers, attention output gates, gated shared experts (Qwen3.5,
    /// Qwen3-Next: issue 63) and partial rotary embeddings (theirs, Phi-3's) have kernels
    /// that have never run on a GPU: refused unless --cuda-unverified-kernels. A dense
    /// clamped SwiGLU and GeGLU experts have none. Everything else the per-layer description
    /// holds runs on the kernel set chosen for the model.
    fn lacks(&self, c: &ModelConfig) -> Option<String> {
        c.layers.iter().enumerate().find_map(|(i, l)| {
            let experts = matches!(l.ffn, Ffn::Experts(_));
            // Kernels that have never run on a GPU (recurrent.rs, partial rotary in qkv_prep).
            let unverified = if matches!(l.mixer, Mixer::GatedDeltaNet(_)) {
                Some("a Gated DeltaNet layer")
            } else if l.mixer == (Mixer::Attention { output_gate: true }) {
                Some("an attention output gate")
            } else if l.shared_expert.is_some() {
                Some("a gated shared expert")
            } else if l.rope.rotary_dim != c.head_dim {
                Some("rotary embeddings on part of each head")
            } else {
                None
            };
            if let Some(what) = unverified.filter(|_| !self.unverified_kernels) {
                return Some(format!(
                    "{what} (layer {i}), whose CUDA kernels have never run on a GPU: \
                     --cuda-unverified-kernels runs them"
                ));
            }
            let missing = if experts && l.activation == Activation::GeluTanh {
                "a mixture of experts with GeGLU"
            } else if !experts && matches!(l.activation, Activation::ClampedSwiglu { .. }) {
                "a dense clamped SwiGLU"
            } else {
                return None;
            };
            Some(format!(
                "{missing} (layer {i}), which no CUDA kernel runs yet"
            ))
        })
    }

    fn to_host(&self, x: &CudaAct) -> anyhow::Result<Vec<Vec<f32>>> {
        self.flush()?;
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(vec![Vec::new(); x.rows]);
        }
        let wide = self
            .stream
            .alloc_zeros::<f32>(n)
            .context("allocating the f32 copy")?;
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(&wide)),
            KArg::I64(n as i64),
        ];
        self.launch(
            "bf16_to_f32_kernel",
            (n.div_ceil(256) as u32, 1, 1),
            256,
            0,
            &args,
        )?;
        let host = self
            .stream
            .clone_dtoh(&wide)
            .context("copying to the host")?;
        self.stream.synchronize().context("waiting for the GPU")?;
        Ok(host.chunks_exact(x.cols).map(|r| r.to_vec()).collect())
    }
}
