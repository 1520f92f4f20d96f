//! The CUDA backend: bf16 weights and activations on one GPU, f32 accumulation, GEMMs in
//! cuBLAS and the other ops in the CUDA C kernels of `kernels/` (compiled with NVRTC at
//! start-up). Needs no CUDA at build time (cudarc loads the libraries dynamically).
//!
//! Activations are bf16 (the embedding gather copies bf16 rows), so every op rounds where
//! transformers' bf16 forward rounds; logits are widened to f32 on the device before they
//! cross to the host. The Qwen3 q/k norm and RoPE are deferred until `attention`, which runs
//! them fused with the KV-cache write (one kernel); any other op first flushes them.
//! Everything runs on one stream, so cudarc's cross-stream event tracking is turned off.

mod device;
mod graph;
mod kernels;
mod sizing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{anyhow, bail, ensure, Context};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::{
    CUevent_flags, CUfunction_attribute_enum, CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg,
};
use half::bf16;

pub use device::{
    compute_flops, cuda_available, device_name, driver_present, gpu_count, memory_bandwidth,
    resolve_device, NO_DRIVER,
};
pub use graph::{bucket_for, graph_buckets, table_bucket};
pub use kernels::{
    all_kernel_names, compile_cubin, compile_source_cubin, cubin_kernels, decode_async_smem_bytes,
    decode_kernel_name, missing_kernels, nvrtc_present, prefill_fa_kernel, prefill_fa_smem_bytes,
    prefill_kernel_name, prefill_smem_bytes, program, sliding_twin, DecodeAttention, KernelSet,
    PREFILL_FA_DIMS, SOURCES,
};
pub use sizing::{activation_reserve_bytes, kv_cache_tokens, weight_bytes_bf16};

