//! Model loading: HF configs, safetensors, GGUF, and errors on bad input.

mod common;

use std::path::{Path, PathBuf};

use engine::config::{
    llama3_rope_factors, Activation, AttentionSpan, Family, Ffn, LayerSpec, Llama3RopeScaling,
    Mixer, ModelConfig, NormPlacement, NormWeights, RopeScaling, RopeSpec,
};
use engine::weights::ggml_quants::dequantize;
use engine::weights::gguf::GgufFile;
use engine::weights::QuantType;
use engine::weights::{open_model, HostTensor, TensorData, WeightSource};
use safetensors::tensor::{serialize, Dtype, TensorView};

use common::{golden, smollm2_gguf};

fn expected_tensor_names(dir: &str) -> Vec<String> {
    let text = std::fs::read_to_string(golden(&format!("{dir}/reference.json"))).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(json["tensor_names"].clone()).unwrap()
}

#[test]
fn qwen3_tiny_config_parses() {
    let config = ModelConfig::from_hf_config(&golden("qwen3-tiny/f32/config.json")).unwrap();
    assert_eq!(
        config,
        ModelConfig {
            family: Family::Qwen3,
            vocab_size: 49152,
            hidden_size: 64,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 2048,
            tie_word_embeddings: true,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            embedding_scale: 1.0,
            final_logit_softcap: None,
            norm_weights: NormWeights::AsStored,
            layers: vec![
                LayerSpec {
                    mixer: Mixer::Attention { output_gate: false },
                    attention: AttentionSpan::Full,
                    rope: RopeSpec {
                        theta: 1_000_000.0,
                        rotary_dim: 16,
                        scaling: None,
                    },
                    qk_norm: true,
                    qkv_bias: false,
                    o_bias: false,
                    sinks: false,
                    attn_scale: 0.25,
                    attn_softcap: None,
                    norms: NormPlacement::Pre,
                    activation: Activation::Silu,
                    ffn: Ffn::Dense {
                        intermediate_size: 128,
                    },
                    shared_expert: None,
                };
                2
            ],
        }
    );
}

#[test]
fn llama_tiny_config_parses() {
    let config = ModelConfig::from_hf_config(&golden("llama-tiny/config.json")).unwrap();
    assert_eq!(config.family, Family::Llama);
    assert_eq!(config.layers[0].rope.theta, 10_000.0);
    assert_eq!(config.rms_norm_eps, 1e-5);
    assert!(!config.tie_word_embeddings);
    assert_eq!(
        (config.num_heads, config.num_kv_heads, config.head_dim),
        (4, 2, 16)
    );
}

#[test]
fn qwen3_tiny_f32_weights_load() {
    let (config, mut weights) = open_model(&golden("qwen3-tiny/f32")).unwrap();
    let names = expected_tensor_names("qwen3-tiny/f32");
    assert!(!names.iter().any(|n| n == "lm_head.weight"));
    assert!(!weights.contains("lm_head.weight"));
    for name in &names {
        assert!(weights.contains(name), "{name}");
    }
    let embed = weights
        .load_expect(
            "model.embed_tokens.weight",
            &[config.vocab_size, config.hidden_size],
        )
        .unwrap();
    assert!(matches!(embed.data, TensorData::F32(_)));
    let q_norm = weights
        .load_expect("model.layers.1.self_attn.q_norm.weight", &[16])
        .unwrap();
    // RMSNorm weights were drawn from U(0.5, 1.5).
    assert!(q_norm
        .data
        .to_f32()
        .iter()
        .all(|&x| (0.5..1.5).contains(&x)));
}

