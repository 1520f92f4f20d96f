//! The CUDA C kernels of `kernels/`, compiled once per GPU architecture with NVRTC.
//!
//! The five files are concatenated into one program (`common.cuh` first) and compiled for the
//! GPU's real architecture (`sm_XY`) to a cubin, which the driver loads as is (no PTX JIT at
//! load time). The cubin is cached in memory per compute capability. [`compile_cubin`] is
//! the same compilation without a GPU (`engine/tests/nvrtc.rs` runs it).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use crate::config::{Activation, AttentionSpan, Ffn, LayerSpec, Mixer, ModelConfig};
use anyhow::{anyhow, bail, ensure, Context};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::result as nvrtc;
use cudarc::nvrtc::sys as nvrtc_sys;
use cudarc::nvrtc::Ptx;

/// The kernel sources, in program order, with their file names.
pub const SOURCES: [(&str, &str); 8] = [
    (
        "kernels/common.cuh",
        include_str!("../../../../kernels/common.cuh"),
    ),
    (
        "kernels/elementwise.cu",
        include_str!("../../../../kernels/elementwise.cu"),
    ),
    (
        "kernels/attention_decode.cu",
        include_str!("../../../../kernels/attention_decode.cu"),
    ),
    (
        "kernels/attention_prefill.cu",
        include_str!("../../../../kernels/attention_prefill.cu"),
    ),
    (
        "kernels/attention_mma.cu",
        include_str!("../../../../kernels/attention_mma.cu"),
    ),
    (
        "kernels/sampling.cu",
        include_str!("../../../../kernels/sampling.cu"),
    ),
    (
        "kernels/experts.cu",
        include_str!("../../../../kernels/experts.cu"),
    ),
    (
        "kernels/delta_net.cu",
        include_str!("../../../../kernels/delta_net.cu"),
    ),
];

/// Group sizes (query heads per KV head) the decode kernel is instantiated for.
pub const DECODE_GROUPS: [usize; 4] = [1, 2, 4, 8];
/// Lanes per key the decode kernel is instantiated for: each lane holds 8 dims, so
/// `head_dim <= 8 * lanes` (and a multiple of 8).
pub const DECODE_LANES: [usize; 4] = [2, 8, 16, 32];
/// Dim pairs per thread the prefill kernel is instantiated for (head_dim <= 8 * pairs).
pub const PREFILL_PAIRS: [usize; 4] = [4, 8, 16, 32];
/// Head dims the tensor-core prefill kernel is instantiated for
/// (`prefill_attention_fa_d*_h*`), each with one or two query heads a block.
pub const PREFILL_FA_DIMS: [usize; 4] = [16, 32, 64, 128];
/// Query rows and key rows per prefill tile (`PF_BQ`, `PF_BK` in attention_prefill.cu).
pub const PREFILL_TILE: usize = 32;
/// Threads per prefill block (`PF_THREADS`).
pub const PREFILL_THREADS: u32 = 128;
/// Threads per decode block (`32 * DEC_WARPS`).
pub const DECODE_THREADS: u32 = 128;
/// Threads per sampling block (`SAMPLE_THREADS`).
pub const SAMPLE_THREADS: u32 = 1024;

/// The fixed-name kernels.
pub const FIXED_KERNELS: [&str; 11] = [
    "embedding_gather",
    "rms_norm",
    "add_rms_norm",
    "qkv_prep",
    "add_bias",
    "silu_mul",
    "gather_rows",
    "bf16_to_f32_kernel",
    "paged_decode_reduce",
    "apply_penalties",
    "sample_rows",
];

/// The fixed-name kernels of [`KernelSet::Extended`] (besides the sliding twins).
pub const EXTENDED_KERNELS: [&str; 18] = [
    "gelu_tanh_mul",
    "scale_bf16",
    "softcap_bf16",
    "moe_route",
    "moe_group",
    "moe_gate_up",
    "moe_down",
    "moe_combine",
    "delta_net_conv",
    "delta_net_prep",
    "delta_net_recurrence_dk16",
    "delta_net_recurrence_dk32",
    "delta_net_recurrence_dk64",
    "delta_net_recurrence_dk128",
    "delta_net_gated_norm",
    "copy_state_pages",
    "sigmoid_gate_bf16",
    "add_gated_bf16",
];

