//! What a [`Device`] says of itself for `GET /version`: its name, the dtypes the engine
//! computes in on it, and its peak memory bandwidth and compute, with how each was found.

use super::Device;

impl Device {
    /// "NVIDIA H100 80GB HBM3", or the CPU's model and core count ("AMD EPYC (2 cores)").
    pub fn name(self) -> String {
        match self {
            Device::Cuda => {
                super::cuda::device_name(0).unwrap_or_else(|e| format!("CUDA device 0 ({e})"))
            }
            Device::Cpu => cpu_name(),
        }
    }

    /// The dtypes of weights, activations and accumulation on this device.
    pub fn dtype(self) -> &'static str {
        match self {
            Device::Cuda => "bf16 weights and activations, f32 accumulation",
            Device::Cpu => {
                "weights in their file dtype (quantised GGUF tensors as f16), f32 activations"
            }
        }
    }

    /// Peak memory bandwidth (bytes/s) and how it was found, or why it is unknown; on the
    /// CPU measured on the engine's `threads` (see `crate::bandwidth`).
    pub fn memory_bandwidth(self, threads: usize) -> Result<(f64, &'static str), String> {
        match self {
            Device::Cuda => super::cuda::memory_bandwidth(0)
                .map(|bw| (bw, "the device's attributes: 2 × memory clock × bus width")),
            Device::Cpu => Ok((
                crate::bandwidth::cpu_copy_bandwidth(threads),
                "measured at start-up: a copy on the engine's threads, read + written, best of 10",
            )),
        }
    }

    /// Peak compute (FLOP/s) and how it was found, or why it is unknown; on the CPU
    /// measured on the engine's `threads` (see `cpu::compute_rate`).
    pub fn compute_rate(self, threads: usize) -> Result<(f64, &'static str), String> {
        match self {
            Device::Cuda => super::cuda::compute_flops(0).map(|f| {
                (
                    f,
                    "the device's attributes: SMs × clock × dense bf16 tensor-core FLOPs per SM clock",
                )
            }),
            Device::Cpu => Ok((
                super::cpu::compute_rate::cpu_gemm_flops(threads),
                "measured at start-up: the faster of the engine's f32 and integer (Q8_0) GEMMs, 256 × 1024 × 1024 on its threads, best of 10",
            )),
        }
    }
}

/// "AMD EPYC (2 cores)", from `/proc/cpuinfo` where there is one.
fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model} ({cores} cores)")
}
