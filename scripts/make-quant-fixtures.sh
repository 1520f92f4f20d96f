#!/usr/bin/env bash
# Writes the quantised GGUF fixtures of engine/tests/quant_formats.rs:
# - the tiny golden models (../shared/golden/llama-tiny, bf16, untied head; qwen3-tiny/f32,
#   tied embeddings) with every 2-D weight quantised by PyPI's gguf (gguf-py, llama.cpp's own
#   Python quantiser) to Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1, norms kept in f32, and Llama's Q/K
#   rows permuted the way llama.cpp's converter does;
# - blocks.gguf: random blocks of every quantised type the engine reads, each beside gguf-py's
#   own dequantisation of them (`<type>.ref`, f32);
# - kquant-tiny.gguf: a random Llama whose rows are 256 wide (K-quant super-blocks), its
#   weights random blocks in a Q4_K_M-like mix (layer 0: Q4_K with Q6_K attn_v / ffn_down, as
#   llama-quantize mixes them; layer 1: Q5_1 attention, Q5_K gate / up, Q5_0 down; output
#   Q6_K), and kquant-tiny.F32.gguf, the same model with
#   every weight as gguf-py dequantises it. gguf-py cannot quantise to K-quants, so these
#   are blocks rather than quantised trained weights: they check the reading of each layout
#   (and the mixing of types in one file) against an independent dequantiser.
# - for each committed llama-quantize fixture (engine/tests/fixtures/llama-quantize, made by
#   scripts/make-llama-quantize-fixtures.sh), `<name>.twin.gguf`: the same model with every
#   weight as gguf-py dequantises it.
# Installs gguf==0.19.0 (and numpy) into a per-user cache on the first run. Idempotent;
# prints the fixture folder (default target/quant-fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/quant-fixtures}
dir=$(./scripts/pip-target.sh gguf 0.19.0)
mkdir -p "$out"
PYTHONPATH="$dir:scripts" python3 - ../shared/golden "$out" engine/tests/fixtures/llama-quantize <<'PY'
import json, os, struct, sys
import numpy as np
import gguf
from gguf_llama import add_norms_and_write

golden, out, committed = sys.argv[1], sys.argv[2], sys.argv[3]

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
    for qname in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]:
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

rng = np.random.default_rng(29)
Q = gguf.GGMLQuantizationType

def random_blocks(qtype, rows, cols, scale):
    """Random blocks of `qtype` for a rows x cols weight: random bytes, then f16 scales
    (d, and dmin or m where the type has one) giving weights of about `scale`, each block's
    own (times 0.5 to 1.5)."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // elems, nbytes), dtype=np.uint8)
    f16 = lambda x: (x * rng.uniform(0.5, 1.5, size=(blocks.shape[0], 1))).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:  # d is last: weight = d * int8 scale * (q - 32)
        blocks[:, -2:] = f16(scale / (32 * 64))
    elif qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin: weight = d * sc * q - dmin * min
        top = 15 if qtype == Q.Q4_K else 31
        blocks[:, 0:2] = f16(2 * scale / (top * 32))
        blocks[:, 2:4] = f16(scale / 32)
    elif qtype in (Q.Q4_1, Q.Q5_1):  # d, m: weight = d * q + m
        top = 15 if qtype == Q.Q4_1 else 31
        blocks[:, 0:2] = f16(2 * scale / top)
        blocks[:, 2:4] = f16(-scale)
    else:  # Q8_0, Q4_0, Q5_0: weight = d * signed q
        half = {Q.Q8_0: 127, Q.Q4_0: 8, Q.Q5_0: 16}[qtype]
        blocks[:, 0:2] = f16(scale / half)
    return blocks.reshape(rows, cols // elems * nbytes)

def dequantized(raw, qtype):
    return gguf.quants.dequantize(raw, qtype).astype(np.float32)

w = gguf.GGUFWriter(os.path.join(out, "blocks.gguf"), "blocks")
for qname in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]:
    raw = random_blocks(Q[qname], 4, 512, 0.1)
    w.add_tensor(qname, raw, raw_dtype=Q[qname])
    w.add_tensor(qname + ".ref", dequantized(raw, Q[qname]))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

hidden, ffn, layers, heads, kv_heads, vocab = 256, 512, 2, 4, 2, 320
head_dim = hidden // heads
shapes = {"token_embd.weight": ((vocab, hidden), Q.Q4_K), "output.weight": ((vocab, hidden), Q.Q6_K)}
for i in range(layers):
    shapes.update({
        f"blk.{i}.attn_q.weight": ((hidden, hidden), Q.Q4_K if i == 0 else Q.Q5_1),
        f"blk.{i}.attn_k.weight": ((kv_heads * head_dim, hidden), Q.Q4_K if i == 0 else Q.Q5_1),
        f"blk.{i}.attn_v.weight": ((kv_heads * head_dim, hidden), Q.Q6_K if i == 0 else Q.Q5_1),
        f"blk.{i}.attn_output.weight": ((hidden, hidden), Q.Q4_K if i == 0 else Q.Q5_1),
        f"blk.{i}.ffn_gate.weight": ((ffn, hidden), Q.Q4_K if i == 0 else Q.Q5_K),
        f"blk.{i}.ffn_up.weight": ((ffn, hidden), Q.Q4_K if i == 0 else Q.Q5_K),
        f"blk.{i}.ffn_down.weight": ((hidden, ffn), Q.Q6_K if i == 0 else Q.Q5_0),
    })
weights = {name: random_blocks(qtype, *shape, 0.08) for name, (shape, qtype) in shapes.items()}
for suffix, as_f32 in [("", False), (".F32", True)]:
    w = gguf.GGUFWriter(os.path.join(out, f"kquant-tiny{suffix}.gguf"), "llama")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_eos_token_id(0)
    for name, (shape, qtype) in shapes.items():
        raw = weights[name]
        if as_f32:
            w.add_tensor(name, dequantized(raw, qtype))
        else:
            w.add_tensor(name, raw, raw_dtype=qtype)
    add_norms_and_write(w, hidden, layers)

for name in sorted(os.listdir(committed)) if os.path.isdir(committed) else []:
    r = gguf.GGUFReader(os.path.join(committed, name))
    field = lambda key: r.get_field(key).contents()
    w = gguf.GGUFWriter(os.path.join(out, name.replace(".gguf", ".twin.gguf")), "llama")
    w.add_block_count(field("llama.block_count"))
    w.add_context_length(field("llama.context_length"))
    w.add_embedding_length(field("llama.embedding_length"))
    w.add_feed_forward_length(field("llama.feed_forward_length"))
    w.add_head_count(field("llama.attention.head_count"))
    w.add_head_count_kv(field("llama.attention.head_count_kv"))
    w.add_rope_freq_base(field("llama.rope.freq_base"))
    w.add_layer_norm_rms_eps(field("llama.attention.layer_norm_rms_epsilon"))
    w.add_token_list(field("tokenizer.ggml.tokens"))
    w.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
PY
echo "$out"