/// Which kernel computes decode attention. Unless one is named, the pipelined kernel runs on
/// sm_80 or newer and the direct one elsewhere. Both passed the GPU tests and transformers'
/// logprobs on an H100; `ncu` there read the pipelined one 5% faster at batch 64 x 512
/// (57% of HBM peak against 54%) and at 78% of HBM peak at batch 256 x 1024, and bench.py's
/// workload ran at 15,146 and 15,462 tok/s on it against 13,810 and 14,105 on the direct one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DecodeAttention {
    /// `paged_decode_g*`: each tile's K and V rows loaded into registers, then used (nothing
    /// in flight while a tile is computed).
    Direct,
    /// `paged_decode_async_g*`: the rows copied into shared memory with cp.async, two tiles
    /// ahead of the one computed (below sm_80 the copies are plain loads: correct, not
    /// overlapped).
    Pipelined,
}

/// The decode kernel of `kind` for a GQA group size and head dim, if instantiated.
pub fn decode_kernel_name(kind: DecodeAttention, group: usize, head_dim: usize) -> Option<String> {
    let g = DECODE_GROUPS.iter().copied().find(|&g| g >= group)?;
    if !head_dim.is_multiple_of(8) {
        return None;
    }
    let k = decode_lanes(head_dim)?;
    Some(match kind {
        DecodeAttention::Direct => format!("paged_decode_g{g}_k{k}"),
        DecodeAttention::Pipelined => format!("paged_decode_async_g{g}_k{k}"),
    })
}

/// Lanes per key of the decode kernels for a head dim (8 dims per lane).
fn decode_lanes(head_dim: usize) -> Option<usize> {
    DECODE_LANES.iter().copied().find(|&k| 8 * k >= head_dim)
}

/// Dynamic shared memory of the pipelined decode kernel for a GQA group size and head dim:
/// `DA_STAGES` (3) tiles of K and of V rows (tiles of `DA_TILE` = 32 keys, or the keys one
/// pass scores where that is more; rows of `8 * lanes` bf16), or the key groups' f32
/// accumulators that reuse those bytes at the end, whichever is larger.
pub fn decode_async_smem_bytes(group: usize, head_dim: usize) -> Option<usize> {
    let g = DECODE_GROUPS.iter().copied().find(|&g| g >= group)?;
    let lanes = decode_lanes(head_dim)?;
    let per_pass = DECODE_THREADS as usize / lanes;
    let tile = per_pass.max(32);
    let stages = 3 * 2 * tile * 8 * lanes * 2;
    let accumulators = per_pass * g * 8 * lanes * 4;
    Some(stages.max(accumulators))
}

/// The prefill kernel for a head dim, if instantiated.
pub fn prefill_kernel_name(head_dim: usize) -> Option<String> {
    let p = PREFILL_PAIRS.iter().copied().find(|&p| 8 * p >= head_dim)?;
    Some(format!("prefill_attention_np{p}"))
}

/// The tensor-core prefill kernel for a head dim and GQA group size: two query
/// heads a block where the group size is even, else one; its threads (64 a head).
pub fn prefill_fa_kernel(head_dim: usize, group: usize) -> anyhow::Result<(String, u32)> {
    ensure!(
        PREFILL_FA_DIMS.contains(&head_dim),
        "--prefill-attention mma: no tensor-core kernel for head_dim {head_dim} (it has \
         {PREFILL_FA_DIMS:?})"
    );
    let heads = if group.is_multiple_of(2) { 2 } else { 1 };
    Ok((
        format!("prefill_attention_fa_d{head_dim}_h{heads}"),
        64 * heads as u32,
    ))
}

/// Dynamic shared memory of the tensor-core prefill kernel: two stages of k and v
/// tiles (`PFA_BK` keys: 64 up to head dim 64, 32 above) of `head_dim + 8` bf16 a row.
pub fn prefill_fa_smem_bytes(head_dim: usize) -> usize {
    let keys = if head_dim <= 64 { 64 } else { 32 };
    2 * 2 * keys * (head_dim + 8) * 2
}

