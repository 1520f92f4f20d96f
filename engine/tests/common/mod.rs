//! Helpers shared by the integration tests: where the shared golden data and the default
//! model live (a missing file fails the test, saying how to get it) and a one-sequence
//! forward step.

// Every test binary compiles this module but each uses only some of its helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use engine::layer_groups::GroupKind;
use engine::model::{ModelRunner, SeqInput};
use engine::sampler::SampleSpec;

pub mod server;

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

/// Gemma 3 270M as Q4_K_M GGUF, the second real model (`scripts/fetch-model.sh gemma3`;
/// the test command fetches it).
pub fn gemma3_gguf() -> PathBuf {
    let path = workspace().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "missing {}: run scripts/fetch-model.sh gemma3",
        path.display()
    );
    path
}

/// `table`'s blocks as one table per layer group of `r`, disjoint across groups (which
/// share the caches): block `b` of group `g` is `b · groups + g`; a recurrent group's
/// state takes its blocks `0..blocks` so.
pub fn group_tables(r: &dyn ModelRunner, table: &[u32]) -> Vec<Vec<u32>> {
    let kinds = r.kv_groups();
    let groups = kinds.len() as u32;
    kinds
        .iter()
        .zip(0..groups)
        .map(|(kind, g)| match *kind {
            GroupKind::Recurrent { blocks } => (0..blocks as u32).map(|b| b * groups + g).collect(),
            _ => table.iter().map(|&b| b * groups + g).collect(),
        })
        .collect()
}

/// Computes `tokens` at positions `start..` of one sequence stored in `table` (in each
/// layer group, see [`group_tables`]); returns the last token's logits.
pub fn last_logits(
    r: &mut dyn ModelRunner,
    tokens: &[u32],
    start: usize,
    table: &[u32],
) -> Vec<f32> {
    let tables = group_tables(r, table);
    let input = SeqInput {
        state_restores: &[],
        state_saves: &[],
        tokens,
        start_pos: start,
        block_tables: &tables,
        sample: Some(SampleSpec::GREEDY),
    };
    let mut out = r.logits(&[input]).expect("forward");
    assert_eq!(out.len(), 1, "one logits row per sequence");
    out.pop().unwrap()
}

/// The sampling contract every backend keeps, on crafted logits (`make(rows, cols, data)`
/// uploads an activation): greedy ties go to the lowest id, top-k 1 is greedy, seeded
/// draws repeat and cover the kept set, penalties and masks change the pick, logprobs are
/// the log-softmax of what was drawn from.
pub fn check_sampling_contract<B: engine::backend::Backend>(
    b: &B,
    make: impl Fn(usize, usize, &[f32]) -> B::Act,
) {
    use engine::backend::StepMeta;
    use engine::sampler::TokenCounts;
    let vocab = 1000;
    let mut data = vec![0.0f32; 2 * vocab];
    data[417] = 5.0;
    data[418] = 1.0;
    data[vocab + 3] = 2.0;
    data[vocab + 9] = 2.0;
    let run = |specs: [SampleSpec<'_>; 2]| -> Vec<engine::sampler::Sampled> {
        let mut logits = make(2, vocab, &data);
        let step = b
            .prepare_step(&StepMeta {
                seqs: &[],
                num_groups: 1,
                tokens: &[],
                positions: &[],
                slots: &[],
                logit_rows: &[0, 1],
                samples: &specs,
                block_size: 16,
            })
            .expect("prepare step");
        b.sample(&mut logits, &specs, &step)
            .expect("sample")
            .into_iter()
            .map(|r| r.expect("row sampled"))
            .collect()
    };
    let tokens = |specs| run(specs).iter().map(|s| s.token).collect::<Vec<_>>();
    let greedy = SampleSpec::GREEDY;
    assert_eq!(tokens([greedy, greedy]), vec![417, 3]);
    let top1 = SampleSpec {
        temperature: 1.0,
        top_k: 1,
        ..greedy
    };
    assert_eq!(tokens([top1, top1])[0], 417);
    let hot = SampleSpec {
        temperature: 1.0,
        top_k: 2,
        seed: 7,
        ..greedy
    };
    let mut seen = std::collections::HashSet::new();
    for draw in 0..64u64 {
        let spec = SampleSpec {
            draw,
            uniform: (draw as f64 + 0.5) / 64.0,
            ..hot
        };
        let t = tokens([spec, spec])[1];
        assert!(t == 3 || t == 9, "top-k 2 drew {t}");
        seen.insert(t);
        assert_eq!(tokens([spec, spec])[1], t, "same seed and draw, same token");
    }
    assert_eq!(seen.len(), 2, "both tied tokens drawn over 64 draws");

    let counts = TokenCounts::new(&[417]);
    let mut generated = TokenCounts::new(&[]);
    generated.push_output(417);
    generated.push_output(417);
    let rep = SampleSpec {
        repetition_penalty: 10.0,
        counts: Some(&counts),
        ..greedy
    };
    assert_eq!(tokens([rep, greedy])[0], 418, "5.0 / 10 falls below 1.0");
    let freq = SampleSpec {
        presence_penalty: 2.0,
        frequency_penalty: 1.5,
        counts: Some(&generated),
        ..greedy
    };
    assert_eq!(tokens([freq, greedy])[0], 418, "5 - 2 * 1.5 - 2 = 0 < 1");
    let masked = SampleSpec {
        masked: &[417, 3],
        ..greedy
    };
    assert_eq!(tokens([masked, masked]), vec![418, 9]);

    let lp = SampleSpec {
        logprobs: Some(2),
        ..greedy
    };
    let out = run([lp, lp]);
    let z0 = (5.0f32.exp() + 1.0f32.exp() + (vocab - 2) as f32).ln();
    let l0 = out[0].logprobs.as_ref().expect("logprobs asked");
    assert!((l0.logprob - (5.0 - z0)).abs() < 1e-3, "{l0:?}");
    assert_eq!(l0.top.len(), 2);
    assert_eq!((l0.top[0].0, l0.top[1].0), (417, 418));
    assert!((l0.top[1].1 - (1.0 - z0)).abs() < 1e-3, "{l0:?}");
    let l1 = out[1].logprobs.as_ref().expect("logprobs asked");
    assert_eq!((l1.top[0].0, l1.top[1].0), (3, 9), "ties by lower id");
    assert!(run([greedy, greedy])[0].logprobs.is_none());
}