#[test]
fn bf16_weights_stay_bf16_and_match_f32_rounding() {
    let (_, mut f32_weights) = open_model(&golden("qwen3-tiny/f32")).unwrap();
    let (_, mut bf16_weights) = open_model(&golden("qwen3-tiny/bf16")).unwrap();
    let name = "model.layers.0.mlp.down_proj.weight";
    let full = f32_weights.load_expect(name, &[64, 128]).unwrap();
    let half = bf16_weights.load_expect(name, &[64, 128]).unwrap();
    let TensorData::BF16(half_values) = &half.data else {
        panic!("expected BF16 data, got {:?}", half.data);
    };
    let full_values = full.data.to_f32();
    for (h, f) in half_values.iter().zip(&full_values) {
        assert_eq!(*h, half::bf16::from_f32(*f));
    }
}

#[test]
fn llama_tiny_has_untied_head() {
    let (config, mut weights) = open_model(&golden("llama-tiny")).unwrap();
    let head: HostTensor = weights
        .load_expect("lm_head.weight", &[config.vocab_size, config.hidden_size])
        .unwrap();
    assert_eq!(head.numel(), 49152 * 64);
    let names = expected_tensor_names("llama-tiny");
    // embed, final norm, lm_head, and 9 tensors per layer.
    assert_eq!(names.len(), 3 + 2 * 9);
    assert!(names.iter().all(|n| weights.contains(n)));
}