use super::{
    refuse_what_it_lacks, Backend, HostExperts, QkvLayout, RowSample, ScoreSpec, StepMeta,
};
use crate::config::{Activation, AttentionSpan, ExpertSpec, Ffn, ModelConfig, Routing};
use crate::kv_sizing::{kv_bytes_per_token, RunnerOptions};
use crate::sampler::{SampleSpec, Sampled, TopLogprobs};
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
    let backend = CudaBackend::new(opts.ordinal, KernelSet::for_model(config))?;
    // Before the KV cache is sized from the model's weights.
    refuse_what_it_lacks(&backend, config)?;
    let backend = backend
        .with_prefill_attention(opts.prefill_attention, config.head_dim)?
        .with_decode_attention(
            opts.decode_attention,
            config.num_heads / config.num_kv_heads,
            config.head_dim,
        )?;
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
            let bytes = kv_bytes_per_token(config, backend.kv_value_bytes());
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
        kv_cache_bytes: tokens * kv_bytes_per_token(config, backend.kv_value_bytes()),
        max_model_len: opts.max_model_len,
    };
    let max_blocks_per_seq = tokens
        .min(
            opts.max_model_len
                .unwrap_or(config.max_position_embeddings)
                .max(1),
        )
        .div_ceil(opts.block_size);
    backend.reserve_step_buffers(
        opts.max_num_batched_tokens,
        opts.max_num_seqs,
        max_blocks_per_seq,
        config.vocab_size,
    )?;
    let graphs = if opts.enforce_eager {
        "decode runs eagerly (--enforce-eager)".to_string()
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
        (tokens * kv_bytes_per_token(config, backend.kv_value_bytes())) as f64
            / (1u64 << 30) as f64
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

/// Offsets (in i32 words) of the step's parts inside the metadata buffer.
#[derive(Debug, Clone, Copy, Default)]
struct MetaOffsets {
    tokens: usize,
    positions: usize,
    slots: usize,
    row_start: usize,
    n_tokens: usize,
    start_pos: usize,
    dec: usize,
    tile_seq: usize,
    tile_q0: usize,
    logit_rows: usize,
    temperature: usize,
    top_k: usize,
    top_p: usize,
    min_p: usize,
    n_top: usize,
    repetition: usize,
    presence: usize,
    frequency: usize,
    /// u64 columns, at even offsets.
    seeds: usize,
    draws: usize,
    penalties: usize,
    tables: usize,
}

/// A step's metadata in the backend's one device buffer (written by one host-to-device
/// copy per step): the offsets of its parts and the sizes the launches need.
pub struct CudaStep {
    meta: u64,
    off: MetaOffsets,
    rows: usize,
    n_dec: usize,
    n_tiles: usize,
    n_logits: usize,
    n_penalties: usize,
    table_stride: usize,
    max_ctx: usize,
    block_size: usize,
    /// The graph shape this decode step runs as, if any.
    graph_key: Option<GraphKey>,
}

impl CudaStep {
    fn at(&self, off: usize) -> u64 {
        self.meta + 4 * off as u64
    }
}

/// cuBLAS workspace (what PyTorch gives a handle on Hopper).
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Words of `sample_rows`' output per row (`SAMPLE_OUT_WORDS` in sampling.cu).
const SAMPLE_OUT_WORDS: usize = 3 + 2 * SAMPLE_MAX_TOP;
/// Most top logprobs the device sampler returns (`SAMPLE_MAX_TOP`).
const SAMPLE_MAX_TOP: usize = 20;

/// Device buffers allocated at start-up and reused by every step (grown, never shrunk,
/// if a step ever needs more), with their host staging copies.
#[derive(Default)]
struct StepBuffers {
    meta: Option<CudaSlice<i32>>,
    meta_host: Vec<i32>,
    logits: Option<CudaSlice<f32>>,
    sampled: Option<CudaSlice<i32>>,
    sampled_host: Vec<i32>,
}

/// Deferred in-place work on a QKV matrix: q/k norm and RoPE, run fused by `attention`.
#[derive(Debug, Clone, Copy)]
struct Pending {
    qkv: u64,
    rows: usize,
    layout: QkvLayout,
    norm: Option<(u64, u64, f32)>,
    /// cos table, sin table, per-row positions.
    rope: Option<(u64, u64, u64)>,
}

/// Grow-only buffers of the mixture-of-experts kernels: per (token, slot) entry its expert
/// and weight, the entries grouped by expert, their gated activations and down outputs.
#[derive(Default)]
struct ExpertScratch {
    ids: Option<CudaSlice<i32>>,
    route_weights: Option<CudaSlice<f32>>,
    offsets: Option<CudaSlice<i32>>,
    order: Option<CudaSlice<i32>>,
    act: Option<CudaSlice<bf16>>,
    y: Option<CudaSlice<bf16>>,
}

/// A mixture-of-experts FFN on the device: the f32 router `[num_experts, hidden]`, each
/// expert's bf16 fused gate/up and down, and tables of their addresses for the kernels.
pub struct CudaExperts {
    router: CudaSlice<f32>,
    router_bias: Option<CudaSlice<f32>>,
    experts: Vec<(CudaWeight, CudaWeight)>,
    gate_up_ptrs: CudaSlice<u64>,
    down_ptrs: CudaSlice<u64>,
    /// Each expert's gate/up and down biases (f32), and their address tables.
    biases: Option<ExpertBiases>,
    hidden: usize,
    inter: usize,
}

/// A mixture of experts' biases on the device: the slices the tables point into, kept alive.
pub struct ExpertBiases {
    _slices: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    gate_up_ptrs: CudaSlice<u64>,
    down_ptrs: CudaSlice<u64>,
}

/// Mutable backend state (ops take `&self`).
#[derive(Default)]
struct State {
    pending: Option<Pending>,
    part_acc: Option<CudaSlice<f32>>,
    part_ml: Option<CudaSlice<f32>>,
    experts: ExpertScratch,
    step: StepBuffers,
    graphs: GraphState,
}

/// A captured graph, only ever touched under the backend's state lock.
struct LockedGraph(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialised; every use goes through `State`, behind the backend's mutex.
unsafe impl Send for LockedGraph {}

/// The shape of a graph-captured decode step: (batch bucket, table-stride bucket).
type GraphKey = (usize, usize);

/// Captured decode graphs. A graph bakes in the addresses of every buffer it touches, so
/// each reallocation of one (activations, partials, step metadata) bumps `epoch`, and the
/// graphs of an older epoch are dropped. A shape is captured the second time it is seen
/// in one epoch: the first, eager, run sizes every buffer, so nothing is allocated while
/// capturing.
#[derive(Default)]
struct GraphState {
    /// Batch buckets; empty when graphs are off (`enforce_eager`).
    buckets: Vec<usize>,
    epoch: u64,
    graphs_epoch: u64,
    /// The graph of each shape, with the width of the logits it writes.
    graphs: HashMap<GraphKey, (LockedGraph, usize)>,
    warmed: HashMap<GraphKey, u64>,
    /// Shapes whose capture failed: they run eagerly from then on.
    eager_only: std::collections::HashSet<GraphKey>,
    /// The shape being captured and the epoch the capture began in.
    capturing: Option<(GraphKey, u64)>,
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
    /// Timing events for [`Backend::record_mark`].
    marks: [CudaEvent; 3],
    /// cuBLAS's workspace, set once so that GEMMs allocate nothing while a graph is captured.
    _blas_workspace: CudaSlice<u8>,
}

/// A kernel's name, and its sliding twin's where `set` has the twins.
fn with_twin(name: &str, set: KernelSet) -> Vec<String> {
    match set {
        KernelSet::Plain => vec![name.to_string()],
        KernelSet::Extended => vec![name.to_string(), sliding_twin(name)],
    }
}

impl CudaBackend {
    /// The backend with prefill attention on `kernel` for a model of `head_dim`: a named
    /// tensor-core kernel is refused where it cannot run; `None` takes it where it can and
    /// the CUDA-core kernel elsewhere.
    pub fn with_prefill_attention(
        mut self,
        kernel: Option<PrefillAttention>,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        let (major, minor) = self.compute_capability()?;
        let mma_usable = || -> anyhow::Result<()> {
            ensure!(
                major >= 8,
                "--prefill-attention mma needs bf16 tensor cores (sm_80 or newer); this GPU is \
                 sm_{major}{minor}"
            );
            kernels::prefill_fa_kernel(head_dim, 1).map(|_| ())
        };
        self.prefill_attention = choose_kernel(
            kernel,
            (PrefillAttention::Mma, PrefillAttention::Scalar),
            mma_usable,
            "prefill attention on CUDA cores",
        )?;
        Ok(self)
    }

    /// The backend with decode attention on `kernel` for a model's GQA group size and head
    /// dim: the pipelined kernel's shared memory is raised for it (a GPU that cannot give a
    /// block that much refuses it when named); `None` takes it on sm_80 or newer where it fits
    /// (its copies overlap the compute only there) and the direct kernel elsewhere.
    pub fn with_decode_attention(
        mut self,
        kernel: Option<DecodeAttention>,
        group: usize,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        let (major, minor) = self.compute_capability()?;
        let pipelined_fits = || -> anyhow::Result<()> {
            let name = decode_kernel_name(DecodeAttention::Pipelined, group, head_dim).ok_or_else(
                || anyhow!("no decode kernel for group size {group} and head_dim {head_dim}"),
            )?;
            let smem = decode_async_smem_bytes(group, head_dim)
                .ok_or_else(|| anyhow!("no pipelined decode kernel for head_dim {head_dim}"))?;
            for name in with_twin(&name, self.kernel_set) {
                self.kernels
                    .get(&name)?
                    .set_attribute(
                        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        int(smem, "decode shared memory")?,
                    )
                    .with_context(|| {
                        format!(
                            "--decode-attention pipelined: `{name}` needs {smem} bytes of shared \
                             memory per block, more than this GPU (sm_{major}{minor}) gives"
                        )
                    })?;
            }
            Ok(())
        };
        self.decode_attention = if kernel.is_none() && major < 8 {
            DecodeAttention::Direct
        } else {
            choose_kernel(
                kernel,
                (DecodeAttention::Pipelined, DecodeAttention::Direct),
                pipelined_fits,
                "decode attention loads into registers",
            )?
        };
        Ok(self)
    }

    /// Runs an element-wise kernel of [`kernels::EXTENDED_KERNELS`] (`x`, one f32, the
    /// element count) over every value of `x`, in place.
    fn map_in_place(&self, kernel: &str, x: &mut CudaAct, value: f32) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            self.kernel_set == KernelSet::Extended,
            "{kernel}: this backend's kernels were compiled for a model that does not need it"
        );
        let n = x.rows * x.cols;
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::F32(value),
            KArg::I64(n as i64),
        ];
        self.launch(kernel, (n.div_ceil(256) as u32, 1, 1), 256, 0, &args)
    }

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

    /// Runs deferred q/k norm and RoPE (without a KV write).
    fn flush(&self) -> anyhow::Result<()> {
        let pending = self.state()?.pending.take();
        match pending {
            Some(p) => self.qkv_prep(&p, None),
            None => Ok(()),
        }
    }

    /// Queues norm or RoPE work on `qkv`, flushing work queued for another matrix or that
    /// must run first.
    fn defer(
        &self,
        qkv: u64,
        rows: usize,
        layout: QkvLayout,
        f: impl Fn(&mut Pending) -> bool,
    ) -> anyhow::Result<()> {
        let mut st = self.state()?;
        let mut p = match st.pending.take() {
            Some(p) if p.qkv == qkv && p.rows == rows && p.layout == layout => p,
            other => {
                drop(st);
                if let Some(o) = other {
                    self.qkv_prep(&o, None)?;
                }
                st = self.state()?;
                Pending {
                    qkv,
                    rows,
                    layout,
                    norm: None,
                    rope: None,
                }
            }
        };
        if !f(&mut p) {
            drop(st);
            self.qkv_prep(&p, None)?;
            st = self.state()?;
            p = Pending {
                qkv,
                rows,
                layout,
                norm: None,
                rope: None,
            };
            ensure!(f(&mut p), "cannot queue an op on a fresh QKV state");
        }
        st.pending = Some(p);
        Ok(())
    }

    /// Launches `qkv_prep` for `p`, writing K/V into `cache` at the step's slots when given.
    fn qkv_prep(
        &self,
        p: &Pending,
        write: Option<(&CudaKvCache, &CudaStep)>,
    ) -> anyhow::Result<()> {
        let l = p.layout;
        let heads = l.num_heads + 2 * l.num_kv_heads;
        let (q_w, k_w, eps) = p.norm.unwrap_or((0, 0, 0.0));
        let (cos, sin, positions) = p.rope.unwrap_or((0, 0, 0));
        let (slots, kc, vc) = match write {
            Some((c, s)) => (s.at(s.off.slots), self.ptr(&c.k), self.ptr(&c.v)),
            None => (0, 0, 0),
        };
        let args = [
            KArg::Ptr(p.qkv),
            KArg::Ptr(q_w),
            KArg::Ptr(k_w),
            KArg::F32(eps),
            KArg::I32(p.norm.is_some() as i32),
            KArg::Ptr(cos),
            KArg::Ptr(sin),
            KArg::Ptr(positions),
            KArg::I32(p.rope.is_some() as i32),
            KArg::Ptr(slots),
            KArg::Ptr(kc),
            KArg::Ptr(vc),
            KArg::I32(write.is_some() as i32),
            KArg::I32(int(l.num_heads, "num_heads")?),
            KArg::I32(int(l.num_kv_heads, "num_kv_heads")?),
            KArg::I32(int(l.head_dim, "head_dim")?),
        ];
        let grid = (int(p.rows, "rows")? as u32, heads.div_ceil(4) as u32, 1);
        self.launch("qkv_prep", grid, 128, 0, &args)
    }

    /// The expert buffers for `entries` (token, slot) entries over `num_experts` experts of
    /// width `inter` in a model of width `hidden`, grown as needed; returns the pointers of
    /// ids, weights, offsets, order, act and y.
    fn expert_scratch(
        &self,
        entries: usize,
        num_experts: usize,
        inter: usize,
        hidden: usize,
    ) -> anyhow::Result<[u64; 6]> {
        let mut st = self.state()?;
        let s = &mut st.experts;
        let stream = &self.stream;
        let mut grew = ensure_len(stream, &mut s.ids, entries, "the experts' ids")?;
        grew |= ensure_len(
            stream,
            &mut s.route_weights,
            entries,
            "the experts' weights",
        )?;
        grew |= ensure_len(
            stream,
            &mut s.offsets,
            num_experts + 1,
            "the experts' offsets",
        )?;
        grew |= ensure_len(stream, &mut s.order, entries, "the experts' entry order")?;
        grew |= ensure_len(
            stream,
            &mut s.act,
            entries * inter,
            "the experts' activations",
        )?;
        grew |= ensure_len(stream, &mut s.y, entries * hidden, "the experts' outputs")?;
        let ptrs = [
            s.ids.as_ref().map(|b| self.ptr(b)),
            s.route_weights.as_ref().map(|b| self.ptr(b)),
            s.offsets.as_ref().map(|b| self.ptr(b)),
            s.order.as_ref().map(|b| self.ptr(b)),
            s.act.as_ref().map(|b| self.ptr(b)),
            s.y.as_ref().map(|b| self.ptr(b)),
        ]
        .map(|p| p.unwrap_or(0));
        if grew {
            st.graphs.epoch += 1;
        }
        Ok(ptrs)
    }

    /// Grow-only split-K partial buffers; returns their pointers.
    fn partials(&self, acc_len: usize, ml_len: usize) -> anyhow::Result<(u64, u64)> {
        let mut st = self.state()?;
        let grew = st.part_acc.as_ref().is_none_or(|b| b.len() < acc_len)
            || st.part_ml.as_ref().is_none_or(|b| b.len() < ml_len);
        if st.part_acc.as_ref().is_none_or(|b| b.len() < acc_len) {
            // SAFETY: the decode kernel writes every partial the reduce kernel reads.
            st.part_acc = Some(
                unsafe { self.stream.alloc::<f32>(acc_len) }
                    .context("allocating attention partials")?,
            );
        }
        if st.part_ml.as_ref().is_none_or(|b| b.len() < ml_len) {
            // SAFETY: as above.
            st.part_ml = Some(
                unsafe { self.stream.alloc::<f32>(ml_len) }
                    .context("allocating attention partials")?,
            );
        }
        if grew {
            st.graphs.epoch += 1;
        }
        let a = st.part_acc.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        let m = st.part_ml.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        Ok((a, m))
    }

    /// Context splits for a decode batch: enough blocks to fill the SMs with about eight
    /// resident blocks each (a block alone cannot keep enough loads in flight), at most 32,
    /// and at least two key tiles (128 positions) per split.
    fn decode_splits(&self, num_kv_heads: usize, n_dec: usize, max_ctx: usize) -> usize {
        let base = (num_kv_heads * n_dec).max(1);
        let want = (8 * self.num_sms).div_ceil(base);
        want.clamp(1, 32).min(max_ctx.div_ceil(128).max(1))
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

    /// Sizes the step buffers for the scheduler's limits once, at start-up, so that steps
    /// within them allocate nothing.
    fn reserve_step_buffers(
        &self,
        max_tokens: usize,
        max_seqs: usize,
        max_blocks_per_seq: usize,
        vocab: usize,
    ) -> anyhow::Result<()> {
        let tiles = max_tokens.div_ceil(kernels::PREFILL_TILE) + max_seqs;
        let words = 3 * max_tokens
            + 5 * max_seqs
            + 2 * tiles
            + 18 * max_seqs
            + 2
            + max_seqs * max_blocks_per_seq;
        let mut st = self.state()?;
        let b = &mut st.step;
        ensure_len(&self.stream, &mut b.meta, words, "the step metadata buffer")?;
        b.meta_host.reserve(words);
        ensure_len(
            &self.stream,
            &mut b.logits,
            max_seqs * vocab,
            "the f32 logits buffer",
        )?;
        ensure_len(
            &self.stream,
            &mut b.sampled,
            max_seqs * SAMPLE_OUT_WORDS,
            "the sampling output buffer",
        )?;
        b.sampled_host.reserve(max_seqs * SAMPLE_OUT_WORDS);
        Ok(())
    }
}

