#!/usr/bin/env bash
# Our Qwen3-MoE beside llama.cpp's on the random MoE of scripts/make-moe-bench-models.py (16
# experts, top 4), as F16 and as Q4_K_M (llama-quantize): greedy answers to 12 random
# token-id prompts from llama-server and `engine serve`, then llama-server against itself with
# flash attention off (how far llama.cpp's own arithmetic moves a random MoE's answers, whose
# routing flips on small differences). DENSE=1 runs the dense model of the same active size.
# Usage: [DENSE=1] scripts/moe-greedy-check.sh   (needs /tmp/refenv as for make-references.py,
#   and llama.cpp from ../shared/peers/build-llama-cpp.sh; PEERS, OUT as below)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
OUT=${OUT:-/tmp/moebench}
MODEL=$([ "${DENSE:-0}" = 1 ] && echo dense-active || echo moe-16x4)
source scripts/peer-servers.sh
[ -f "$OUT/$MODEL.f32.gguf" ] || /tmp/refenv/bin/python scripts/make-moe-bench-models.py "$OUT"
for scheme in F16 Q4_K_M; do
  file="$OUT/$MODEL.$scheme.gguf"
  quantized "$OUT/$MODEL.f32.gguf" "$file" "$scheme"
  llama_server 8331 "$file"
  engine_server 8332 "$file" --device cpu
  llama_server 8333 "$file" -fa off
  wait_up http://127.0.0.1:8331; wait_up http://127.0.0.1:8332; wait_up http://127.0.0.1:8333
  python3 scripts/token-greedy-agreement.py "$MODEL $scheme: llama-server vs engine" llama:8331 engine:8332 | tail -1
  python3 scripts/token-greedy-agreement.py "$MODEL $scheme: llama-server vs itself -fa off" llama:8331 llama:8333 | tail -1
  stop_servers
done
