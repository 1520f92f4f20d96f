//! Helpers shared by the integration tests: where the shared golden data and the default
//! model live (a missing file fails the test, saying how to get it) and a one-sequence
//! forward step.

// Every test binary compiles this module but each uses only some of its helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use engine::model::{ModelRunner, SeqInput};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `rel` under the HF reference data in `../shared/golden` (beside the workspace);
/// fails the test if it does not exist.
pub fn golden(rel: &str) -> PathBuf {
    let path = golden_path(rel);
    assert!(path.exists(), "{}", missing_golden(&path));
    path
}

/// The golden directory `rel`, checked to hold `file` (e.g. `reference.json`,
/// `model.safetensors`).
pub fn golden_dir_with(rel: &str, file: &str) -> PathBuf {
    let dir = golden_path(rel);
    assert!(
        dir.join(file).is_file(),
        "{}",
        missing_golden(&dir.join(file))
    );
    dir
}

fn golden_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/golden")
        .join(rel)
}

fn missing_golden(path: &Path) -> String {
    format!(
        "missing {}: the golden data lives in ../shared/golden next to the workspace",
        path.display()
    )
}

/// The default model, SmolLM2-135M-Instruct as Q4_1 GGUF (CI fetches it).
pub fn smollm2_gguf() -> PathBuf {
    let path = workspace().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "missing {}: run scripts/fetch-model.sh to download the default model",
        path.display()
    );
    path
}

/// Computes `tokens` at positions `start..` of one sequence stored in `table`; returns
/// the last token's logits.
pub fn last_logits(
    r: &mut dyn ModelRunner,
    tokens: &[u32],
    start: usize,
    table: &[u32],
) -> Vec<f32> {
    let input = SeqInput {
        tokens,
        start_pos: start,
        block_table: table,
        need_logits: true,
    };
    let mut out = r.forward(&[input]).expect("forward");
    assert_eq!(out.len(), 1, "one logits row per sequence");
    out.pop().unwrap()
}
