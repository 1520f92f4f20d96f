#!/usr/bin/env bash
# Makes the committed K-quant fixtures of engine/tests/quant_formats.rs with llama.cpp's own
# llama-quantize (built by ../shared/peers/build-llama-cpp.sh), so that CI needs no llama.cpp:
# a random Llama whose rows are 256 wide (hidden 256, FFN 512, 2 layers, 4 query / 2 KV
# heads, 320 tokens; weights ~ N(0, 0.05), written in F32 by PyPI gguf), quantised to Q4_K_M,
# Q5_K_M and Q6_K into engine/tests/fixtures/llama-quantize/. llama-quantize chooses each
# tensor's type as it does for downloaded files (Q4_K_M: Q6_K for the output and half of
# attn_v / ffn_down, Q4_K elsewhere). scripts/make-quant-fixtures.sh writes, for each, a
# twin holding PyPI gguf's dequantisation of every weight.
# Usage: scripts/make-llama-quantize-fixtures.sh   (PEERS as for build-llama-cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
quantize="$PEERS/bin/llama-quantize"
[ -x "$quantize" ] || { echo "run ../shared/peers/build-llama-cpp.sh first (no $quantize)" >&2; exit 1; }
out=engine/tests/fixtures/llama-quantize
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$(./scripts/pip-target.sh gguf 0.19.0)
PYTHONPATH="$dir:scripts" python3 - "$tmp/tiny-256.F32.gguf" <<'PY'
import sys
import numpy as np
import gguf
from gguf_llama import add_norms_and_write, add_random_layers

hidden, ffn, layers, heads, kv_heads, vocab = 256, 512, 2, 4, 2, 320
rng = np.random.default_rng(256)
normal = lambda *shape: rng.normal(0.0, 0.05, size=shape).astype(np.float32)
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_name("tiny-256")
w.add_block_count(layers)
w.add_context_length(512)
w.add_embedding_length(hidden)
w.add_feed_forward_length(ffn)
w.add_head_count(heads)
w.add_head_count_kv(kv_heads)
w.add_rope_freq_base(10000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
w.add_token_list([f"t{i}" for i in range(vocab)])
w.add_eos_token_id(0)
kv = kv_heads * hidden // heads
w.add_tensor("token_embd.weight", normal(vocab, hidden))
w.add_tensor("output.weight", normal(vocab, hidden))
add_random_layers(w, normal, layers, hidden, ffn, hidden, kv)
add_norms_and_write(w, hidden, layers)
PY
for type in Q4_K_M Q5_K_M Q6_K; do
  "$quantize" "$tmp/tiny-256.F32.gguf" "$out/tiny-256.$type.gguf" "$type" >"$tmp/$type.log" 2>&1 ||
    { cat "$tmp/$type.log" >&2; exit 1; }
  echo "$out/tiny-256.$type.gguf: $(grep -c 'converting to' "$tmp/$type.log" || true) tensors quantised"
done
