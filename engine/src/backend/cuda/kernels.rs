//! The CUDA C kernels of `kernels/`, compiled once per GPU architecture with NVRTC.
//!
//! The four files are concatenated into one program (`common.cuh` first), so the PTX of an
//! architecture is one module. Compiled PTX is cached in memory per architecture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Context};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

/// The kernel sources, in program order, with their file names.
pub const SOURCES: [(&str, &str); 4] = [
    (
        "kernels/common.cuh",
        include_str!("../../../../kernels/common.cuh"),
    ),
    (
        "kernels/elementwise.cu",
        include_str!("../../../../kernels/elementwise.cu"),
    ),
    (
        "kernels/attention.cu",
        include_str!("../../../../kernels/attention.cu"),
    ),
    (
        "kernels/sampling.cu",
        include_str!("../../../../kernels/sampling.cu"),
    ),
];

/// Group sizes (query heads per KV head) the decode kernel is instantiated for.
pub const DECODE_GROUPS: [usize; 4] = [1, 2, 4, 8];
/// bf16 pairs per lane the decode kernel is instantiated for (head_dim <= 64 * pairs).
pub const DECODE_PAIRS: [usize; 3] = [1, 2, 4];
/// Dim pairs per thread the prefill kernel is instantiated for (head_dim <= 8 * pairs).
pub const PREFILL_PAIRS: [usize; 4] = [4, 8, 16, 32];
/// Query rows and key rows per prefill tile (`PF_BQ`, `PF_BK` in attention.cu).
pub const PREFILL_TILE: usize = 32;
/// Threads per prefill block (`PF_THREADS`).
pub const PREFILL_THREADS: u32 = 128;
/// Threads per decode block (`32 * DEC_WARPS`).
pub const DECODE_THREADS: u32 = 128;
/// Threads per sampling block (`SAMPLE_THREADS`).
pub const SAMPLE_THREADS: u32 = 1024;

/// The fixed-name kernels.
pub const FIXED_KERNELS: [&str; 10] = [
    "embedding_gather",
    "rms_norm",
    "add_rms_norm",
    "qkv_prep",
    "add_bias",
    "silu_mul",
    "gather_rows",
    "bf16_to_f32_kernel",
    "paged_decode_reduce",
    "sample_rows",
];

/// The decode kernel for a GQA group size and head dim, if instantiated.
pub fn decode_kernel_name(group: usize, head_dim: usize) -> Option<String> {
    let g = DECODE_GROUPS.iter().copied().find(|&g| g >= group)?;
    let p = DECODE_PAIRS.iter().copied().find(|&p| 64 * p >= head_dim)?;
    Some(format!("paged_decode_g{g}_p{p}"))
}

/// The prefill kernel for a head dim, if instantiated.
pub fn prefill_kernel_name(head_dim: usize) -> Option<String> {
    let p = PREFILL_PAIRS.iter().copied().find(|&p| 8 * p >= head_dim)?;
    Some(format!("prefill_attention_np{p}"))
}

/// Dynamic shared memory of the prefill kernel: q, k and v tiles of `head_dim + 2` bf16
/// per row, and the `[32][33]` f32 probability tile.
pub fn prefill_smem_bytes(head_dim: usize) -> usize {
    3 * PREFILL_TILE * (head_dim + 2) * 2 + PREFILL_TILE * (PREFILL_TILE + 1) * 4
}

/// Every kernel name the backend may load.
pub fn all_kernel_names() -> Vec<String> {
    let mut names: Vec<String> = FIXED_KERNELS.iter().map(|s| s.to_string()).collect();
    for g in DECODE_GROUPS {
        for p in DECODE_PAIRS {
            names.push(format!("paged_decode_g{g}_p{p}"));
        }
    }
    names.extend(
        PREFILL_PAIRS
            .iter()
            .map(|p| format!("prefill_attention_np{p}")),
    );
    names
}

/// The whole program text.
pub fn program() -> String {
    SOURCES
        .iter()
        .map(|(name, src)| format!("// ---- {name}\n{src}\n"))
        .collect()
}

fn ptx_cache() -> &'static Mutex<HashMap<(i32, i32), Ptx>> {
    static CACHE: OnceLock<Mutex<HashMap<(i32, i32), Ptx>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles (or takes from the cache) the PTX for compute capability `cc`.
fn ptx_for(cc: (i32, i32)) -> anyhow::Result<Ptx> {
    let mut cache = ptx_cache()
        .lock()
        .map_err(|_| anyhow!("PTX cache lock poisoned"))?;
    if let Some(ptx) = cache.get(&cc) {
        return Ok(ptx.clone());
    }
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
            "-std=c++17".to_string(),
        ],
        use_fast_math: Some(false),
        name: Some("engine_kernels.cu".to_string()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(program(), opts).map_err(|e| {
        anyhow!(
            "NVRTC failed to compile kernels/*.cu for sm_{}{}: {e:?}",
            cc.0,
            cc.1
        )
    })?;
    cache.insert(cc, ptx.clone());
    Ok(ptx)
}

/// The loaded kernels of one context, by name.
pub struct Kernels {
    functions: HashMap<String, CudaFunction>,
    _module: Arc<CudaModule>,
}

impl Kernels {
    /// Compiles for the context's device and loads every kernel.
    pub fn load(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        let cc = ctx
            .compute_capability()
            .context("reading the GPU's compute capability")?;
        let module = ctx
            .load_module(ptx_for(cc)?)
            .context("loading the kernels' PTX")?;
        let mut functions = HashMap::new();
        for name in all_kernel_names() {
            let f = module
                .load_function(&name)
                .with_context(|| format!("kernel `{name}` missing from the PTX"))?;
            functions.insert(name, f);
        }
        Ok(Kernels {
            functions,
            _module: module,
        })
    }

    /// A kernel by name.
    pub fn get(&self, name: &str) -> anyhow::Result<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| anyhow!("kernel `{name}` is not loaded"))
    }
}