/// Appends a column of `f32` values as their bit patterns.
fn push_f32s(m: &mut Vec<i32>, values: impl Iterator<Item = f32>) -> usize {
    let at = m.len();
    m.extend(values.map(|v| v.to_bits() as i32));
    at
}

/// Appends a column of `u64` values (two words each, at an even offset).
fn push_u64s(m: &mut Vec<i32>, values: impl Iterator<Item = u64>) -> usize {
    if m.len() % 2 == 1 {
        m.push(0);
    }
    let at = m.len();
    for v in values {
        m.push(v as u32 as i32);
        m.push((v >> 32) as u32 as i32);
    }
    at
}

/// The sparse penalty entries `(row, token, output count, flags)` of the sampled rows:
/// flag 1 = seen in prompt or output (repetition penalty), 2 = masked.
fn push_penalties(m: &mut Vec<i32>, samples: &[SampleSpec<'_>]) -> anyhow::Result<(usize, usize)> {
    let at = m.len();
    for (row, spec) in samples.iter().enumerate() {
        let row = int(row, "sampled row")?;
        // A grammar's disallowed ids are masked like the others (one entry each; this is
        // the host path of structured output, see docs/guide/engine.md).
        let disallowed = |t: u32| {
            spec.allowed
                .is_some_and(|a| t as usize >= a.len() || !a.is_allowed(t))
        };
        if let Some(allowed) = spec.allowed {
            let mut entries = Vec::new();
            allowed.iter_unset_entries(|t| entries.push(t));
            for t in entries {
                m.extend([row, int(t, "token")?, 0, 2]);
            }
        }
        // Mask lists are a few EOS and stop ids: linear checks, no per-step set.
        let masked = spec.masked;
        for (i, &t) in masked.iter().enumerate() {
            if !masked[..i].contains(&t) && !disallowed(t) {
                m.extend([row, int(t as usize, "token")?, 0, 2]);
            }
        }
        let Some(counts) = spec.counts.filter(|_| spec.has_penalties()) else {
            continue;
        };
        let rep = spec.repetition_penalty != 1.0;
        let tokens: &[u32] = if rep {
            counts.seen()
        } else {
            counts.output_tokens()
        };
        for &t in tokens
            .iter()
            .filter(|&&t| !masked.contains(&t) && !disallowed(t))
        {
            let n = int(counts.output_count(t) as usize, "token count")?;
            m.extend([row, int(t as usize, "token")?, n, rep as i32]);
        }
    }
    Ok((at, (m.len() - at) / 4))
}

/// Decodes one row of `sample_rows`' output.
fn read_sampled(w: &[i32], spec: &SampleSpec<'_>, vocab: usize) -> anyhow::Result<Sampled> {
    let token = w[0] as u32;
    ensure!(
        (token as usize) < vocab,
        "the device sampler returned token {token} (vocabulary {vocab})"
    );
    let logprobs = spec.logprobs.map(|_| {
        let found = (w[2].max(0) as usize).min(SAMPLE_MAX_TOP);
        TopLogprobs {
            logprob: f32::from_bits(w[1] as u32),
            top: (0..found)
                .map(|k| {
                    let lp = f32::from_bits(w[3 + SAMPLE_MAX_TOP + k] as u32);
                    (w[3 + k] as u32, lp)
                })
                .collect(),
        }
    });
    Ok(Sampled { token, logprobs })
}

impl Backend for CudaBackend {
    type Act = CudaAct;
    type Weight = CudaWeight;
    type Param = CudaParam;
    type KvCache = CudaKvCache;
    type Step = CudaStep;
    type Experts = CudaExperts;

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

    fn upload_experts(&self, name: &str, host: HostExperts) -> anyhow::Result<CudaExperts> {
        let HostExperts {
            router,
            router_bias,
            experts,
        } = host;
        ensure!(
            experts.iter().all(|e| e.biases.is_some())
                || experts.iter().all(|e| e.biases.is_none()),
            "{name}: some experts have biases and some not"
        );
        let router_name = format!("{name}'s router");
        let (num_experts, hidden) = router.matrix_dims(&router_name)?;
        ensure!(
            experts.len() == num_experts,
            "`{router_name}` routes to {num_experts} experts but {} were loaded",
            experts.len()
        );
        let router = self
            .stream
            .clone_htod(&router.into_f32())
            .with_context(|| format!("uploading `{router_name}`"))?;
        let router_bias = match router_bias {
            Some(b) => Some(self.upload_param(&format!("{router_name} bias"), b)?.data),
            None => None,
        };
        let mut weights = Vec::with_capacity(num_experts);
        let mut bias_slices = Vec::new();
        for (x, e) in experts.into_iter().enumerate() {
            let at = format!("{name}.mlp.experts.{x}");
            weights.push((
                self.upload_weight(&format!("{at}.gate_up"), e.gate_up)?,
                self.upload_weight(&format!("{at}.down_proj.weight"), e.down)?,
            ));
            if let Some((gate_up, down)) = e.biases {
                bias_slices.push((
                    self.upload_param(&format!("{at}.gate_up.bias"), gate_up)?
                        .data,
                    self.upload_param(&format!("{at}.down_proj.bias"), down)?
                        .data,
                ));
            }
        }
        let inter = weights.first().map_or(0, |(_, down)| down.cols);
        for (x, (gate_up, down)) in weights.iter().enumerate() {
            ensure!(
                (gate_up.rows, gate_up.cols, down.rows, down.cols)
                    == (2 * inter, hidden, hidden, inter),
                "{name}: expert {x}'s gate/up is {}x{} and its down {}x{}, where the router's \
                 width {hidden} and expert 0's down give {}x{hidden} and {hidden}x{inter}",
                gate_up.rows,
                gate_up.cols,
                down.rows,
                down.cols,
                2 * inter
            );
        }
        let table = |ptrs: Vec<u64>| {
            self.stream
                .clone_htod(&ptrs)
                .with_context(|| format!("uploading {name}'s expert address table"))
        };
        let gate_up_ptrs = table(weights.iter().map(|(g, _)| self.ptr(&g.data)).collect())?;
        let down_ptrs = table(weights.iter().map(|(_, d)| self.ptr(&d.data)).collect())?;
        let biases = if bias_slices.is_empty() {
            None
        } else {
            Some(ExpertBiases {
                gate_up_ptrs: table(bias_slices.iter().map(|(g, _)| self.ptr(g)).collect())?,
                down_ptrs: table(bias_slices.iter().map(|(_, d)| self.ptr(d)).collect())?,
                _slices: bias_slices,
            })
        };
        Ok(CudaExperts {
            router,
            router_bias,
            experts: weights,
            gate_up_ptrs,
            down_ptrs,
            biases,
            hidden,
            inter,
        })
    }

    fn expert_bytes(&self, experts: &CudaExperts) -> (usize, usize) {
        let one = experts
            .experts
            .first()
            .map_or(0, |(g, d)| self.weight_bytes(g) + self.weight_bytes(d));
        (experts.router.len() * std::mem::size_of::<f32>(), one)
    }

    fn kv_value_bytes(&self) -> usize {
        std::mem::size_of::<bf16>()
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.rows * w.cols * std::mem::size_of::<bf16>()
    }

    fn new_kv_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> anyhow::Result<CudaKvCache> {
        let n = num_blocks * block_size * num_kv_heads * head_dim;
        ensure!(
            n > 0,
            "empty KV cache ({num_blocks} blocks of {block_size})"
        );
        let k = self
            .stream
            .alloc_zeros::<bf16>(n)
            .context("allocating the K cache")?;
        let v = self
            .stream
            .alloc_zeros::<bf16>(n)
            .context("allocating the V cache")?;
        Ok(CudaKvCache {
            k,
            v,
            num_kv_heads,
            head_dim,
            block_size,
        })
    }

    fn prepare_step(&self, meta: &StepMeta<'_>) -> anyhow::Result<CudaStep> {
        let rows = meta.slots.len();
        let n_seqs = meta.seqs.len();
        let n_logits = meta.logit_rows.len();
        ensure!(
            meta.tokens.len() == rows && meta.positions.len() == rows,
            "step metadata: {} tokens and {} positions for {rows} rows",
            meta.tokens.len(),
            meta.positions.len()
        );
        ensure!(
            meta.samples.len() == n_logits,
            "{} sampling specs for {n_logits} sampled rows",
            meta.samples.len()
        );
        let longest_table = meta
            .seqs
            .iter()
            .map(|s| s.block_table.len())
            .max()
            .unwrap_or(0);
        let mut st = self.state()?;
        // A decode-only step whose every sequence samples runs as a graph shape: padded to
        // the bucket's rows and table stride (see graph.rs).
        let all_decode = n_seqs > 0 && rows == n_seqs && n_logits == n_seqs;
        let graph_key = match bucket_for(&st.graphs.buckets, n_seqs) {
            Some(b) if all_decode => Some((b, table_bucket(longest_table))),
            _ => None,
        };
        let (padded, table_stride) = graph_key.unwrap_or((rows, longest_table.max(1)));
        let pad = padded - rows;
        let m = &mut st.step.meta_host;
        m.clear();
        let mut off = MetaOffsets::default();
        m.extend(meta.tokens.iter().map(|&t| t as i32));
        m.extend(std::iter::repeat_n(0, pad));
        off.positions = m.len();
        m.extend(meta.positions.iter().map(|&p| p as i32));
        m.extend(std::iter::repeat_n(0, pad));
        off.slots = m.len();
        for &s in meta.slots {
            m.push(int(s, "KV slot")?);
        }
        m.extend(std::iter::repeat_n(-1, pad));
        off.row_start = m.len();
        for s in meta.seqs {
            m.push(int(s.row_start, "row")?);
        }
        m.extend((rows..padded).map(|r| r as i32));
        off.n_tokens = m.len();
        for s in meta.seqs {
            m.push(int(s.n_tokens, "tokens")?);
        }
        m.extend(std::iter::repeat_n(1, pad));
        off.start_pos = m.len();
        for s in meta.seqs {
            m.push(int(s.start_pos, "position")?);
        }
        m.extend(std::iter::repeat_n(0, pad));
        off.dec = m.len();
        let dec = (0..n_seqs).filter(|&i| meta.seqs[i].n_tokens == 1);
        m.extend(dec.map(|i| i as i32));
        m.extend((n_seqs..n_seqs + pad).map(|i| i as i32));
        let n_dec = m.len() - off.dec;
        let tiles = || {
            meta.seqs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.n_tokens > 1)
                .flat_map(|(i, s)| {
                    (0..s.n_tokens)
                        .step_by(kernels::PREFILL_TILE)
                        .map(move |q0| (i as i32, q0 as i32))
                })
        };
        off.tile_seq = m.len();
        m.extend(tiles().map(|(i, _)| i));
        let n_tiles = m.len() - off.tile_seq;
        off.tile_q0 = m.len();
        m.extend(tiles().map(|(_, q0)| q0));
        off.logit_rows = m.len();
        for &r in meta.logit_rows {
            m.push(int(r, "logits row")?);
        }
        m.extend((rows..padded).map(|r| r as i32));
        // Padding rows sample greedily with no logprobs; their results are never read.
        let samples = || {
            let padding = std::iter::repeat_n(SampleSpec::GREEDY, pad);
            meta.samples.iter().copied().chain(padding)
        };
        off.temperature = push_f32s(m, samples().map(|s| s.temperature));
        off.top_k = m.len();
        for s in samples() {
            m.push(int(s.top_k, "top_k")?);
        }
        off.top_p = push_f32s(m, samples().map(|s| s.top_p));
        off.min_p = push_f32s(m, samples().map(|s| s.min_p));
        off.n_top = m.len();
        for s in samples() {
            let n = s.logprobs.map_or(Ok(-1), |n| int(n, "logprobs"))?;
            ensure!(
                n <= SAMPLE_MAX_TOP as i32,
                "logprobs {n} > {SAMPLE_MAX_TOP}"
            );
            m.push(n);
        }
        off.repetition = push_f32s(m, samples().map(|s| s.repetition_penalty));
        off.presence = push_f32s(m, samples().map(|s| s.presence_penalty));
        off.frequency = push_f32s(m, samples().map(|s| s.frequency_penalty));
        off.seeds = push_u64s(m, samples().map(|s| s.seed));
        off.draws = push_u64s(m, samples().map(|s| s.draw));
        off.tables = m.len();
        for s in meta.seqs {
            for &b in s.block_table {
                m.push(int(b as usize, "block id")?);
            }
            m.extend(std::iter::repeat_n(0, table_stride - s.block_table.len()));
        }
        m.extend(std::iter::repeat_n(0, pad * table_stride));
        // Last, as their number changes from step to step (a graph's offsets must not).
        let (penalties, n_penalties) = push_penalties(m, meta.samples)?;
        off.penalties = penalties;
        let max_ctx = match graph_key {
            Some((_, t)) => t * meta.block_size,
            None => meta
                .seqs
                .iter()
                .map(|s| s.start_pos + s.n_tokens)
                .max()
                .unwrap_or(0),
        };
        let words = m.len();
        let State {
            step:
                StepBuffers {
                    meta: dev,
                    meta_host,
                    ..
                },
            graphs,
            ..
        } = &mut *st;
        // Grown to twice the need: penalty entries vary from step to step, and each
        // reallocation drops the captured graphs.
        let need = if dev.as_ref().is_none_or(|b| b.len() < words) {
            2 * words
        } else {
            words
        };
        if ensure_len(&self.stream, dev, need, "the step metadata buffer")? {
            graphs.epoch += 1;
        }
        let dev = dev
            .as_mut()
            .ok_or_else(|| anyhow!("step metadata buffer missing"))?;
        self.stream
            .memcpy_htod(meta_host.as_slice(), &mut dev.slice_mut(..words))
            .context("uploading step metadata")?;
        Ok(CudaStep {
            meta: self.ptr(dev),
            off,
            rows: padded,
            n_dec,
            n_tiles,
            n_logits: padded - (rows - n_logits),
            n_penalties,
            table_stride,
            max_ctx,
            block_size: meta.block_size,
            graph_key,
        })
    }

    fn replay_layers(&self, step: &CudaStep, logits: &mut CudaAct) -> anyhow::Result<bool> {
        let Some(key) = step.graph_key else {
            return Ok(false);
        };
        let mut st = self.state()?;
        let g = &mut st.graphs;
        if g.graphs_epoch != g.epoch {
            g.graphs.clear();
            g.graphs_epoch = g.epoch;
        }
        match g.graphs.get(&key) {
            Some((graph, vocab)) => {
                graph.0.launch().context("launching a decode graph")?;
                logits.rows = step.n_logits;
                logits.cols = *vocab;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn begin_layers(&self, step: &CudaStep) -> anyhow::Result<()> {
        let Some(key) = step.graph_key else {
            return Ok(());
        };
        let mut st = self.state()?;
        let g = &mut st.graphs;
        let epoch = g.epoch;
        if g.eager_only.contains(&key) || g.warmed.insert(key, epoch) != Some(epoch) {
            return Ok(()); // first run of this shape in this epoch: eager, sizes the buffers
        }
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .context("starting a decode graph capture")?;
        g.capturing = Some((key, epoch));
        Ok(())
    }

    fn end_layers(&self, _step: &CudaStep, logits: &CudaAct, issued: bool) -> anyhow::Result<bool> {
        let mut st = self.state()?;
        let g = &mut st.graphs;
        let Some((key, epoch)) = g.capturing.take() else {
            return Ok(true);
        };
        let graph = match self.stream.end_capture(CUgraphInstantiate_flags(0)) {
            Ok(graph) if issued => graph,
            Ok(_) => return Ok(false), // an op failed: the partial capture is dropped
            Err(e) => {
                g.eager_only.insert(key);
                tracing::warn!("decode graph {key:?} could not be captured, runs eagerly: {e:?}");
                return Ok(false);
            }
        };
        let Some(graph) = graph.filter(|_| g.epoch == epoch) else {
            // A buffer was reallocated while capturing: nothing ran, and the capture is stale.
            tracing::debug!("decode graph {key:?} discarded (a buffer moved while capturing)");
            return Ok(false);
        };
        graph.launch().context("launching a decode graph")?;
        tracing::debug!(
            "decode graph captured for batch {} and table stride {}",
            key.0,
            key.1
        );
        g.graphs.insert(key, (LockedGraph(graph), logits.cols));
        Ok(true)
    }

    fn runs_ops_as_issued(&self) -> bool {
        false
    }

    fn record_mark(&self, slot: usize) -> anyhow::Result<()> {
        let event = self
            .marks
            .get(slot)
            .ok_or_else(|| anyhow!("no timing mark {slot}"))?;
        event
            .record(&self.stream)
            .context("recording a timing event")
    }

    fn elapsed_between_marks(&self, from: usize, to: usize) -> anyhow::Result<Option<f64>> {
        let (Some(a), Some(b)) = (self.marks.get(from), self.marks.get(to)) else {
            bail!("no timing marks {from}..{to}");
        };
        let ms = a.elapsed_ms(b).context("reading timing events")?;
        Ok(Some(f64::from(ms) / 1e3))
    }

    fn embed(&self, table: &CudaWeight, step: &CudaStep, out: &mut CudaAct) -> anyhow::Result<()> {
        self.flush()?;
        let o = self.shape(out, step.rows, table.cols)?;
        if step.rows == 0 {
            return Ok(());
        }
        let args = [
            KArg::Ptr(self.ptr(&table.data)),
            KArg::Ptr(step.at(step.off.tokens)),
            KArg::Ptr(o),
            KArg::I32(int(table.cols, "hidden")?),
        ];
        self.launch(
            "embedding_gather",
            (int(step.rows, "tokens")? as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    fn matmul(
        &self,
        x: &CudaAct,
        w: &CudaWeight,
        bias: Option<&CudaParam>,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            x.cols == w.cols,
            "matmul: input width {} but the weight takes {}",
            x.cols,
            w.cols
        );
        let (m, n, k) = (x.rows, w.rows, w.cols);
        self.shape(out, m, n)?;
        // Row-major Y[m,n] = X[m,k]·W[n,k]ᵀ is column-major Yᵀ[n,m] = W·Xᵀ: op(A) = Wᵀ of the
        // column-major [k,n] view of W, B = the column-major [k,m] view of X.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: int(n, "matmul N")?,
            n: int(m, "matmul M")?,
            k: int(k, "matmul K")?,
            alpha: bf16::ONE,
            lda: int(k, "matmul K")?,
            ldb: int(k, "matmul K")?,
            beta: bf16::ZERO,
            ldc: int(n, "matmul N")?,
        };
        let xs = x.slice()?;
        let ys = out
            .buf
            .as_mut()
            .ok_or_else(|| anyhow!("matmul output not allocated"))?;
        // SAFETY: W holds n*k, X at least m*k and Y at least m*n elements (checked above).
        unsafe { self.blas.gemm(cfg, &w.data, xs, ys) }
            .map_err(|e| anyhow!("cuBLAS gemm {m}x{k}x{n}: {e:?}"))?;
        if let Some(b) = bias {
            ensure!(b.len == n, "matmul: bias of {} for {n} outputs", b.len);
            let args = [
                KArg::Ptr(self.ptr(out.slice()?)),
                KArg::Ptr(self.ptr(&b.data)),
                KArg::I32(int(n, "cols")?),
            ];
            self.launch(
                "add_bias",
                (n.div_ceil(256) as u32, int(m, "rows")? as u32, 1),
                256,
                0,
                &args,
            )?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CudaAct,
        w: &CudaParam,
        eps: f32,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            x.cols == w.len,
            "rms_norm: width {} but weight {}",
            x.cols,
            w.len
        );
        let o = self.shape(out, x.rows, x.cols)?;
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(&w.data)),
            KArg::Ptr(o),
            KArg::I32(int(x.cols, "cols")?),
            KArg::F32(eps),
        ];
        self.launch(
            "rms_norm",
            (int(x.rows, "rows")? as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaAct,
        x: &CudaAct,
        w: &CudaParam,
        eps: f32,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            residual.rows == x.rows && residual.cols == x.cols && x.cols == w.len,
            "add_rms_norm: shapes {}x{}, {}x{}, weight {}",
            residual.rows,
            residual.cols,
            x.rows,
            x.cols,
            w.len
        );
        let o = self.shape(out, x.rows, x.cols)?;
        let args = [
            KArg::Ptr(self.ptr(residual.slice()?)),
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(&w.data)),
            KArg::Ptr(o),
            KArg::I32(int(x.cols, "cols")?),
            KArg::F32(eps),
        ];
        self.launch(
            "add_rms_norm",
            (int(x.rows, "rows")? as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    fn qk_head_norm(
        &self,
        qkv: &mut CudaAct,
        layout: QkvLayout,
        q_w: &CudaParam,
        k_w: &CudaParam,
        eps: f32,
    ) -> anyhow::Result<()> {
        super::check_qk_head_norm(qkv.cols, layout, q_w.len, k_w.len, 256)?;
        let norm = (self.ptr(&q_w.data), self.ptr(&k_w.data), eps);
        self.defer(self.ptr(qkv.slice()?), qkv.rows, layout, |p| {
            let fresh = p.norm.is_none() && p.rope.is_none();
            if fresh {
                p.norm = Some(norm);
            }
            fresh
        })
    }

    fn rope(
        &self,
        qkv: &mut CudaAct,
        layout: QkvLayout,
        rotary_dim: usize,
        cos: &CudaParam,
        sin: &CudaParam,
        step: &CudaStep,
    ) -> anyhow::Result<()> {
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == step.rows,
            "rope: qkv is {}x{}",
            qkv.rows,
            qkv.cols
        );
        ensure!(
            rotary_dim == layout.head_dim,
            "rope: the kernel rotates whole heads ({}), not {rotary_dim} dimensions",
            layout.head_dim
        );
        ensure!(
            layout.head_dim <= 256,
            "rope: head_dim {} (at most 256)",
            layout.head_dim
        );
        ensure!(
            cos.len == sin.len && cos.len.is_multiple_of(layout.head_dim / 2),
            "rope: tables of {} and {} values for head_dim {}",
            cos.len,
            sin.len,
            layout.head_dim
        );
        let tables = (
            self.ptr(&cos.data),
            self.ptr(&sin.data),
            step.at(step.off.positions),
        );
        self.defer(self.ptr(qkv.slice()?), qkv.rows, layout, |p| {
            let free = p.rope.is_none();
            if free {
                p.rope = Some(tables);
            }
            free
        })
    }

    /// Partial rotary embeddings (Phi-3's) have no CUDA kernel yet, nor a dense clamped
    /// SwiGLU or GeGLU experts. Everything else the per-layer description holds runs on the
    /// kernel set chosen for the model.
    fn lacks(&self, c: &ModelConfig) -> Option<String> {
        c.layers.iter().enumerate().find_map(|(i, l)| {
            let experts = matches!(l.ffn, Ffn::Experts(_));
            let missing = if l.rope.rotary_dim != c.head_dim {
                "rotary embeddings on part of each head"
            } else if experts && l.activation == Activation::GeluTanh {
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

    fn attention(
        &self,
        qkv: &CudaAct,
        layout: QkvLayout,
        span: AttentionSpan,
        scores: ScoreSpec,
        sinks: Option<&CudaParam>,
        cache: &mut CudaKvCache,
        step: &CudaStep,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        let window = match span {
            AttentionSpan::Full => None,
            AttentionSpan::Sliding { window } => Some(int(window, "sliding window")?),
        };
        // The plain kernel, or its sliding twin with the window, the soft-cap (0 for none)
        // and the sinks (null for none) as its last arguments.
        let sinks_ptr = sinks.map_or(0, |s| self.ptr(&s.data));
        let twin = window.is_some() || scores.softcap.is_some() || sinks.is_some();
        ensure!(
            !twin || self.kernel_set == KernelSet::Extended,
            "attention: this backend's kernels were compiled for a model without sliding \
             windows, soft-capped scores or sinks"
        );
        if let Some(s) = sinks {
            ensure!(
                s.len == layout.num_heads,
                "attention: {} sinks for {} heads",
                s.len,
                layout.num_heads
            );
        }
        let kernel = |name: String| if twin { sliding_twin(&name) } else { name };
        let window_arg = |args: &mut Vec<KArg>| {
            if twin {
                args.push(KArg::I32(window.unwrap_or(0)));
                args.push(KArg::F32(scores.softcap.unwrap_or(0.0)));
                args.push(KArg::Ptr(sinks_ptr));
            }
        };
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == step.rows,
            "attention: qkv is {}x{}",
            qkv.rows,
            qkv.cols
        );
        ensure!(
            cache.num_kv_heads == layout.num_kv_heads
                && cache.head_dim == layout.head_dim
                && cache.block_size == step.block_size,
            "attention: cache layout does not match the model"
        );
        let qkv_ptr = self.ptr(qkv.slice()?);
        let queued = self.state()?.pending.take();
        let prep = match queued {
            Some(p) if p.qkv == qkv_ptr && p.rows == qkv.rows && p.layout == layout => p,
            other => {
                if let Some(o) = other {
                    self.qkv_prep(&o, None)?;
                }
                Pending {
                    qkv: qkv_ptr,
                    rows: qkv.rows,
                    layout,
                    norm: None,
                    rope: None,
                }
            }
        };
        self.qkv_prep(&prep, Some((cache, step)))?;

        let (h, kvh, d) = (layout.num_heads, layout.num_kv_heads, layout.head_dim);
        let o = self.shape(out, qkv.rows, layout.q_width())?;
        let at = |off: usize| KArg::Ptr(step.at(off));
        let scale = scores.scale;
        let common = |v: &mut Vec<KArg>| {
            v.push(KArg::Ptr(qkv_ptr));
            v.push(KArg::I32(layout.qkv_width() as i32));
            v.push(KArg::Ptr(self.ptr(&cache.k)));
            v.push(KArg::Ptr(self.ptr(&cache.v)));
            v.push(at(step.off.tables));
            v.push(KArg::I32(step.table_stride as i32));
        };
        if step.n_dec > 0 {
            let kind = self.decode_attention;
            let name = decode_kernel_name(kind, layout.group_size(), d).ok_or_else(|| {
                anyhow!(
                    "no decode kernel for {} query heads per KV head and head_dim {d}",
                    layout.group_size()
                )
            })?;
            let name = kernel(name);
            // A windowed query reads at most its window.
            let keys = window.map_or(step.max_ctx, |w| step.max_ctx.min(w as usize));
            let splits = self.decode_splits(kvh, step.n_dec, keys);
            let (pa, pm) =
                self.partials(step.n_dec * h * splits * d, step.n_dec * h * splits * 2)?;
            let mut args = Vec::with_capacity(20);
            common(&mut args);
            args.extend([
                at(step.off.dec),
                at(step.off.row_start),
                at(step.off.n_tokens),
                at(step.off.start_pos),
            ]);
            args.extend([
                KArg::Ptr(pa),
                KArg::Ptr(pm),
                KArg::Ptr(o),
                KArg::I32(int(layout.q_width(), "q width")?),
            ]);
            args.extend([
                KArg::I32(h as i32),
                KArg::I32(kvh as i32),
                KArg::I32(d as i32),
            ]);
            args.extend([
                KArg::I32(int(step.block_size, "block size")?),
                KArg::I32(splits as i32),
                KArg::F32(scale),
            ]);
            window_arg(&mut args);
            let grid = (
                kvh as u32,
                int(step.n_dec, "decode seqs")? as u32,
                splits as u32,
            );
            let smem = match kind {
                DecodeAttention::Direct => 0,
                DecodeAttention::Pipelined => int(
                    decode_async_smem_bytes(layout.group_size(), d)
                        .ok_or_else(|| anyhow!("no pipelined decode kernel for head_dim {d}"))?,
                    "decode shared memory",
                )? as u32,
            };
            self.launch(&name, grid, kernels::DECODE_THREADS, smem, &args)?;
            if splits > 1 {
                let args = [
                    KArg::Ptr(pa),
                    KArg::Ptr(pm),
                    at(step.off.dec),
                    at(step.off.row_start),
                    KArg::Ptr(o),
                    KArg::I32(layout.q_width() as i32),
                    KArg::I32(h as i32),
                    KArg::I32(d as i32),
                    KArg::I32(splits as i32),
                    KArg::Ptr(sinks_ptr),
                ];
                self.launch(
                    "paged_decode_reduce",
                    (h as u32, step.n_dec as u32, 1),
                    128,
                    0,
                    &args,
                )?;
            }
        }
        if step.n_tiles > 0 {
            let (name, threads, smem) = match self.prefill_attention {
                PrefillAttention::Scalar => (
                    prefill_kernel_name(d)
                        .ok_or_else(|| anyhow!("no prefill kernel for head_dim {d}"))?,
                    kernels::PREFILL_THREADS,
                    prefill_smem_bytes(d),
                ),
                PrefillAttention::Mma => {
                    let (name, threads) = kernels::prefill_fa_kernel(d, layout.group_size())?;
                    (name, threads, kernels::prefill_fa_smem_bytes(d))
                }
            };
            // The tensor-core kernel's block holds its heads' query rows (two heads of a group).
            let heads_per_block = match self.prefill_attention {
                PrefillAttention::Mma => threads as usize / 64,
                PrefillAttention::Scalar => 1,
            };
            let mut args = Vec::with_capacity(18);
            common(&mut args);
            args.extend([
                at(step.off.tile_seq),
                at(step.off.tile_q0),
                at(step.off.row_start),
                at(step.off.n_tokens),
                at(step.off.start_pos),
            ]);
            args.extend([
                KArg::Ptr(o),
                KArg::I32(layout.q_width() as i32),
                KArg::I32(h as i32),
                KArg::I32(kvh as i32),
                KArg::I32(d as i32),
            ]);
            args.extend([KArg::I32(step.block_size as i32), KArg::F32(scale)]);
            window_arg(&mut args);
            let grid = (
                int(step.n_tiles, "prefill tiles")? as u32,
                (h / heads_per_block) as u32,
                1,
            );
            self.launch(&kernel(name), grid, threads, smem as u32, &args)?;
        }
        Ok(())
    }

    /// Routes on the device (`moe_route`), groups the entries by expert (`moe_group`), runs
    /// each expert's gate/up with SwiGLU and its down over its entries (`moe_gate_up`,
    /// `moe_down`: one warp per output row, a matrix-vector product per entry on CUDA cores,
    /// written for correctness first), and sums each token's slots (`moe_combine`). No host
    /// synchronisation: graphs capture it.
    fn experts_ffn(
        &self,
        x: &CudaAct,
        experts: &CudaExperts,
        spec: ExpertSpec,
        act: Activation,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            self.kernel_set == KernelSet::Extended,
            "experts_ffn: this backend's kernels were compiled for a model without experts"
        );
        // moe_gate_up's activation: SwiGLU (a limit of 0) or the clamped SwiGLU.
        let (alpha, limit) = match act {
            Activation::Silu => (0.0, 0.0),
            Activation::ClampedSwiglu { alpha, limit } => {
                ensure!(limit > 0.0, "experts_ffn: a clamped SwiGLU's limit {limit}");
                (alpha, limit)
            }
            Activation::GeluTanh => bail!("experts_ffn: GeGLU experts have no CUDA kernel"),
        };
        let (renormalise, top_k_first) = match spec.routing {
            Routing::SoftmaxTopK { renormalise } => (renormalise, false),
            Routing::TopKSoftmax => (false, true),
        };
        ensure!(
            (1..=spec.num_experts).contains(&spec.top_k),
            "experts_ffn: top_k {} is not between 1 and the {} experts",
            spec.top_k,
            spec.num_experts
        );
        ensure!(
            x.cols == experts.hidden
                && spec.num_experts == experts.experts.len()
                && spec.intermediate_size == experts.inter,
            "experts_ffn: input width {} and {} experts of width {} for a layer of {} experts \
             of width {} over {}",
            x.cols,
            spec.num_experts,
            spec.intermediate_size,
            experts.experts.len(),
            experts.inter,
            experts.hidden
        );
        let (rows, h, e, k, inter) = (
            x.rows,
            experts.hidden,
            spec.num_experts,
            spec.top_k,
            experts.inter,
        );
        let entries = rows * k;
        let [ids, weights, offsets, order, act_buf, y] =
            self.expert_scratch(entries, e, inter, h)?;
        let xp = self.ptr(x.slice()?);
        let out_ptr = self.shape(out, rows, h)?;
        let (hi, ei, ki, ii) = (
            int(h, "hidden")?,
            int(e, "experts")?,
            int(k, "top_k")?,
            int(inter, "expert width")?,
        );
        // An address table of the experts' biases, null without them.
        let bias_table = |which: fn(&ExpertBiases) -> &CudaSlice<u64>| {
            experts.biases.as_ref().map_or(0, |b| self.ptr(which(b)))
        };
        // One f32 (moe_route's scores) or i32 (moe_group's cursors) per expert.
        let smem = int(4 * e, "expert shared memory")? as u32;
        let rows_u = int(rows, "rows")? as u32;
        self.launch(
            "moe_route",
            (rows_u, 1, 1),
            128,
            smem,
            &[
                KArg::Ptr(xp),
                KArg::Ptr(self.ptr(&experts.router)),
                KArg::Ptr(experts.router_bias.as_ref().map_or(0, |b| self.ptr(b))),
                KArg::Ptr(ids),
                KArg::Ptr(weights),
                KArg::I32(hi),
                KArg::I32(ei),
                KArg::I32(ki),
                KArg::I32(renormalise as i32),
                KArg::I32(top_k_first as i32),
            ],
        )?;
        self.launch(
            "moe_group",
            (1, 1, 1),
            1024,
            smem,
            &[
                KArg::Ptr(ids),
                KArg::I32(int(entries, "expert entries")?),
                KArg::I32(ei),
                KArg::Ptr(offsets),
                KArg::Ptr(order),
            ],
        )?;
        self.launch(
            "moe_gate_up",
            (inter.div_ceil(8) as u32, e as u32, 1),
            256,
            0,
            &[
                KArg::Ptr(xp),
                KArg::Ptr(self.ptr(&experts.gate_up_ptrs)),
                KArg::Ptr(bias_table(|b| &b.gate_up_ptrs)),
                KArg::Ptr(offsets),
                KArg::Ptr(order),
                KArg::Ptr(act_buf),
                KArg::I32(hi),
                KArg::I32(ii),
                KArg::I32(ki),
                KArg::F32(alpha),
                KArg::F32(limit),
            ],
        )?;
        self.launch(
            "moe_down",
            (h.div_ceil(8) as u32, e as u32, 1),
            256,
            0,
            &[
                KArg::Ptr(act_buf),
                KArg::Ptr(self.ptr(&experts.down_ptrs)),
                KArg::Ptr(bias_table(|b| &b.down_ptrs)),
                KArg::Ptr(offsets),
                KArg::Ptr(order),
                KArg::Ptr(y),
                KArg::I32(hi),
                KArg::I32(ii),
            ],
        )?;
        self.launch(
            "moe_combine",
            (h.div_ceil(256) as u32, rows_u, 1),
            256,
            0,
            &[
                KArg::Ptr(y),
                KArg::Ptr(weights),
                KArg::Ptr(out_ptr),
                KArg::I32(hi),
                KArg::I32(ki),
            ],
        )
    }

    fn gated_activation(
        &self,
        gate_up: &CudaAct,
        act: Activation,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        let kernel = match act {
            Activation::Silu => "silu_mul",
            Activation::GeluTanh => {
                ensure!(
                    self.kernel_set == KernelSet::Extended,
                    "gated_activation: this backend's kernels were compiled for a model \
                     without GeGLU"
                );
                "gelu_tanh_mul"
            }
            Activation::ClampedSwiglu { .. } => {
                bail!("gated_activation: the clamped SwiGLU has no CUDA kernel yet")
            }
        };
        ensure!(
            gate_up.cols.is_multiple_of(2),
            "gated_activation: odd width {}",
            gate_up.cols
        );
        let inter = gate_up.cols / 2;
        let o = self.shape(out, gate_up.rows, inter)?;
        let args = [
            KArg::Ptr(self.ptr(gate_up.slice()?)),
            KArg::Ptr(o),
            KArg::I32(int(inter, "intermediate")?),
        ];
        self.launch(
            kernel,
            (
                inter.div_ceil(256) as u32,
                int(gate_up.rows, "rows")? as u32,
                1,
            ),
            256,
            0,
            &args,
        )
    }

    fn scale(&self, x: &mut CudaAct, factor: f32) -> anyhow::Result<()> {
        self.map_in_place("scale_bf16", x, factor)
    }

    fn softcap(&self, x: &mut CudaAct, cap: f32) -> anyhow::Result<()> {
        ensure!(cap > 0.0, "softcap: cap {cap}");
        self.map_in_place("softcap_bf16", x, cap)
    }

    fn gather_logit_rows(
        &self,
        x: &CudaAct,
        step: &CudaStep,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(x.rows == step.rows, "gather_logit_rows: {} rows", x.rows);
        let o = self.shape(out, step.n_logits, x.cols)?;
        if step.n_logits == 0 {
            return Ok(());
        }
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(step.at(step.off.logit_rows)),
            KArg::Ptr(o),
            KArg::I32(int(x.cols, "cols")?),
        ];
        self.launch(
            "gather_rows",
            (int(step.n_logits, "rows")? as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    fn sample(
        &self,
        logits: &mut CudaAct,
        samples: &[SampleSpec<'_>],
        step: &CudaStep,
    ) -> anyhow::Result<Vec<RowSample>> {
        self.flush()?;
        // A graph-replayed step leaves `logits` as the graph wrote it: `n_logits` rows (the
        // real ones first, then padding), whatever the host-side shape says.
        let (rows, vocab) = (samples.len(), logits.cols);
        ensure!(
            step.n_logits >= rows && logits.slice()?.len() >= step.n_logits * vocab,
            "sample: {rows} specs for {} step rows",
            step.n_logits
        );
        if rows == 0 {
            return Ok(Vec::new());
        }
        let mut st = self.state()?;
        let b = &mut st.step;
        ensure_len(
            &self.stream,
            &mut b.logits,
            rows * vocab,
            "the f32 logits buffer",
        )?;
        ensure_len(
            &self.stream,
            &mut b.sampled,
            rows * SAMPLE_OUT_WORDS,
            "the sampling output buffer",
        )?;
        let wide = b.logits.as_ref().map(|l| self.ptr(l)).unwrap_or(0);
        let out = b.sampled.as_ref().map(|l| self.ptr(l)).unwrap_or(0);
        let n = rows * vocab;
        self.launch(
            "bf16_to_f32_kernel",
            (n.div_ceil(256) as u32, 1, 1),
            256,
            0,
            &[
                KArg::Ptr(self.ptr(logits.slice()?)),
                KArg::Ptr(wide),
                KArg::I64(n as i64),
            ],
        )?;
        let vocab_arg = int(vocab, "vocab")?;
        if step.n_penalties > 0 {
            self.launch(
                "apply_penalties",
                (step.n_penalties.div_ceil(256) as u32, 1, 1),
                256,
                0,
                &[
                    KArg::Ptr(wide),
                    KArg::I32(vocab_arg),
                    KArg::Ptr(step.at(step.off.penalties)),
                    KArg::I32(int(step.n_penalties, "penalty entries")?),
                    KArg::Ptr(step.at(step.off.repetition)),
                    KArg::Ptr(step.at(step.off.presence)),
                    KArg::Ptr(step.at(step.off.frequency)),
                ],
            )?;
        }
        self.launch(
            "sample_rows",
            (int(rows, "rows")? as u32, 1, 1),
            kernels::SAMPLE_THREADS,
            0,
            &[
                KArg::Ptr(wide),
                KArg::I32(vocab_arg),
                KArg::Ptr(step.at(step.off.temperature)),
                KArg::Ptr(step.at(step.off.top_k)),
                KArg::Ptr(step.at(step.off.top_p)),
                KArg::Ptr(step.at(step.off.min_p)),
                KArg::Ptr(step.at(step.off.seeds)),
                KArg::Ptr(step.at(step.off.draws)),
                KArg::Ptr(step.at(step.off.n_top)),
                KArg::Ptr(out),
            ],
        )?;
        let words = rows * SAMPLE_OUT_WORDS;
        let StepBuffers {
            sampled,
            sampled_host,
            ..
        } = b;
        sampled_host.resize(words, 0);
        let dev = sampled
            .as_ref()
            .ok_or_else(|| anyhow!("sampling output buffer missing"))?;
        self.stream
            .memcpy_dtoh(&dev.slice(..words), sampled_host.as_mut_slice())
            .context("copying sampled tokens to the host")?;
        self.stream.synchronize().context("waiting for the GPU")?;
        Ok(sampled_host
            .chunks_exact(SAMPLE_OUT_WORDS)
            .zip(samples)
            .map(|(w, spec)| read_sampled(w, spec, vocab))
            .collect())
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