/// Dynamic shared memory of the prefill kernel: q, k and v tiles of `head_dim + 2` bf16
/// per row, and the `[32][33]` f32 probability tile.
pub fn prefill_smem_bytes(head_dim: usize) -> usize {
    3 * PREFILL_TILE * (head_dim + 2) * 2 + PREFILL_TILE * (PREFILL_TILE + 1) * 4
}

/// The sliding-window twin of an attention kernel (`kernels/attention*.cu`): the same
/// arguments and two last ones, the window (0: none) and the score soft-cap (0: none).
pub fn sliding_twin(name: &str) -> String {
    format!("{name}_sliding")
}

/// Which kernels a program is compiled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSet {
    /// What every model runs.
    Plain,
    /// The plain set and what only some families need (`-DEXTENDED_KERNELS`): the sliding
    /// twins (windows, soft-capped scores and sinks), `gelu_tanh_mul`, `scale_bf16`,
    /// `softcap_bf16`, the mixture-of-experts kernels (`kernels/experts.cu`) and the Gated
    /// DeltaNet's with its neighbours' gates (`kernels/delta_net.cu`). Compiled only for a model that needs them ([`KernelSet::for_model`]),
    /// so that start-up compiles no more for the others.
    Extended,
}

impl KernelSet {
    /// The set `c` runs on: [`KernelSet::Extended`] for sliding windows, soft-capped scores
    /// or logits, attention sinks, activations other than SwiGLU, scaled embeddings or
    /// experts, Gated DeltaNet layers, output gates or shared experts (windowed Mistral, Qwen2
    /// and Phi-3; Gemma 2 and 3; Qwen3-MoE; gpt-oss; Qwen3.5 and Qwen3-Next).
    pub fn for_model(c: &ModelConfig) -> KernelSet {
        let layer_needs = |l: &LayerSpec| {
            l.attention != AttentionSpan::Full
                || l.attn_softcap.is_some()
                || l.sinks
                || l.activation != Activation::Silu
                || matches!(l.ffn, Ffn::Experts(_))
                || l.mixer != (Mixer::Attention { output_gate: false })
                || l.shared_expert.is_some()
        };
        if c.embedding_scale != 1.0
            || c.final_logit_softcap.is_some()
            || c.layers.iter().any(layer_needs)
        {
            KernelSet::Extended
        } else {
            KernelSet::Plain
        }
    }
}

/// Every kernel name the backend may load from a program of `set`.
pub fn all_kernel_names(set: KernelSet) -> Vec<String> {
    let mut attention = Vec::new();
    for g in DECODE_GROUPS {
        for k in DECODE_LANES {
            attention.push(format!("paged_decode_g{g}_k{k}"));
            attention.push(format!("paged_decode_async_g{g}_k{k}"));
        }
    }
    attention.extend(
        PREFILL_PAIRS
            .iter()
            .map(|p| format!("prefill_attention_np{p}")),
    );
    for d in PREFILL_FA_DIMS {
        for heads in [1, 2] {
            attention.push(format!("prefill_attention_fa_d{d}_h{heads}"));
        }
    }
    let twins: Vec<String> = match set {
        KernelSet::Plain => Vec::new(),
        KernelSet::Extended => attention
            .iter()
            .map(|n| sliding_twin(n))
            .chain(EXTENDED_KERNELS.iter().map(|n| n.to_string()))
            .collect(),
    };
    let mut names: Vec<String> = FIXED_KERNELS.iter().map(|s| s.to_string()).collect();
    names.extend(attention);
    names.extend(twins);
    names
}

/// The whole program text. Each file starts with a `#line` directive, so NVRTC's messages
/// name the file and line of `kernels/` an error is on.
pub fn program() -> String {
    SOURCES
        .iter()
        .map(|(name, src)| format!("#line 1 \"{name}\"\n{src}\n"))
        .collect()
}

/// The NVRTC options the program of `set` is compiled with, for a real architecture such
/// as `sm_90`.
pub fn compile_options(arch: &str, set: KernelSet) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
    ];
    if set == KernelSet::Extended {
        options.push("-DEXTENDED_KERNELS".to_string());
    }
    options
}

/// An NVRTC program, destroyed on drop.
struct NvrtcProgram(nvrtc_sys::nvrtcProgram);

