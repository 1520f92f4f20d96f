//! Choosing the device: CUDA when a driver and a GPU are present, else the CPU.
//!
//! Every probe checks that `libcuda` can be loaded before calling into the driver:
//! cudarc's `CudaContext::new` panics when the library is missing.

use crate::backend::Device;

/// The error `--device cuda` gives on a machine without a driver.
pub const NO_DRIVER: &str = "--device cuda: no CUDA driver found (libcuda.so not loadable)";

/// Whether the CUDA driver library can be loaded (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The name of CUDA device `ordinal` ("NVIDIA H100 80GB HBM3"), or why it cannot be read.
pub fn device_name(ordinal: usize) -> Result<String, String> {
    if !driver_present() {
        return Err(NO_DRIVER.to_string());
    }
    cudarc::driver::CudaContext::new(ordinal)
        .and_then(|ctx| ctx.name())
        .map_err(|e| format!("{e:?}"))
}

/// The device's peak memory bandwidth in bytes/s from its attributes: 2 (double data rate)
/// × memory clock × bus width.
pub fn memory_bandwidth(ordinal: usize) -> Result<f64, String> {
    use cudarc::driver::sys::CUdevice_attribute::*;
    let [clock_khz, bus_bits] = attributes(
        ordinal,
        [
            CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
            CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
        ],
    )?;
    Ok(2.0 * clock_khz as f64 * 1e3 * bus_bits as f64 / 8.0)
}

/// The values of device `ordinal`'s `wanted` attributes, or why they cannot be read.
fn attributes<const N: usize>(
    ordinal: usize,
    wanted: [cudarc::driver::sys::CUdevice_attribute; N],
) -> Result<[i32; N], String> {
    if !driver_present() {
        return Err(NO_DRIVER.to_string());
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| format!("{e:?}"))?;
    let mut values = [0; N];
    for (value, a) in values.iter_mut().zip(wanted) {
        *value = ctx.attribute(a).map_err(|e| format!("{e:?}"))?;
    }
    Ok(values)
}

/// Dense bf16 tensor-core FLOPs one SM retires per clock, by compute capability (the
/// datasheets' dense figures over SM count × boost clock: A100 312 TFLOP/s over 108 SMs at
/// 1.41 GHz, H100 SXM 989 over 132 at 1.83, L40S 362 over 142 at 2.52, A10 125 over 72 at
/// 1.695, B200 2,250 over 148 at 1.85 rounded to the power of two).
fn bf16_flops_per_sm_clock(major: i32, minor: i32) -> Option<f64> {
    match (major, minor) {
        (8, 0) => Some(2048.0),
        (8, 6) | (8, 7) | (8, 9) => Some(1024.0),
        (9, 0) => Some(4096.0),
        (10, 0) => Some(8192.0),
        _ => None,
    }
}

/// The device's peak dense bf16 FLOP/s from its attributes: SM count × clock × the tensor
/// cores' bf16 rate per SM for its compute capability.
pub fn compute_flops(ordinal: usize) -> Result<f64, String> {
    use cudarc::driver::sys::CUdevice_attribute::*;
    let [sms, clock_khz, major, minor] = attributes(
        ordinal,
        [
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        ],
    )?;
    let per_sm = bf16_flops_per_sm_clock(major, minor).ok_or_else(|| {
        format!(
            "compute capability {major}.{minor} is not in the engine's table of tensor-core rates"
        )
    })?;
    Ok(sms as f64 * clock_khz as f64 * 1e3 * per_sm)
}

/// Number of CUDA devices, or why there are none usable.
pub fn gpu_count() -> Result<usize, String> {
    if !driver_present() {
        return Err(NO_DRIVER.to_string());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err("--device cuda: the CUDA driver reports no GPU".to_string()),
        Err(e) => Err(format!(
            "--device cuda: the CUDA driver failed to initialise ({e:?})"
        )),
    }
}

/// True when a CUDA driver is loadable and reports at least one GPU.
pub fn cuda_available() -> bool {
    gpu_count().is_ok()
}

/// The device to use and why, for the start-up log: the requested one, else CUDA when
/// available, else the CPU.
pub fn resolve_device(requested: Option<Device>) -> (Device, String) {
    match requested {
        Some(d) => (d, format!("device {d} requested with --device")),
        None => match gpu_count() {
            Ok(n) => (
                Device::Cuda,
                format!("device cuda: a CUDA driver and {n} GPU(s) found"),
            ),
            Err(why) => (Device::Cpu, format!("device cpu: CUDA not usable ({why})")),
        },
    }
}
