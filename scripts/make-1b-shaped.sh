#!/usr/bin/env bash
# A random model with Llama-3.2-1B's layer shapes (hidden 2048, 16 layers, 32 query / 8 KV heads
# of 64, FFN 8192, tied embeddings, rope theta 500000) and the default model's tokenizer
# (SmolLM2's 49,152-token BPE, merges and chat template, copied from its GGUF), written in F16
# by PyPI gguf, then quantised by llama.cpp's llama-quantize to Q4_K_M, Q4_0 and Q8_0: the
# layer shapes where decode is bound by memory bandwidth, for scripts/cpu-side-by-side.sh.
# Weights ~ N(0, 0.02). Not committed (2.1 GB in F16); written to $OUT (default
# $PEERS/models). Usage: scripts/make-1b-shaped.sh   (after ../shared/peers/build-llama-cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
OUT=${OUT:-$PEERS/models}
quantize="$PEERS/bin/llama-quantize"
[ -x "$quantize" ] || { echo "run ../shared/peers/build-llama-cpp.sh first (no $quantize)" >&2; exit 1; }
./scripts/fetch-model.sh >/dev/null
mkdir -p "$OUT"
f16="$OUT/llama-1b-shaped.F16.gguf"
if [ ! -f "$f16" ]; then
  PYTHONPATH="$(./scripts/pip-target.sh gguf 0.19.0):scripts" python3 - models/SmolLM2-135M-Instruct.Q4_1.gguf "$f16.part" <<'PY'
import sys
import numpy as np
import gguf
from gguf_llama import add_norms_and_write, add_random_layers

src = gguf.GGUFReader(sys.argv[1])
get = lambda key: src.get_field(key).contents()
tokens = get("tokenizer.ggml.tokens")
hidden, ffn, layers, heads, kv_heads, head_dim = 2048, 8192, 16, 32, 8, 64
rng = np.random.default_rng(1)
normal = lambda *shape: (rng.standard_normal(size=shape, dtype=np.float32) * 0.02).astype(np.float16)
w = gguf.GGUFWriter(sys.argv[2], "llama")
w.add_name("llama-1b-shaped")
w.add_block_count(layers)
w.add_context_length(8192)
w.add_embedding_length(hidden)
w.add_feed_forward_length(ffn)
w.add_head_count(heads)
w.add_head_count_kv(kv_heads)
w.add_key_length(head_dim)
w.add_value_length(head_dim)
w.add_rope_freq_base(500000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre(get("tokenizer.ggml.pre"))
w.add_token_list(tokens)
w.add_token_types(get("tokenizer.ggml.token_type"))
w.add_token_merges(get("tokenizer.ggml.merges"))
w.add_bos_token_id(get("tokenizer.ggml.bos_token_id"))
w.add_eos_token_id(get("tokenizer.ggml.eos_token_id"))
w.add_chat_template(get("tokenizer.chat_template"))
w.add_tensor("token_embd.weight", normal(len(tokens), hidden))
add_random_layers(w, normal, layers, hidden, ffn, heads * head_dim, kv_heads * head_dim)
add_norms_and_write(w, hidden, layers)
PY
  mv "$f16.part" "$f16"
fi
for type in Q4_K_M Q4_0 Q8_0; do
  out="$OUT/llama-1b-shaped.$type.gguf"
  if [ ! -f "$out" ]; then
    "$quantize" "$f16" "$out.part" "$type" >"$out.log" 2>&1 || { tail -5 "$out.log" >&2; exit 1; }
    mv "$out.part" "$out"
  fi
  echo "$out"
done
