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

use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{anyhow, bail, ensure, Context};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use half::bf16;

pub use device::{cuda_available, driver_present, gpu_count, resolve_device, Device, NO_DRIVER};
pub use graph::{bucket_for, graph_buckets};
pub use kernels::{
    all_kernel_names, decode_kernel_name, prefill_kernel_name, prefill_smem_bytes, SOURCES,
};
pub use sizing::{
    activation_reserve_bytes, kv_bytes_per_token_bf16, kv_cache_tokens, weight_bytes_bf16,
};

use super::{Backend, QkvLayout, StepMeta};
use crate::config::ModelConfig;
use crate::model::{kv_bytes_per_token, Model, ModelRunner, RunnerOptions};
use crate::weights::{HostTensor, TensorData, WeightSource};

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
    /// Run decode steps eagerly. CUDA-graph capture is not implemented yet, so every step
    /// runs eagerly whatever this says; the flag is accepted so the CLI contract is stable.
    pub enforce_eager: bool,
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
        }
    }
}

/// Loads a model onto a GPU and sizes its bf16 KV cache from free memory; fails with
/// [`NO_DRIVER`] (never panics) on a machine without a CUDA driver.
pub fn load_cuda_runner(
    config: &ModelConfig,
    weights: &mut dyn WeightSource,
    opts: &CudaOptions,
) -> anyhow::Result<Box<dyn ModelRunner>> {
    let gpus = gpu_count().map_err(|why| anyhow!(why))?;
    ensure!(
        opts.ordinal < gpus,
        "--device cuda: GPU {} requested but the driver reports {gpus}",
        opts.ordinal
    );
    ensure!(opts.block_size > 0, "KV block size must be positive");
    let backend = CudaBackend::new(opts.ordinal)?;
    let tokens = match opts.kv_cache_tokens {
        Some(t) => t / opts.block_size * opts.block_size,
        None => {
            let (free, total) = backend
                .ctx
                .mem_get_info()
                .context("reading free GPU memory")?;
            let weights_bytes = weight_bytes_bf16(config, weights.contains("lm_head.weight"));
            let reserve =
                activation_reserve_bytes(config, opts.max_num_batched_tokens, opts.max_num_seqs);
            let bytes = kv_bytes_per_token_bf16(config);
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
    // `Model::load` counts blocks in its own (f32) bytes per token; translate the token count.
    let runner_opts = RunnerOptions {
        block_size: opts.block_size,
        kv_cache_bytes: tokens * kv_bytes_per_token(config),
    };
    let model = Model::load(backend, config, weights, &runner_opts)?;
    tracing::info!(
        "CUDA KV cache: {} tokens ({} blocks of {}), {:.2} GiB bf16; decode runs eagerly",
        tokens,
        tokens / opts.block_size,
        opts.block_size,
        (tokens * kv_bytes_per_token_bf16(config)) as f64 / (1u64 << 30) as f64
    );
    Ok(Box::new(model))
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

/// Offsets (in i32 elements) of the step metadata inside [`CudaStep::meta`].
#[derive(Debug, Clone, Copy, Default)]
struct MetaOffsets {
    slots: usize,
    row_start: usize,
    n_tokens: usize,
    start_pos: usize,
    dec: usize,
    tile_seq: usize,
    tile_q0: usize,
    tables: usize,
}

/// The device copy of a step's metadata: one i32 buffer (slots, per-sequence rows,
/// decode list, prefill tiles, padded block tables) and one f32 buffer (cos then sin).
pub struct CudaStep {
    meta: CudaSlice<i32>,
    rope: CudaSlice<f32>,
    off: MetaOffsets,
    rows: usize,
    n_dec: usize,
    n_tiles: usize,
    table_stride: usize,
    max_ctx: usize,
    block_size: usize,
}

/// Deferred in-place work on a QKV matrix: q/k norm and RoPE, run fused by `attention`.
#[derive(Debug, Clone, Copy)]
struct Pending {
    qkv: u64,
    rows: usize,
    layout: QkvLayout,
    norm: Option<(u64, u64, f32)>,
    rope: Option<(u64, u64)>,
}

/// Mutable backend state (ops take `&self`).
#[derive(Default)]
struct State {
    pending: Option<Pending>,
    part_acc: Option<CudaSlice<f32>>,
    part_ml: Option<CudaSlice<f32>>,
}

/// A kernel argument.
enum KArg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    I64(i64),
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
    }
}

/// The CUDA implementation of [`Backend`].
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: kernels::Kernels,
    num_sms: usize,
    state: Mutex<State>,
}