#[test]
fn smollm2_gguf_config_matches_golden() {
    let text = std::fs::read_to_string(golden("smollm2-135m/reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want = &json["config"];
    let file = GgufFile::open(&smollm2_gguf()).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let usize_of = |key: &str| want[key].as_u64().unwrap() as usize;
    assert_eq!(config.family, Family::Llama);
    assert_eq!(config.vocab_size, usize_of("vocab_size"));
    assert_eq!(config.hidden_size, usize_of("hidden_size"));
    assert_eq!(config.layers[0].ffn.width(), usize_of("intermediate_size"));
    assert_eq!(config.num_layers(), usize_of("num_hidden_layers"));
    assert_eq!(config.num_heads, usize_of("num_attention_heads"));
    assert_eq!(config.num_kv_heads, usize_of("num_key_value_heads"));
    assert_eq!(config.head_dim, usize_of("head_dim"));
    assert_eq!(
        config.max_position_embeddings,
        usize_of("max_position_embeddings")
    );
    assert_eq!(
        config.layers[0].rope.theta,
        want["rope_theta"].as_f64().unwrap() as f32
    );
    assert_eq!(
        config.rms_norm_eps,
        want["rms_norm_eps"].as_f64().unwrap() as f32
    );
    assert_eq!(
        config.tie_word_embeddings,
        want["tie_word_embeddings"].as_bool().unwrap()
    );
    assert_eq!(config.layers[0].rope.scaling, None);
    assert_eq!(config.bos_token_id, Some(1));
    assert_eq!(config.eos_token_ids, vec![2]);
}

#[test]
fn smollm2_gguf_weights_have_hf_names_and_shapes() {
    let (config, mut weights) = open_model(&smollm2_gguf()).unwrap();
    let (h, kv) = (config.hidden_size, config.num_kv_heads * config.head_dim);
    assert!(!weights.contains("lm_head.weight"));
    let embed = weights
        .load_expect("model.embed_tokens.weight", &[49152, h])
        .unwrap();
    assert!(matches!(embed.data, TensorData::Quant(QuantType::Q8_0, _)));
    let norm = weights.load_expect("model.norm.weight", &[h]).unwrap();
    assert!(norm.data.to_f32().iter().all(|x| x.is_finite()));
    for layer in [0, 29] {
        let p = format!("model.layers.{layer}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![1536, h]),
            ("mlp.up_proj.weight", vec![1536, h]),
            ("mlp.down_proj.weight", vec![h, 1536]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            let t = weights.load_expect(&format!("{p}.{name}"), &shape).unwrap();
            assert_eq!(t.data.len(), t.numel());
        }
    }
    let err = weights
        .load_expect("model.norm.weight", &[h + 1])
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("model.norm.weight") && msg.contains("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{msg}"
    );
}

#[test]
fn dequantize_q8_0_block() {
    let mut block = half::f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
    block.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let values = dequantize(QuantType::Q8_0, &block);
    let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
    assert_eq!(values, want);
}

/// 16 bytes whose low nibbles count up 0..15 and high nibbles count down 15..0.
fn nibbles() -> Vec<u8> {
    (0..16u8).map(|i| i | ((15 - i) << 4)).collect()
}

#[test]
fn dequantize_q4_0_block() {
    let mut block = half::f16::from_f32(2.0).to_bits().to_le_bytes().to_vec();
    block.extend(nibbles());
    let values = dequantize(QuantType::Q4_0, &block);
    let low = (0..16).map(|i| (i as f32 - 8.0) * 2.0);
    let high = (0..16).map(|i| ((15 - i) as f32 - 8.0) * 2.0);
    assert_eq!(values, low.chain(high).collect::<Vec<_>>());
}

#[test]
fn dequantize_q4_1_blocks() {
    let mut bytes = Vec::new();
    for (d, m) in [(0.25f32, -1.0f32), (1.0, 3.0)] {
        bytes.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
        bytes.extend(half::f16::from_f32(m).to_bits().to_le_bytes());
        bytes.extend(nibbles());
    }
    let values = dequantize(QuantType::Q4_1, &bytes);
    assert_eq!(values.len(), 64);
    let block = |d: f32, m: f32| -> Vec<f32> {
        let low = (0..16).map(move |i| i as f32 * d + m);
        let high = (0..16).map(move |i| (15 - i) as f32 * d + m);
        low.chain(high).collect()
    };
    assert_eq!(values[..32], block(0.25, -1.0)[..]);
    assert_eq!(values[32..], block(1.0, 3.0)[..]);
}

/// A minimal GGUF v3 writer for building test files.
#[derive(Clone)]
struct GgufBuilder {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn gguf_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufBuilder {
    fn new() -> Self {
        GgufBuilder {
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        }
    }

    /// Adds a metadata entry whose value bytes are already encoded.
    fn kv(mut self, key: &str, type_id: u32, value: &[u8]) -> Self {
        gguf_string(&mut self.kv, key);
        self.kv.extend(type_id.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }

    fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv(key, 4, &v.to_le_bytes())
    }

    fn kv_f32(self, key: &str, v: f32) -> Self {
        self.kv(key, 6, &v.to_le_bytes())
    }

    fn kv_str(self, key: &str, v: &str) -> Self {
        let mut bytes = Vec::new();
        gguf_string(&mut bytes, v);
        self.kv(key, 8, &bytes)
    }

    fn kv_str_array(self, key: &str, items: &[&str]) -> Self {
        let mut bytes = 8u32.to_le_bytes().to_vec();
        bytes.extend((items.len() as u64).to_le_bytes());
        for item in items {
            gguf_string(&mut bytes, item);
        }
        self.kv(key, 9, &bytes)
    }

    /// `dims` fastest-first, as GGUF stores them.
    fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), type_id, data));
        self
    }

    fn build(&self) -> Vec<u8> {
        const ALIGN: usize = 32;
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0usize;
        for (name, dims, type_id, data) in &self.tensors {
            gguf_string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(type_id.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset += data.len().div_ceil(ALIGN) * ALIGN;
        }
        for (_, _, _, data) in &self.tensors {
            out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
            out.extend(data);
        }
        out
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A one-layer Llama GGUF (hidden 8, 2 heads of 4, 1 KV head) whose Q and K
/// weights were permuted the way llama.cpp's converter does.
fn tiny_llama_gguf(q_hf: &[f32], k_hf: &[f32]) -> Vec<u8> {
    // llama.cpp: w.reshape(n_head, 2, head_dim / 2, in).swapaxes(1, 2).reshape(out, in)
    let permute = |w: &[f32], n_head: usize| -> Vec<f32> {
        let (cols, head_dim) = (8, w.len() / 8 / n_head);
        let mut out = Vec::new();
        for h in 0..n_head {
            for i in 0..head_dim / 2 {
                for j in 0..2 {
                    let row = h * head_dim + j * head_dim / 2 + i;
                    out.extend_from_slice(&w[row * cols..(row + 1) * cols]);
                }
            }
        }
        out
    };
    // One Q4_0 block per row of the 32-wide up projection: d = 1, all nibbles 9 -> 1.0.
    let mut up = Vec::new();
    for _ in 0..16 {
        up.extend(half::f16::from_f32(1.0).to_bits().to_le_bytes());
        up.extend([0x99u8; 16]);
    }
    GgufBuilder::new()
        .kv_str("general.architecture", "llama")
        .kv("general.some_u8", 0, &[7])
        .kv("general.some_i16", 3, &(-3i16).to_le_bytes())
        .kv("general.some_bool", 7, &[1])
        .kv("general.some_f64", 12, &1.5f64.to_le_bytes())
        .kv_u32("llama.embedding_length", 8)
        .kv_u32("llama.block_count", 1)
        .kv_u32("llama.feed_forward_length", 32)
        .kv_u32("llama.attention.head_count", 2)
        .kv_u32("llama.attention.head_count_kv", 1)
        .kv_f32("llama.rope.freq_base", 500_000.0)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .kv_u32("llama.context_length", 128)
        .kv_str_array("tokenizer.ggml.tokens", &["a", "b", "c"])
        .tensor(
            "blk.0.attn_q.weight",
            &[8, 8],
            0,
            f32_bytes(&permute(q_hf, 2)),
        )
        .tensor(
            "blk.0.attn_k.weight",
            &[8, 4],
            0,
            f32_bytes(&permute(k_hf, 1)),
        )
        .tensor("blk.0.ffn_up.weight", &[32, 16], 2, up)
        .build()
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn gguf_llama_qk_permutation_is_undone() {
    let q_hf: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let k_hf: Vec<f32> = (0..32).map(|i| 1000.0 + i as f32).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = write_temp(dir.path(), "tiny.gguf", &tiny_llama_gguf(&q_hf, &k_hf));
    let (config, mut weights) = open_model(&path).unwrap();
    assert_eq!(config.family, Family::Llama);
    assert_eq!(
        (
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim
        ),
        (8, 2, 1, 4)
    );
    assert_eq!(
        (
            config.vocab_size,
            config.layers[0].ffn.width(),
            config.num_layers()
        ),
        (3, 32, 1)
    );
    assert_eq!(config.layers[0].rope.theta, 500_000.0);
    assert_eq!(config.max_position_embeddings, 128);
    assert!(config.tie_word_embeddings);
    let q = weights
        .load_expect("model.layers.0.self_attn.q_proj.weight", &[8, 8])
        .unwrap();
    assert_eq!(q.data, TensorData::F32(q_hf));
    let k = weights
        .load_expect("model.layers.0.self_attn.k_proj.weight", &[4, 8])
        .unwrap();
    assert_eq!(k.data, TensorData::F32(k_hf));
    let up = weights
        .load_expect("model.layers.0.mlp.up_proj.weight", &[16, 32])
        .unwrap();
    assert!(matches!(up.data, TensorData::Quant(QuantType::Q4_0, _)));
    assert_eq!(up.data.to_f32(), vec![1.0; 512]);
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.get_usize("general.some_u8").unwrap(), 7);
    assert_eq!(file.get_f64("general.some_i16").unwrap(), -3.0);
    assert_eq!(file.get_f64("general.some_f64").unwrap(), 1.5);
    assert_eq!(
        file.get_str_array("tokenizer.ggml.tokens").unwrap(),
        ["a", "b", "c"]
    );
}

fn error_of<T>(result: anyhow::Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn truncated_gguf_is_an_error_naming_the_file() {
    let q: Vec<f32> = vec![0.0; 64];
    let k: Vec<f32> = vec![0.0; 32];
    let bytes = tiny_llama_gguf(&q, &k);
    let dir = tempfile::tempdir().unwrap();
    // Data cut short: the last tensor's bytes run past the end.
    let path = write_temp(dir.path(), "cut_data.gguf", &bytes[..bytes.len() - 1]);
    let msg = error_of(open_model(&path));
    assert!(
        msg.contains("truncated") && msg.contains("cut_data.gguf"),
        "{msg}"
    );
    assert!(msg.contains("blk.0.ffn_up.weight"), "{msg}");
    // Header cut short, in the middle of the metadata.
    let path = write_temp(dir.path(), "cut_header.gguf", &bytes[..100]);
    let msg = error_of(open_model(&path));
    assert!(
        msg.contains("truncated") && msg.contains("cut_header.gguf"),
        "{msg}"
    );
    // The real model cut inside its token list.
    let real = std::fs::read(smollm2_gguf()).unwrap();
    let path = write_temp(dir.path(), "smollm2_cut.gguf", &real[..200_000]);
    let msg = error_of(open_model(&path));
    assert!(
        msg.contains("truncated") && msg.contains("smollm2_cut.gguf"),
        "{msg}"
    );
    assert!(msg.contains("tokenizer.ggml.tokens"), "{msg}");
    let msg = error_of(GgufFile::open(&write_temp(dir.path(), "empty.gguf", b"")));
    assert!(
        msg.contains("truncated") && msg.contains("empty.gguf"),
        "{msg}"
    );
}

#[test]
fn gguf_unknown_tensor_type_is_an_error() {
    // IQ2_XXS (16): an i-quant, out of scope.
    let bytes = GgufBuilder::new()
        .kv_str("general.architecture", "llama")
        .tensor("blk.0.attn_q.weight", &[256, 1], 16, vec![0; 66])
        .build();
    let dir = tempfile::tempdir().unwrap();
    let path = write_temp(dir.path(), "iq2.gguf", &bytes);
    let msg = error_of(GgufFile::open(&path));
    assert!(
        msg.contains("blk.0.attn_q.weight")
            && msg.contains("ggml type 16")
            && msg.contains("Q4_K")
            && msg.contains("iq2.gguf"),
        "{msg}"
    );
    // A K-quant row must hold whole 256-weight super-blocks.
    let bytes = GgufBuilder::new()
        .kv_str("general.architecture", "llama")
        .tensor("blk.0.attn_q.weight", &[32, 1], 12, vec![0; 144])
        .build();
    let msg = error_of(GgufFile::open(&write_temp(dir.path(), "q4k.gguf", &bytes)));
    assert!(
        msg.contains("row length 32 is not a multiple of the Quant(Q4_K) block size 256"),
        "{msg}"
    );
}

fn write_safetensors(dir: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.to_string(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    let bytes = serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

fn tiny_config_dir(architecture: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(golden("llama-tiny/config.json")).unwrap();
    let text = text.replace("LlamaForCausalLM", architecture);
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    dir
}

#[test]
fn safetensors_shape_and_dtype_errors_name_tensor_and_file() {
    let dir = tiny_config_dir("LlamaForCausalLM");
    write_safetensors(
        dir.path(),
        &[
            (
                "model.norm.weight",
                Dtype::F32,
                vec![3],
                f32_bytes(&[1.0, 2.0, 3.0]),
            ),
            ("model.embed_tokens.weight", Dtype::I32, vec![2], vec![0; 8]),
        ],
    );
    let (_, mut weights) = open_model(dir.path()).unwrap();
    let norm = weights.load_expect("model.norm.weight", &[3]).unwrap();
    assert_eq!(norm.data, TensorData::F32(vec![1.0, 2.0, 3.0]));
    let dir_name = dir.path().display().to_string();

    let msg = error_of(weights.load_expect("model.norm.weight", &[64]));
    assert!(
        msg.contains("model.norm.weight") && msg.contains("[3]") && msg.contains("[64]"),
        "{msg}"
    );
    assert!(msg.contains(&dir_name), "{msg}");

    let msg = error_of(weights.load("model.embed_tokens.weight"));
    assert!(
        msg.contains("model.embed_tokens.weight") && msg.contains("I32"),
        "{msg}"
    );
    assert!(msg.contains("model.safetensors"), "{msg}");

    let msg = error_of(weights.load("lm_head.weight"));
    assert!(
        msg.contains("missing tensor `lm_head.weight`") && msg.contains(&dir_name),
        "{msg}"
    );
}

#[test]
fn truncated_safetensors_is_an_error_naming_the_file() {
    let dir = tiny_config_dir("LlamaForCausalLM");
    write_safetensors(
        dir.path(),
        &[("model.norm.weight", Dtype::F32, vec![4], vec![0; 16])],
    );
    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 2]).unwrap();
    let msg = error_of(open_model(dir.path()));
    assert!(
        msg.contains("truncated") && msg.contains("model.safetensors"),
        "{msg}"
    );
}

#[test]
fn unknown_architecture_is_an_error_naming_the_file() {
    let dir = tiny_config_dir("GPTNeoXForCausalLM");
    let msg = error_of(open_model(dir.path()));
    assert!(
        msg.contains("unsupported architecture GPTNeoXForCausalLM"),
        "{msg}"
    );
    assert!(msg.contains("config.json"), "{msg}");
}

#[test]
fn hf_config_key_variants() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    // transformers-5 style only, llama3 rope scaling, list of EOS ids, no head_dim.
    std::fs::write(
        &file,
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#,
    )
    .unwrap();
    let config = ModelConfig::from_hf_config(&file).unwrap();
    assert_eq!(config.head_dim, 64);
    assert_eq!(config.layers[0].rope.theta, 500_000.0);
    assert_eq!(config.eos_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(
        config.layers[0].rope.scaling,
        Some(RopeScaling::Llama3(Llama3RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }))
    );
    // A missing required field names the field and the file.
    std::fs::write(
        &file,
        r#"{"architectures": ["Qwen2ForCausalLM"], "vocab_size": 10}"#,
    )
    .unwrap();
    let msg = error_of(ModelConfig::from_hf_config(&file));
    assert!(
        msg.contains("hidden_size") && msg.contains("config.json"),
        "{msg}"
    );
}

/// `y = W x` for a row-major `[rows, x.len()]` matrix.
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * scale * w).collect()
}

/// HF's rotate-half RoPE on every head of `x` at position `pos`.
fn rope(x: &mut [f32], head_dim: usize, pos: usize, theta: f32) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let freq = theta.powf(-2.0 * i as f32 / head_dim as f32);
            let (sin, cos) = (pos as f32 * freq).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * cos - b * sin;
            head[i + half] = b * cos + a * sin;
        }
    }
}