/// The runner samples what its own logits say: greedy is the argmax of `logits()`, top-k 1
/// at any temperature too, a seed repeats, logprobs are the log-softmax, and a chunk that
/// samples nothing returns nothing.
pub fn check_runner_samples_its_logits(r: &mut dyn ModelRunner) {
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % 500).collect();
    let table = group_tables(r, &(0..4).collect::<Vec<u32>>());
    let other = group_tables(r, &(4..8).collect::<Vec<u32>>());
    let input = |sample: SampleSpec<'static>| SeqInput {
        state_restores: &[],
        state_saves: &[],
        tokens: &prompt,
        start_pos: 0,
        block_tables: &table,
        sample: Some(sample),
    };
    let logits = r
        .logits(&[input(SampleSpec::GREEDY)])
        .expect("logits")
        .remove(0);
    let argmax = engine::sampler::argmax(&logits);
    let token = |r: &mut dyn ModelRunner, spec| {
        let mut out = r.forward(&[input(spec)]).expect("forward");
        assert_eq!(out.len(), 1);
        out.remove(0).expect("sampled").token
    };
    assert_eq!(token(r, SampleSpec::GREEDY), argmax);
    let top1 = SampleSpec {
        temperature: 0.7,
        top_k: 1,
        seed: 5,
        uniform: 0.9,
        ..SampleSpec::GREEDY
    };
    assert_eq!(token(r, top1), argmax);
    let hot = SampleSpec {
        temperature: 1.5,
        seed: 3,
        draw: 5,
        uniform: 0.3,
        ..SampleSpec::GREEDY
    };
    assert_eq!(
        token(r, hot),
        token(r, hot),
        "same seed and draw, same token"
    );

    let lp = SampleSpec {
        logprobs: Some(5),
        ..SampleSpec::GREEDY
    };
    let sampled = r
        .forward(&[input(lp)])
        .expect("forward")
        .remove(0)
        .expect("row");
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
    let got = sampled.logprobs.expect("logprobs asked");
    assert!((got.logprob - (logits[argmax as usize] - log_z)).abs() < 1e-3);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    assert_eq!(got.top.len(), 5);
    for ((id, l), &want) in got.top.iter().zip(&order) {
        assert_eq!(*id as usize, want);
        assert!(
            (l - (logits[want] - log_z)).abs() < 1e-3,
            "{l} vs {}",
            logits[want] - log_z
        );
    }

    let chunk = SeqInput {
        state_restores: &[],
        state_saves: &[],
        tokens: &prompt[..8],
        start_pos: 0,
        block_tables: &other,
        sample: None,
    };
    let out = r
        .forward(&[chunk, input(SampleSpec::GREEDY)])
        .expect("forward");
    assert_eq!(out.len(), 1, "only the sampling entry returns a row");
    assert_eq!(out[0].as_ref().expect("sampled").token, argmax);
}