impl Drop for NvrtcProgram {
    fn drop(&mut self) {
        // SAFETY: the program came from `create_program` and is destroyed only here.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// NVRTC's log of a compiled (or failed) program, without the trailing NUL.
fn program_log(prog: &NvrtcProgram) -> String {
    // SAFETY: `prog` is a live program.
    match unsafe { nvrtc::get_program_log(prog.0) } {
        Ok(log) => {
            let bytes: Vec<u8> = log.iter().map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes)
                .trim_end_matches('\0')
                .trim_end()
                .to_string()
        }
        Err(e) => format!("(NVRTC's log could not be read: {e:?})"),
    }
}

/// Whether libnvrtc (CUDA 13, `libnvrtc.so.13` or `libnvrtc.so`) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: loading and unloading the library runs its initialisers only.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Compiles [`program`] with [`compile_options`] for a real architecture (`"sm_90"`) and
/// returns the cubin (an ELF image the driver loads without JIT). A compile error carries
/// NVRTC's log, which names the file and line of each error.
pub fn compile_cubin(arch: &str, set: KernelSet) -> anyhow::Result<Vec<u8>> {
    compile_source_cubin(&program(), arch, set)
}

/// [`compile_cubin`] for another program text (tests: a broken source must fail with
/// NVRTC's log).
pub fn compile_source_cubin(source: &str, arch: &str, set: KernelSet) -> anyhow::Result<Vec<u8>> {
    if !nvrtc_present() {
        bail!(
            "libnvrtc could not be loaded (looked for {:?} on the loader's search path); \
             `source scripts/nvrtc-env.sh` installs NVRTC 13 and sets LD_LIBRARY_PATH",
            cudarc::get_lib_name_candidates("nvrtc")
        );
    }
    let src = CString::new(source).context("kernel sources contain a NUL byte")?;
    let name = CString::new("engine_kernels.cu").expect("no NUL in the name");
    let options = compile_options(arch, set);
    let prog = NvrtcProgram(
        nvrtc::create_program(&src, Some(&name))
            .map_err(|e| anyhow!("nvrtcCreateProgram failed: {e:?}"))?,
    );
    // SAFETY: `prog` is live; `src` and `name` outlive it (dropped after it, declared first).
    if let Err(e) = unsafe { nvrtc::compile_program(prog.0, &options) } {
        bail!(
            "NVRTC failed to compile kernels/*.cu for {arch} ({:?}, options {options:?}):\n{}",
            e.0,
            program_log(&prog)
        );
    }
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| anyhow!("nvrtcGetCUBINSize for {arch} failed: {e:?}"))?;
    ensure!(
        size > 0,
        "NVRTC produced no cubin for {arch} (is it a real architecture such as sm_90?)"
    );
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| anyhow!("nvrtcGetCUBIN for {arch} failed: {e:?}"))?;
    drop(prog);
    Ok(cubin)
}

/// Compiled cubins by compute capability and kernel set.
type CubinCache = Mutex<HashMap<((i32, i32), KernelSet), Vec<u8>>>;

fn cubin_cache() -> &'static CubinCache {
    static CACHE: OnceLock<CubinCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles (or takes from the cache) the cubin of `set` for compute capability `cc`.
fn cubin_for(cc: (i32, i32), set: KernelSet) -> anyhow::Result<Vec<u8>> {
    let mut cache = cubin_cache()
        .lock()
        .map_err(|_| anyhow!("cubin cache lock poisoned"))?;
    if let Some(cubin) = cache.get(&(cc, set)) {
        return Ok(cubin.clone());
    }
    let cubin = compile_cubin(&format!("sm_{}{}", cc.0, cc.1), set)?;
    cache.insert((cc, set), cubin.clone());
    Ok(cubin)
}

