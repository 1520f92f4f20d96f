#!/usr/bin/env bash
# A random model with Qwen3.5-0.8B's layer shapes (hidden 1024, 24 layers: 18 Gated DeltaNet
# layers of 16 key and 16 value heads of 128 and 6 gated attention layers of 8 query / 2 KV
# heads of 256, FFN 3584, 248,320-token tied embeddings), made by transformers with its own
# initialisation (weights ~ N(0, 0.02)), converted by llama.cpp's convert_hf_to_gguf.py to F16
# (scripts/make-references.py's llama_cpp_converter: a 256-token byte-level tokenizer, the
# other ids padding) and quantised by llama-quantize to Q4_K_M: for scripts/cpu-side-by-side.sh
# and engine bench. Not committed (1.5 GB in F16); written to $OUT (default $PEERS/models).
# Needs torch and transformers (see scripts/make-references.py) in $PYTHON.
# Usage: PYTHON=/tmp/refenv/bin/python scripts/make-qwen35-shaped.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
OUT=${OUT:-$PEERS/models}
PYTHON=${PYTHON:-python3}
quantize="$PEERS/bin/llama-quantize"
[ -x "$quantize" ] || { echo "run ../shared/peers/build-llama-cpp.sh first (no $quantize)" >&2; exit 1; }
mkdir -p "$OUT"
f16="$OUT/qwen35-0.8b-shaped.F16.gguf"
if [ ! -f "$f16" ]; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  "$PYTHON" - "$dir" "$f16.part" <<'PY'
import os, sys
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import importlib.util
spec = importlib.util.spec_from_file_location("refs", "scripts/make-references.py")
refs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(refs)
from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM
folder, out = sys.argv[1], sys.argv[2]
torch.manual_seed(1)
config = Qwen3_5TextConfig(
    vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, max_position_embeddings=32768, tie_word_embeddings=True,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                     "partial_rotary_factor": 0.25})
config.architectures = ["Qwen3_5ForCausalLM"]
with torch.device("cpu"):
    model = Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()
config.save_pretrained(folder)
model.save_pretrained(folder, safe_serialization=True)
del model
refs.llama_cpp_converter(None, config, os.path.join(folder, "model.gguf"), outtype="f16")
os.replace(os.path.join(folder, "model.gguf"), out)
PY
  mv "$f16.part" "$f16"
fi
out="$OUT/qwen35-0.8b-shaped.Q4_K_M.gguf"
if [ ! -f "$out" ]; then
  "$quantize" "$f16" "$out.part" Q4_K_M > "$out.log" 2>&1
  mv "$out.part" "$out"
fi
ls -l "$OUT"/qwen35-0.8b-shaped.*.gguf
