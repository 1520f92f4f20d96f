//! The runner contract on the CPU backend (the GPU checks the same in `tests/cuda.rs`): the
//! runner samples, only sampled rows come back, penalties and masks act, and seeded
//! sampling draws the same tokens as the CPU sampler did before sampling moved into the
//! runner.

mod common;

use engine::backend::cpu::{load_cpu_runner, CpuAct, CpuBackend, CpuOptions};
use engine::model::{kv_bytes_per_token, RunnerOptions};
use engine::weights::open_model;

use common::golden_dir_with;

#[test]
fn cpu_backend_keeps_the_sampling_contract() {
    let b = CpuBackend::new(&CpuOptions {
        threads: 1,
        f32_weights_as_f16: false,
    })
    .expect("backend");
    common::check_sampling_contract(&b, |rows, cols, data| {
        CpuAct::from_rows(rows, cols, data.to_vec()).expect("activation")
    });
}

#[test]
fn cpu_runner_samples_its_own_logits() {
    let dir = golden_dir_with("qwen3-tiny/bf16", "model.safetensors");
    let (config, mut w) = open_model(&dir).expect("open model");
    let opts = RunnerOptions {
        block_size: 16,
        kv_cache_bytes: kv_bytes_per_token(&config) * 16 * 16,
    };
    let mut r = load_cpu_runner(&config, w.as_mut(), &opts, 2).expect("load");
    common::check_runner_samples_its_logits(r.as_mut());
}
