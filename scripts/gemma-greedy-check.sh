#!/usr/bin/env bash
# Gemma 3 270M (Q4_K_M, `scripts/fetch-model.sh gemma3`) answered greedily by llama-server
# and by `engine serve` on the same file: for 4 prompts (PROMPTS=32 for 32), 16 tokens each
# (`ignore_eos`), prints how many leading tokens agree (both answers tokenised by our
# /tokenize). AGAINST=llama-fa-off compares llama-server with itself instead (its default,
# flash attention on, against `-fa off`): the yardstick of how far llama.cpp's own
# arithmetic moves greedy answers. WEIGHTS as for `engine serve --quantized-weights`
# (default: its own choice).
# Usage: [AGAINST=llama-fa-off] [PROMPTS=32] [WEIGHTS=integer|dequantize] scripts/gemma-greedy-check.sh
#   (llama.cpp from ../shared/peers/build-llama-cpp.sh; PEERS as there)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
MODEL=models/gemma-3-270m-q4_k_m.gguf
[ -x "$PEERS/bin/llama-server" ] || { echo "run ../shared/peers/build-llama-cpp.sh first" >&2; exit 1; }
[ -f "$MODEL" ] || ./scripts/fetch-model.sh gemma3
[ -x target/release/engine ] || { echo "build the engine first: cargo build --release" >&2; exit 1; }
case "${AGAINST:-engine}" in engine | llama-fa-off) ;; *) echo "AGAINST must be engine or llama-fa-off, not '$AGAINST'" >&2; exit 1 ;; esac
case "${PROMPTS:-4}" in 4 | 32) ;; *) echo "PROMPTS must be 4 or 32, not '$PROMPTS'" >&2; exit 1 ;; esac
pids=()
trap 'kill ${pids[@]+"${pids[@]}"} 2>/dev/null || true' EXIT
wait_up() { for _ in $(seq 1 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; echo "no server at $1" >&2; exit 1; }
"$PEERS/bin/llama-server" -m "$MODEL" --port 8321 -t 2 -c 2048 >/dev/null 2>&1 & pids+=($!)
weights=()
[ -n "${WEIGHTS:-}" ] && weights=(--quantized-weights "$WEIGHTS")
# Our server tokenises both answers, whichever pair is compared.
target/release/engine serve --model "$MODEL" --port 8322 --threads 2 "${weights[@]+"${weights[@]}"}" >/dev/null 2>&1 & pids+=($!)
second=8322
if [ "${AGAINST:-engine}" = llama-fa-off ]; then
  "$PEERS/bin/llama-server" -m "$MODEL" --port 8323 -t 2 -c 2048 -fa off >/dev/null 2>&1 & pids+=($!)
  second=8323
  wait_up http://127.0.0.1:8323
fi
wait_up http://127.0.0.1:8321; wait_up http://127.0.0.1:8322
python3 scripts/greedy-agreement.py "gemma-3-270m Q4_K_M" 8321 "$second" "${AGAINST:-engine}" 8322 "${PROMPTS:-4}"