/// The outputs of a Gated DeltaNet layer (2 key heads serving 4 value heads of 16, a
/// 4-tap convolution) run as the model runs it, on `b`, in two steps: the first prefills
/// sequence A (37 rows, with a checkpoint after 16) beside B (5 rows); the second decodes
/// one more row of A beside C, which starts from A's checkpoint (copied into C's own pages)
/// with A's rows 16..37. The projection's values are rounded to bf16 first, so that a bf16
/// device reads what the CPU reads. Returns A's rows of the first step, B's, A's row of the
/// second step and C's.
pub fn delta_net_runs<B: engine::backend::Backend>(
    b: &B,
    make: impl Fn(usize, usize, &[f32]) -> B::Act,
) -> [Vec<Vec<f32>>; 4] {
    use engine::backend::{state_page_values, DeltaNetParams, KvCacheShape, StepMeta, StepSeq};
    use engine::config::{DeltaNetSpec, ValueHeadOrder};
    use engine::layer_groups::StateCopy;
    use engine::weights::{HostTensor, TensorData};
    let spec = DeltaNetSpec {
        num_key_heads: 2,
        num_value_heads: 4,
        key_head_dim: 16,
        value_head_dim: 16,
        conv_kernel: 4,
        value_head_order: ValueHeadOrder::Grouped,
    };
    let mut seed = 12345u64;
    let mut uniform = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let bf16 = |x: f32| f32::from_bits(x.to_bits() & 0xffff_0000);
    let width = spec.projection_width();
    let mut rows =
        |n: usize| -> Vec<f32> { (0..n * width).map(|_| bf16(2.0 * uniform())).collect() };
    let first = rows(42);
    let decode = rows(1);
    let heads = spec.num_value_heads;
    let mut vector = |n: usize, f: &dyn Fn(f32) -> f32| -> B::Param {
        let data: Vec<f32> = (0..n).map(|_| f(uniform())).collect();
        let tensor = HostTensor {
            shape: vec![n],
            data: TensorData::F32(data),
        };
        b.upload_param("delta_net", tensor).expect("upload")
    };
    let params = DeltaNetParams {
        conv: vector(spec.conv_kernel * spec.conv_channels(), &|u| u),
        decay: vector(heads, &|u| -(1.0 + u)),
        dt_bias: vector(heads, &|u| u),
        norm: vector(spec.value_head_dim, &|u| 1.0 + u),
    };
    // The state lives in a layer index's KV blocks: as many pages as its values need.
    let shape = KvCacheShape {
        num_blocks: 16,
        block_size: 16,
        num_kv_heads: 2,
        head_dim: 16,
    };
    let page = state_page_values(&shape, b.kv_value_bytes());
    let pages = spec.state_values().div_ceil(page) as u32;
    let mut cache = b.new_kv_cache(shape).expect("KV cache");
    let run = |cache: &mut B::KvCache, data: &[f32], seqs: &[StepSeq<'_>]| -> Vec<Vec<f32>> {
        let n = data.len() / width;
        let positions: Vec<u32> = seqs
            .iter()
            .flat_map(|s| (s.start_pos..s.start_pos + s.n_tokens).map(|p| p as u32))
            .collect();
        let step = b
            .prepare_step(&StepMeta {
                seqs,
                num_groups: 1,
                tokens: &vec![0; n],
                positions: &positions,
                slots: &vec![usize::MAX; n],
                logit_rows: &[],
                samples: &[],
                block_size: 16,
            })
            .expect("prepare step");
        let proj = make(n, width, data);
        let mut out = b.new_act();
        b.gated_delta_net(&proj, spec, &params, 1e-6, cache, &step, 0, &mut out)
            .expect("gated_delta_net");
        b.to_host(&out).expect("to host")
    };
    let table = |n: u32| vec![(n * pages..(n + 1) * pages).collect::<Vec<u32>>()];
    let (a_table, b_table, c_table) = (table(0), table(1), table(3));
    let checkpoint = [StateCopy {
        group: 0,
        position: 16,
        blocks: table(2).remove(0),
    }];
    let out = run(
        &mut cache,
        &first,
        &[
            StepSeq {
                row_start: 0,
                n_tokens: 37,
                start_pos: 0,
                block_tables: &a_table,
                state_saves: &checkpoint,
            },
            StepSeq {
                row_start: 37,
                n_tokens: 5,
                start_pos: 0,
                block_tables: &b_table,
                state_saves: &[],
            },
        ],
    );
    b.copy_state(&mut cache, &checkpoint[0].blocks, &c_table[0])
        .expect("copy state");
    let mut second = decode;
    second.extend_from_slice(&first[16 * width..37 * width]);
    let again = run(
        &mut cache,
        &second,
        &[
            StepSeq {
                row_start: 0,
                n_tokens: 1,
                start_pos: 37,
                block_tables: &a_table,
                state_saves: &[],
            },
            StepSeq {
                row_start: 1,
                n_tokens: 21,
                start_pos: 16,
                block_tables: &c_table,
                state_saves: &[],
            },
        ],
    );
    [
        out[..37].to_vec(),
        out[37..].to_vec(),
        again[..1].to_vec(),
        again[1..].to_vec(),
    ]
}