impl CudaBackend {
    /// Opens GPU `ordinal`, compiles the kernels for it and creates the cuBLAS handle.
    pub fn new(ordinal: usize) -> anyhow::Result<Self> {
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
        let kernels = kernels::Kernels::load(&ctx)?;
        for np in kernels::PREFILL_PAIRS {
            let f = kernels.get(&format!("prefill_attention_np{np}"))?;
            let smem = int(prefill_smem_bytes(8 * np), "prefill shared memory")?;
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem,
            )
            .context("raising the prefill kernel's shared-memory limit")?;
        }
        let num_sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .context("reading the SM count")? as usize;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".to_string());
        tracing::info!("CUDA device {ordinal}: {name}, {num_sms} SMs");
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            kernels,
            num_sms,
            state: Mutex::new(State::default()),
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
        let (cos, sin) = p.rope.unwrap_or((0, 0));
        let (slots, kc, vc) = match write {
            Some((c, s)) => (
                self.ptr(&s.meta) + 4 * s.off.slots as u64,
                self.ptr(&c.k),
                self.ptr(&c.v),
            ),
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

    /// Grow-only split-K partial buffers; returns their pointers.
    fn partials(&self, acc_len: usize, ml_len: usize) -> anyhow::Result<(u64, u64)> {
        let mut st = self.state()?;
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
        let a = st.part_acc.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        let m = st.part_ml.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        Ok((a, m))
    }

    /// Context splits for a decode batch: enough blocks for two waves over the SMs, at
    /// most 32, and at least 64 positions per split.
    fn decode_splits(&self, num_kv_heads: usize, n_dec: usize, max_ctx: usize) -> usize {
        let base = (num_kv_heads * n_dec).max(1);
        let want = (2 * self.num_sms).div_ceil(base);
        want.clamp(1, 32).min(max_ctx.div_ceil(64).max(1))
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

    /// Samples one token per logits row on the device (see kernels/sampling.cu); only the
    /// ids cross to the host.
    pub fn sample(&self, logits: &CudaAct, params: &[GpuSampling]) -> anyhow::Result<Vec<u32>> {
        self.flush()?;
        ensure!(
            params.len() == logits.rows,
            "sample: {} parameter sets for {} logits rows",
            params.len(),
            logits.rows
        );
        if params.is_empty() {
            return Ok(Vec::new());
        }
        let temps = self.upload_column(params, |p| p.temperature)?;
        let top_k = self.upload_column(params, |p| p.top_k)?;
        let top_p = self.upload_column(params, |p| p.top_p)?;
        let min_p = self.upload_column(params, |p| p.min_p)?;
        let seeds = self.upload_column(params, |p| p.seed)?;
        let offsets = self.upload_column(params, |p| p.offset)?;
        let out = self.stream.alloc_zeros::<u32>(params.len())?;
        let args = [
            KArg::Ptr(self.ptr(logits.slice()?)),
            KArg::I32(int(logits.cols, "vocab")?),
            KArg::Ptr(self.ptr(&temps)),
            KArg::Ptr(self.ptr(&top_k)),
            KArg::Ptr(self.ptr(&top_p)),
            KArg::Ptr(self.ptr(&min_p)),
            KArg::Ptr(self.ptr(&seeds)),
            KArg::Ptr(self.ptr(&offsets)),
            KArg::Ptr(self.ptr(&out)),
        ];
        self.launch(
            "sample_rows",
            (int(params.len(), "rows")? as u32, 1, 1),
            kernels::SAMPLE_THREADS,
            0,
            &args,
        )?;
        let ids = self.stream.clone_dtoh(&out)?;
        self.stream.synchronize()?;
        Ok(ids)
    }

    /// Copies one field of every row's sampling settings to the device.
    fn upload_column<T: DeviceRepr>(
        &self,
        params: &[GpuSampling],
        field: impl Fn(&GpuSampling) -> T,
    ) -> anyhow::Result<CudaSlice<T>> {
        let host: Vec<T> = params.iter().map(field).collect();
        Ok(self.stream.clone_htod(&host)?)
    }
}

/// Per-row sampling settings for [`CudaBackend::sample`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSampling {
    /// `<= 0` samples greedily.
    pub temperature: f32,
    /// `<= 0` disables top-k.
    pub top_k: i32,
    /// `>= 1` disables top-p.
    pub top_p: f32,
    /// `<= 0` disables min-p.
    pub min_p: f32,
    /// The request's seed.
    pub seed: u64,
    /// Distinguishes the request's successive draws (e.g. its number of generated tokens).
    pub offset: u64,
}

impl Backend for CudaBackend {
    type Act = CudaAct;
    type Weight = CudaWeight;
    type Param = CudaParam;
    type KvCache = CudaKvCache;
    type Step = CudaStep;

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
        let table_stride = meta
            .seqs
            .iter()
            .map(|s| s.block_table.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let dec: Vec<usize> = (0..n_seqs)
            .filter(|&i| meta.seqs[i].n_tokens == 1)
            .collect();
        let mut tiles = Vec::new();
        for (i, s) in meta.seqs.iter().enumerate().filter(|(_, s)| s.n_tokens > 1) {
            tiles.extend(
                (0..s.n_tokens)
                    .step_by(kernels::PREFILL_TILE)
                    .map(|q0| (i, q0)),
            );
        }
        let mut off = MetaOffsets::default();
        let mut m: Vec<i32> = Vec::with_capacity(
            rows + 3 * n_seqs + dec.len() + 2 * tiles.len() + n_seqs * table_stride,
        );
        off.slots = m.len();
        for &s in meta.slots {
            m.push(int(s, "KV slot")?);
        }
        off.row_start = m.len();
        for s in meta.seqs {
            m.push(int(s.row_start, "row")?);
        }
        off.n_tokens = m.len();
        for s in meta.seqs {
            m.push(int(s.n_tokens, "tokens")?);
        }
        off.start_pos = m.len();
        for s in meta.seqs {
            m.push(int(s.start_pos, "position")?);
        }
        off.dec = m.len();
        m.extend(dec.iter().map(|&i| i as i32));
        off.tile_seq = m.len();
        m.extend(tiles.iter().map(|&(i, _)| i as i32));
        off.tile_q0 = m.len();
        m.extend(tiles.iter().map(|&(_, q0)| q0 as i32));
        off.tables = m.len();
        for s in meta.seqs {
            for &b in s.block_table {
                m.push(int(b as usize, "block id")?);
            }
            m.extend(std::iter::repeat_n(0, table_stride - s.block_table.len()));
        }
        let mut rope = Vec::with_capacity(2 * meta.rope_cos.len());
        rope.extend_from_slice(meta.rope_cos);
        rope.extend_from_slice(meta.rope_sin);
        rope.push(0.0);
        let max_ctx = meta
            .seqs
            .iter()
            .map(|s| s.start_pos + s.n_tokens)
            .max()
            .unwrap_or(0);
        Ok(CudaStep {
            meta: self
                .stream
                .clone_htod(&m)
                .context("uploading step metadata")?,
            rope: self
                .stream
                .clone_htod(&rope)
                .context("uploading RoPE tables")?,
            off,
            rows,
            n_dec: dec.len(),
            n_tiles: tiles.len(),
            table_stride,
            max_ctx,
            block_size: meta.block_size,
        })
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32], out: &mut CudaAct) -> anyhow::Result<()> {
        self.flush()?;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows) {
            bail!("token id {t} is outside the vocabulary ({})", table.rows);
        }
        let dev = self
            .stream
            .clone_htod(tokens)
            .context("uploading token ids")?;
        let o = self.shape(out, tokens.len(), table.cols)?;
        let args = [
            KArg::Ptr(self.ptr(&table.data)),
            KArg::Ptr(self.ptr(&dev)),
            KArg::Ptr(o),
            KArg::I32(int(table.cols, "hidden")?),
        ];
        self.launch(
            "embedding_gather",
            (int(tokens.len(), "tokens")? as u32, 1, 1),
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

    fn rope(&self, qkv: &mut CudaAct, layout: QkvLayout, step: &CudaStep) -> anyhow::Result<()> {
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == step.rows,
            "rope: qkv is {}x{}",
            qkv.rows,
            qkv.cols
        );
        ensure!(
            layout.head_dim <= 256,
            "rope: head_dim {} (at most 256)",
            layout.head_dim
        );
        let half = step.rows * layout.head_dim / 2;
        ensure!(
            step.rope.len() == 2 * half + 1,
            "rope: tables do not match {} rows of head_dim {}",
            step.rows,
            layout.head_dim
        );
        let base = self.ptr(&step.rope);
        let tables = (base, base + 4 * half as u64);
        self.defer(self.ptr(qkv.slice()?), qkv.rows, layout, |p| {
            let free = p.rope.is_none();
            if free {
                p.rope = Some(tables);
            }
            free
        })
    }