/// A plain f32 Llama forward pass over `ids`, returning the last position's
/// logits: an independent check that the loaded GGUF weights (dequantised, Q/K
/// un-permuted) are the ones transformers used.
fn reference_logits(config: &ModelConfig, weights: &mut dyn WeightSource, ids: &[u32]) -> Vec<f32> {
    let mut load = |name: &str| weights.load(name).unwrap().into_f32();
    let (h, hd, eps) = (config.hidden_size, config.head_dim, config.rms_norm_eps);
    let group = config.num_heads / config.num_kv_heads;
    let embed = load("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f32>> = ids
        .iter()
        .map(|&id| embed[id as usize * h..(id as usize + 1) * h].to_vec())
        .collect();
    for layer in 0..config.num_layers() {
        let p = |name: &str| format!("model.layers.{layer}.{name}.weight");
        let (wq, wk, wv, wo) = (
            load(&p("self_attn.q_proj")),
            load(&p("self_attn.k_proj")),
            load(&p("self_attn.v_proj")),
            load(&p("self_attn.o_proj")),
        );
        let (norm1, norm2) = (
            load(&p("input_layernorm")),
            load(&p("post_attention_layernorm")),
        );
        let (gate, up, down) = (
            load(&p("mlp.gate_proj")),
            load(&p("mlp.up_proj")),
            load(&p("mlp.down_proj")),
        );
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let n = rms_norm(x, &norm1, eps);
            let (mut q, mut k) = (matvec(&wq, &n), matvec(&wk, &n));
            rope(&mut q, hd, pos, config.layers[0].rope.theta);
            rope(&mut k, hd, pos, config.layers[0].rope.theta);
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&wv, &n));
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut attn = vec![0f32; config.num_heads * hd];
            for head in 0..config.num_heads {
                let kv = head / group;
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let scores: Vec<f32> = (0..=pos)
                    .map(|t| {
                        let k = &ks[t][kv * hd..(kv + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = exps.iter().sum();
                for (t, e) in exps.iter().enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += e / total * vs[t][kv * hd + d];
                    }
                }
            }
            for (xi, o) in x.iter_mut().zip(matvec(&wo, &attn)) {
                *xi += o;
            }
            let n = rms_norm(x, &norm2, eps);
            let act: Vec<f32> = matvec(&gate, &n)
                .iter()
                .zip(matvec(&up, &n))
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (xi, d) in x.iter_mut().zip(matvec(&down, &act)) {
                *xi += d;
            }
        }
    }
    let last = rms_norm(xs.last().unwrap(), &load("model.norm.weight"), eps);
    matvec(&embed, &last)
}

