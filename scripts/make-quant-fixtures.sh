#!/usr/bin/env bash
# Writes the quantised GGUF fixtures of engine/tests/quant_formats.rs: the tiny golden models
# (../shared/golden/llama-tiny, bf16, untied head; qwen3-tiny/f32, tied embeddings) with every
# 2-D weight quantised by PyPI's gguf (gguf-py, llama.cpp's own Python quantiser) to Q8_0,
# Q4_0 and Q4_1, norms kept in f32, and Llama's Q/K rows permuted the way llama.cpp's
# converter does. An independent writer and quantiser, so the tests check our reading of the
# formats, not only our arithmetic. Installs gguf==0.19.0 (and numpy) into a per-user cache
# on the first run. Idempotent; prints the fixture folder (default target/quant-fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/quant-fixtures}
dir=$(./scripts/pip-target.sh gguf 0.19.0)
mkdir -p "$out"
PYTHONPATH="$dir" python3 - ../shared/golden "$out" <<'PY'
import json, os, struct, sys
import numpy as np
import gguf

golden, out = sys.argv[1], sys.argv[2]

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint8)
        if info["dtype"] == "F32":
            arr = raw.view(np.float32)
        elif info["dtype"] == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name} has dtype {info['dtype']}")
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors

def permute(w, n_head):
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}

def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    stem, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER[stem]}.{suffix}"

for model, rel in [("llama", "llama-tiny"), ("qwen3", "qwen3-tiny/f32")]:
    cfg = json.load(open(os.path.join(golden, rel, "config.json")))
    tensors = read_safetensors(os.path.join(golden, rel, "model.safetensors"))
    for qname in ["Q8_0", "Q4_0", "Q4_1"]:
        qtype = gguf.GGMLQuantizationType[qname]
        path = os.path.join(out, f"{rel.split('/')[0]}.{qname}.gguf")
        w = gguf.GGUFWriter(path, model)
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_token_list([f"t{i}" for i in range(cfg["vocab_size"])])
        w.add_eos_token_id(cfg["eos_token_id"])
        for hf, arr in sorted(tensors.items()):
            if model == "llama" and hf.endswith("q_proj.weight"):
                arr = permute(arr, cfg["num_attention_heads"])
            if model == "llama" and hf.endswith("k_proj.weight"):
                arr = permute(arr, cfg["num_key_value_heads"])
            if arr.ndim == 2:
                w.add_tensor(gguf_name(hf), gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(gguf_name(hf), arr.astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
PY
echo "$out"