    fn attention(
        &self,
        qkv: &CudaAct,
        layout: QkvLayout,
        cache: &mut CudaKvCache,
        step: &CudaStep,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
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
        let meta = self.ptr(&step.meta);
        let at = |off: usize| KArg::Ptr(meta + 4 * off as u64);
        let scale = 1.0 / (d as f32).sqrt();
        let common = |v: &mut Vec<KArg>| {
            v.push(KArg::Ptr(qkv_ptr));
            v.push(KArg::I32(layout.qkv_width() as i32));
            v.push(KArg::Ptr(self.ptr(&cache.k)));
            v.push(KArg::Ptr(self.ptr(&cache.v)));
            v.push(at(step.off.tables));
            v.push(KArg::I32(step.table_stride as i32));
        };
        if step.n_dec > 0 {
            let name = decode_kernel_name(layout.group_size(), d).ok_or_else(|| {
                anyhow!(
                    "no decode kernel for {} query heads per KV head and head_dim {d}",
                    layout.group_size()
                )
            })?;
            let splits = self.decode_splits(kvh, step.n_dec, step.max_ctx);
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
            let grid = (
                kvh as u32,
                int(step.n_dec, "decode seqs")? as u32,
                splits as u32,
            );
            self.launch(&name, grid, kernels::DECODE_THREADS, 0, &args)?;
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
            let name = prefill_kernel_name(d)
                .ok_or_else(|| anyhow!("no prefill kernel for head_dim {d}"))?;
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
            let grid = (int(step.n_tiles, "prefill tiles")? as u32, h as u32, 1);
            self.launch(
                &name,
                grid,
                kernels::PREFILL_THREADS,
                prefill_smem_bytes(d) as u32,
                &args,
            )?;
        }
        Ok(())
    }

    fn silu_mul(&self, gate_up: &CudaAct, out: &mut CudaAct) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(
            gate_up.cols.is_multiple_of(2),
            "silu_mul: odd width {}",
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
            "silu_mul",
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

    fn gather_rows(&self, x: &CudaAct, rows: &[usize], out: &mut CudaAct) -> anyhow::Result<()> {
        self.flush()?;
        if let Some(&r) = rows.iter().find(|&&r| r >= x.rows) {
            bail!("gather_rows: row {r} of {}", x.rows);
        }
        let o = self.shape(out, rows.len(), x.cols)?;
        if rows.is_empty() {
            return Ok(());
        }
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let dev = self
            .stream
            .clone_htod(&idx)
            .context("uploading row indices")?;
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(self.ptr(&dev)),
            KArg::Ptr(o),
            KArg::I32(int(x.cols, "cols")?),
        ];
        self.launch(
            "gather_rows",
            (int(rows.len(), "rows")? as u32, 1, 1),
            256,
            0,
            &args,
        )
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