#[test]
fn smollm2_gguf_weights_reproduce_golden_logits() {
    let text = std::fs::read_to_string(golden("smollm2-135m/reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt = json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "short_hi")
        .unwrap();
    let mut ids: Vec<u32> =
        serde_json::from_value(prompt["input_ids_with_special"].clone()).unwrap();
    let greedy: Vec<u32> = serde_json::from_value(prompt["greedy_ids"].clone()).unwrap();
    let step = &prompt["top_logits"][3];
    assert_eq!(step["step"], 3);
    ids.extend(&greedy[..3]);
    let (config, mut weights) = open_model(&smollm2_gguf()).unwrap();
    let logits = reference_logits(&config, weights.as_mut(), &ids);
    for pair in step["topk"].as_array().unwrap() {
        let (id, want) = (
            pair[0].as_u64().unwrap() as usize,
            pair[1].as_f64().unwrap() as f32,
        );
        assert!(
            (logits[id] - want).abs() < 2e-3,
            "token {id}: {} vs golden {want}",
            logits[id]
        );
    }
}

#[test]
fn gguf_rope_freqs_become_llama3_scaling() {
    let want = Llama3RopeScaling {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let factors = llama3_rope_factors(&want, 500_000.0, 64);
    // Entries run from 1 (high frequencies) through the smooth band to `factor`.
    assert_eq!((factors[0], factors[31]), (1.0, 32.0));
    assert!(factors.iter().any(|&f| f > 1.0 && f < 32.0));
    let base = GgufBuilder::new()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.embedding_length", 128)
        .kv_u32("llama.block_count", 1)
        .kv_u32("llama.feed_forward_length", 256)
        .kv_u32("llama.attention.head_count", 2)
        .kv_f32("llama.rope.freq_base", 500_000.0)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .kv_u32("llama.context_length", 131072)
        .kv_str_array("tokenizer.ggml.tokens", &["a"]);
    let dir = tempfile::tempdir().unwrap();
    let good = base
        .clone()
        .tensor("rope_freqs.weight", &[32], 0, f32_bytes(&factors))
        .build();
    let file = GgufFile::open(&write_temp(dir.path(), "good.gguf", &good)).unwrap();
    assert_eq!(
        ModelConfig::from_gguf(&file).unwrap().layers[0]
            .rope
            .scaling,
        Some(RopeScaling::Llama3(want))
    );

    let mut odd = factors.clone();
    odd[10] *= 1.5;
    let bad = base
        .tensor("rope_freqs.weight", &[32], 0, f32_bytes(&odd))
        .build();
    let file = GgufFile::open(&write_temp(dir.path(), "bad.gguf", &bad)).unwrap();
    let msg = error_of(ModelConfig::from_gguf(&file));
    assert!(
        msg.contains("rope_freqs.weight") && msg.contains("bad.gguf"),
        "{msg}"
    );
}
