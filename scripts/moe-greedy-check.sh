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
[ -x "$PEERS/bin/llama-server" ] || { echo "run ../shared/peers/build-llama-cpp.sh first" >&2; exit 1; }
[ -x target/release/engine ] || { echo "build the engine first: cargo build --release" >&2; exit 1; }
export LD_LIBRARY_PATH="$PEERS/bin:${LD_LIBRARY_PATH:-}"
[ -f "$OUT/$MODEL.f32.gguf" ] || /tmp/refenv/bin/python scripts/make-moe-bench-models.py "$OUT"
pids=()
trap 'kill ${pids[@]+"${pids[@]}"} 2>/dev/null || true' EXIT
wait_up() { for _ in $(seq 1 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; echo "no server at $1" >&2; exit 1; }
for scheme in F16 Q4_K_M; do
  file="$OUT/$MODEL.$scheme.gguf"
  if [ ! -f "$file" ]; then
    "$PEERS/bin/llama-quantize" "$OUT/$MODEL.f32.gguf" "$file.part" "$scheme" 2 >"$file.log" 2>&1 || { tail -5 "$file.log" >&2; exit 1; }
    mv "$file.part" "$file"
  fi
  "$PEERS/bin/llama-server" -m "$file" --port 8321 -t 2 -c 2048 >/dev/null 2>&1 & pids+=($!)
  target/release/engine serve --model "$file" --device cpu --port 8322 --threads 2 >"$OUT/engine-serve.log" 2>&1 & pids+=($!)
  "$PEERS/bin/llama-server" -m "$file" --port 8323 -t 2 -c 2048 -fa off >/dev/null 2>&1 & pids+=($!)
  wait_up http://127.0.0.1:8321; wait_up http://127.0.0.1:8322; wait_up http://127.0.0.1:8323
  python3 scripts/token-greedy-agreement.py "$MODEL $scheme: llama-server vs engine" llama:8321 engine:8322 | tail -1
  python3 scripts/token-greedy-agreement.py "$MODEL $scheme: llama-server vs itself -fa off" llama:8321 llama:8323 | tail -1
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
done
