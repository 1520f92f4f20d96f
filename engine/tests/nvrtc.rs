//! The CUDA kernels compile with NVRTC, exactly as the backend compiles them at start-up,
//! for the architectures the engine runs on, and the cubin defines every kernel the backend
//! loads. No GPU is needed, but libnvrtc is: these tests fail (they do not skip) without it.
//! `scripts/test.sh` installs it; by hand:
//!
//! ```sh
//! source scripts/nvrtc-env.sh && cargo test --release -p engine --test nvrtc
//! ```

use engine::backend::cuda::{
    all_kernel_names, compile_cubin, compile_source_cubin, cubin_kernels, missing_kernels,
    nvrtc_present, program, KernelSet,
};

/// Fails the test, saying how to get libnvrtc, when it cannot be loaded.
fn require_nvrtc() {
    assert!(
        nvrtc_present(),
        "libnvrtc (CUDA 13: libnvrtc.so.13 and libnvrtc-builtins.so.13.0) could not be loaded, \
         so the kernels cannot be compiled. Run the tests through scripts/test.sh, which \
         installs NVRTC from PyPI (nvidia-cuda-nvrtc==13.0.88) into a cache and puts it on \
         LD_LIBRARY_PATH, or by hand:\n    \
         source scripts/nvrtc-env.sh && cargo test --release -p engine --test nvrtc\n\
         (LD_LIBRARY_PATH is {:?})",
        std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
    );
}

/// The program compiled for `arch` as each of `sets` defines every kernel of that set (the
/// one the backend compiles by default, `Plain`, no twin).
fn check_arch(arch: &str, sets: &[KernelSet]) {
    require_nvrtc();
    for &set in sets {
        let cubin = compile_cubin(arch, set).unwrap_or_else(|e| panic!("{e:#}"));
        let kernels = cubin_kernels(&cubin)
            .unwrap_or_else(|e| panic!("the {arch} cubin is not a readable ELF image: {e:#}"));
        let missing = missing_kernels(&cubin, set);
        assert!(
            missing.is_empty(),
            "the {arch} {set:?} cubin lacks kernels the backend loads: {missing:?} (its kernels: {kernels:?})"
        );
        let twins = kernels.iter().filter(|k| k.ends_with("_sliding")).count();
        let wanted = all_kernel_names(set)
            .iter()
            .filter(|k| k.ends_with("_sliding"))
            .count();
        assert_eq!(twins, wanted, "{arch} {set:?}: {kernels:?}");
    }
}

/// Both kernel sets on the H100's architecture; on the others the extended set, whose
/// source is the plain set's and more (each compile takes seconds).
#[test]
fn kernels_compile_for_sm_90() {
    check_arch("sm_90", &[KernelSet::Extended, KernelSet::Plain]);
}

#[test]
fn kernels_compile_for_sm_80() {
    check_arch("sm_80", &[KernelSet::Extended]);
}

/// Turing has no bf16 tensor cores: the program still compiles (the mma prefill kernel
/// traps there, and the host refuses it).
#[test]
fn kernels_compile_for_sm_75() {
    check_arch("sm_75", &[KernelSet::Extended]);
}

/// A compile error comes back with NVRTC's log, which names the file and line.
#[test]
fn a_compile_error_reports_file_and_line() {
    require_nvrtc();
    let broken = program().replacen(
        "__device__ __forceinline__ float warp_sum(float v) {",
        "__device__ __forceinline__ float warp_sum(float v) {\n    undeclared_name = 1;",
        1,
    );
    assert_ne!(broken, program(), "warp_sum is no longer in common.cuh");
    let err = format!(
        "{:#}",
        compile_source_cubin(&broken, "sm_90", KernelSet::Plain).unwrap_err()
    );
    assert!(err.contains("sm_90"), "{err}");
    assert!(err.contains("kernels/common.cuh("), "{err}");
    assert!(err.contains("undeclared_name"), "{err}");
}