/// The kernels (entry points) a cubin defines, in symbol-table order: its `.symtab` entries
/// of type `STT_FUNC` that have a section and carry `STO_CUDA_ENTRY` (`0x10` in `st_other`;
/// device functions that are not inlined are local `$kernel$name` symbols without it). Only
/// 64-bit little-endian ELF is read (every cubin is); anything else, or a truncated image,
/// is an error.
pub fn cubin_kernels(elf: &[u8]) -> anyhow::Result<Vec<String>> {
    const SHT_SYMTAB: u32 = 2;
    const STT_FUNC: u8 = 2;
    const STO_CUDA_ENTRY: u8 = 0x10;
    const SHN_UNDEF: u16 = 0;
    const SYM_SIZE: usize = 24;
    const SHDR_SIZE: usize = 64;

    fn bytes(elf: &[u8], at: usize, n: usize) -> anyhow::Result<&[u8]> {
        at.checked_add(n)
            .and_then(|end| elf.get(at..end))
            .ok_or_else(|| anyhow!("ELF image truncated: {n} bytes at offset {at}"))
    }
    fn u16_at(elf: &[u8], at: usize) -> anyhow::Result<u16> {
        Ok(u16::from_le_bytes(bytes(elf, at, 2)?.try_into()?))
    }
    fn u32_at(elf: &[u8], at: usize) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(bytes(elf, at, 4)?.try_into()?))
    }
    fn usize_at(elf: &[u8], at: usize) -> anyhow::Result<usize> {
        let v = u64::from_le_bytes(bytes(elf, at, 8)?.try_into()?);
        usize::try_from(v).map_err(|_| anyhow!("ELF offset {v} out of range"))
    }

    ensure!(
        elf.get(..4) == Some(b"\x7fELF".as_slice()),
        "not an ELF image"
    );
    ensure!(
        elf.get(4..6) == Some([2u8, 1].as_slice()),
        "not a 64-bit little-endian ELF image"
    );
    let shoff = usize_at(elf, 0x28)?;
    let shentsize = usize::from(u16_at(elf, 0x3a)?);
    let shnum = usize::from(u16_at(elf, 0x3c)?);
    ensure!(
        shentsize >= SHDR_SIZE,
        "ELF section header size {shentsize} < {SHDR_SIZE}"
    );
    let section = |i: usize| -> anyhow::Result<usize> {
        let at = i
            .checked_mul(shentsize)
            .and_then(|o| o.checked_add(shoff))
            .ok_or_else(|| anyhow!("ELF section header {i} out of range"))?;
        bytes(elf, at, SHDR_SIZE)?;
        Ok(at)
    };
    let mut names = Vec::new();
    let mut symtabs = 0;
    for i in 0..shnum {
        let sh = section(i)?;
        if u32_at(elf, sh + 4)? != SHT_SYMTAB {
            continue;
        }
        symtabs += 1;
        let (offset, size) = (usize_at(elf, sh + 24)?, usize_at(elf, sh + 32)?);
        let entsize = match usize_at(elf, sh + 56)? {
            0 => SYM_SIZE,
            n => n,
        };
        ensure!(
            entsize >= SYM_SIZE,
            "ELF symbol size {entsize} < {SYM_SIZE}"
        );
        let symbols = bytes(elf, offset, size)?;
        // The string table of the symbols is the section named by sh_link.
        let strtab = section(u32_at(elf, sh + 40)? as usize)?;
        let strings = bytes(
            elf,
            usize_at(elf, strtab + 24)?,
            usize_at(elf, strtab + 32)?,
        )?;
        for sym in symbols.chunks_exact(entsize) {
            let (info, other) = (sym[4], sym[5]);
            let shndx = u16::from_le_bytes([sym[6], sym[7]]);
            if info & 0xf != STT_FUNC || other & STO_CUDA_ENTRY == 0 || shndx == SHN_UNDEF {
                continue;
            }
            let name_at = u32::from_le_bytes(sym[..4].try_into()?) as usize;
            let name = strings
                .get(name_at..)
                .and_then(|s| s.split(|&b| b == 0).next())
                .ok_or_else(|| anyhow!("ELF symbol name offset {name_at} out of range"))?;
            names.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    ensure!(symtabs > 0, "ELF image has no symbol table");
    Ok(names)
}

/// The names of [`all_kernel_names`] of `set` the cubin does not define as kernels; every
/// name when the cubin cannot be read (see [`cubin_kernels`]).
pub fn missing_kernels(cubin: &[u8], set: KernelSet) -> Vec<String> {
    let defined = cubin_kernels(cubin).unwrap_or_default();
    all_kernel_names(set)
        .into_iter()
        .filter(|name| !defined.contains(name))
        .collect()
}

/// The loaded kernels of one context, by name.
pub struct Kernels {
    functions: HashMap<String, CudaFunction>,
    _module: Arc<CudaModule>,
}

impl Kernels {
    /// Compiles the kernels of `set` for the context's device and loads every one.
    pub fn load(ctx: &Arc<CudaContext>, set: KernelSet) -> anyhow::Result<Self> {
        let cc = ctx
            .compute_capability()
            .context("reading the GPU's compute capability")?;
        let cubin = cubin_for(cc, set)?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin.clone()))
            .with_context(|| format!("loading the kernels' cubin for sm_{}{}", cc.0, cc.1))?;
        let mut functions = HashMap::new();
        for name in all_kernel_names(set) {
            let f = module.load_function(&name).with_context(|| {
                format!(
                    "kernel `{name}` missing from the cubin (all missing: {:?})",
                    missing_kernels(&cubin, set)
                )
            })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A symbol for [`elf_with_symbols`]: name, `st_info`, `st_other`, `st_shndx`.
    type Sym<'a> = (&'a str, u8, u8, u16);

    const FUNC_GLOBAL: u8 = 0x12; // STB_GLOBAL << 4 | STT_FUNC
    const FUNC_LOCAL: u8 = 0x02; // STB_LOCAL << 4 | STT_FUNC
    const OBJECT_GLOBAL: u8 = 0x11; // STB_GLOBAL << 4 | STT_OBJECT
    const SECTION_LOCAL: u8 = 0x03; // STB_LOCAL << 4 | STT_SECTION
    const ENTRY: u8 = 0x10; // STO_CUDA_ENTRY

    /// A minimal 64-bit little-endian ELF image: sections null, .strtab, .symtab (linked to
    /// .strtab), .shstrtab, with `syms` after the null symbol.
    fn elf_with_symbols(syms: &[Sym]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; 24];
        for &(name, info, other, shndx) in syms {
            let name_at = strtab.len() as u32;
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
            symtab.extend_from_slice(&name_at.to_le_bytes());
            symtab.push(info);
            symtab.push(other);
            symtab.extend_from_slice(&shndx.to_le_bytes());
            symtab.extend_from_slice(&[0u8; 16]);
        }
        let shstrtab = b"\0.strtab\0.symtab\0.shstrtab\0".to_vec();
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2; // ELFCLASS64
        elf[5] = 1; // ELFDATA2LSB
        elf[6] = 1; // EV_CURRENT
        let strtab_at = elf.len();
        elf.extend_from_slice(&strtab);
        let symtab_at = elf.len();
        elf.extend_from_slice(&symtab);
        let shstrtab_at = elf.len();
        elf.extend_from_slice(&shstrtab);
        let shoff = elf.len();
        // (name, type, offset, size, link, entsize)
        let headers: [(u32, u32, usize, usize, u32, u64); 4] = [
            (0, 0, 0, 0, 0, 0),
            (1, 3, strtab_at, strtab.len(), 0, 0),
            (9, 2, symtab_at, symtab.len(), 1, 24),
            (17, 3, shstrtab_at, shstrtab.len(), 0, 0),
        ];
        for (name, ty, offset, size, link, entsize) in headers {
            let mut sh = [0u8; 64];
            sh[..4].copy_from_slice(&name.to_le_bytes());
            sh[4..8].copy_from_slice(&ty.to_le_bytes());
            sh[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
            sh[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            sh[40..44].copy_from_slice(&link.to_le_bytes());
            sh[56..64].copy_from_slice(&entsize.to_le_bytes());
            elf.extend_from_slice(&sh);
        }
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&3u16.to_le_bytes());
        elf
    }

    #[test]
    fn cubin_kernels_lists_defined_entry_points_only() {
        // The symbols of a cubin NVRTC 13 wrote for sm_90, and ones it must not count.
        let elf = elf_with_symbols(&[
            (".text.rms_norm", SECTION_LOCAL, 0, 5),
            ("$rms_norm$block_sum", FUNC_LOCAL, 0, 5),
            ("$__internal_0_$__cuda_sm20_rcp_rn_f32_slowpath", 0x22, 0, 6),
            ("rms_norm", FUNC_GLOBAL, ENTRY, 5),
            ("sample_rows_smem", OBJECT_GLOBAL, 0, 6),
            ("vprintf", FUNC_GLOBAL, 0, 0),
            ("extern_entry", FUNC_GLOBAL, ENTRY, 0),
            ("helper", FUNC_GLOBAL, 0, 7),
            ("silu_mul", FUNC_GLOBAL, ENTRY, 7),
        ]);
        assert_eq!(cubin_kernels(&elf).unwrap(), ["rms_norm", "silu_mul"]);
    }

    #[test]
    fn missing_kernels_names_what_is_not_a_defined_function() {
        let all = all_kernel_names(KernelSet::Plain);
        let mut syms: Vec<Sym> = all
            .iter()
            .map(|n| (n.as_str(), FUNC_GLOBAL, ENTRY, 3))
            .collect();
        assert!(missing_kernels(&elf_with_symbols(&syms), KernelSet::Plain).is_empty());
        // The extended set adds a sliding twin per attention kernel and its own kernels.
        let extended = missing_kernels(&elf_with_symbols(&syms), KernelSet::Extended);
        assert_eq!(
            extended.len(),
            all.len() - FIXED_KERNELS.len() + EXTENDED_KERNELS.len(),
            "{extended:?}"
        );
        assert!(
            extended
                .iter()
                .all(|n| n.ends_with("_sliding") || EXTENDED_KERNELS.contains(&n.as_str())),
            "{extended:?}"
        );

        // A kernel that is absent, one that is only referenced, one that is data, one that
        // is a device function, and a name that only a longer symbol starts with.
        let gone = [
            "rms_norm",
            "silu_mul",
            "sample_rows",
            "gather_rows",
            "paged_decode_g8_k32",
        ];
        syms.retain(|(n, ..)| !gone.contains(n));
        syms.push(("silu_mul", FUNC_GLOBAL, ENTRY, 0));
        syms.push(("sample_rows", OBJECT_GLOBAL, 0, 3));
        syms.push(("gather_rows", FUNC_GLOBAL, 0, 3));
        syms.push(("paged_decode_g8_k32_tail", FUNC_GLOBAL, ENTRY, 3));
        let missing = missing_kernels(&elf_with_symbols(&syms), KernelSet::Plain);
        let mut expected = gone.to_vec();
        expected.sort_by_key(|n| all.iter().position(|a| a == n));
        assert_eq!(missing, expected);
    }

    #[test]
    fn unreadable_images_are_errors_not_panics() {
        let elf = elf_with_symbols(&[("rms_norm", FUNC_GLOBAL, ENTRY, 5)]);
        for len in 0..elf.len() {
            assert!(cubin_kernels(&elf[..len]).is_err(), "truncated to {len}");
        }
        assert!(cubin_kernels(b"// PTX\n.version 9.0\n.target sm_90\n").is_err());
        let mut big_endian = elf.clone();
        big_endian[5] = 2;
        assert!(cubin_kernels(&big_endian).is_err());
        let mut no_symtab = elf.clone();
        let shoff = u64::from_le_bytes(elf[0x28..0x30].try_into().unwrap()) as usize;
        no_symtab[shoff + 2 * 64 + 4] = 1; // .symtab becomes PROGBITS
        assert!(cubin_kernels(&no_symtab).is_err());
        assert_eq!(
            missing_kernels(&no_symtab, KernelSet::Plain),
            all_kernel_names(KernelSet::Plain)
        );
    }

    #[test]
    fn program_names_each_file_for_nvrtc_messages() {
        let program = program();
        let mut at = 0;
        for (name, src) in SOURCES {
            let directive = format!("#line 1 \"{name}\"\n");
            let found = program[at..]
                .find(&directive)
                .unwrap_or_else(|| panic!("no #line directive for {name}"));
            at += found + directive.len();
            assert!(
                program[at..].starts_with(src),
                "{name} does not follow its #line"
            );
        }
        let plain = compile_options("sm_90", KernelSet::Plain);
        assert_eq!(plain[0], "--gpu-architecture=sm_90");
        let twins = compile_options("sm_90", KernelSet::Extended);
        assert_eq!(twins[..plain.len()], plain[..]);
        assert_eq!(twins[plain.len()..], ["-DEXTENDED_KERNELS"]);
    }
}
