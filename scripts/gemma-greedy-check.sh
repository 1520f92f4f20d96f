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
[ -f "$MODEL" ] || ./scripts/fetch-model.sh gemma3
case "${AGAINST:-engine}" in engine | llama-fa-off) ;; *) echo "AGAINST must be engine or llama-fa-off, not '$AGAINST'" >&2; exit 1 ;; esac
case "${PROMPTS:-4}" in 4 | 32) ;; *) echo "PROMPTS must be 4 or 32, not '$PROMPTS'" >&2; exit 1 ;; esac
source scripts/peer-servers.sh
llama_server 8321 "$MODEL"
weights=()
[ -n "${WEIGHTS:-}" ] && weights=(--quantized-weights "$WEIGHTS")
# Our server tokenises both answers, whichever pair is compared.
engine_server 8322 "$MODEL" ${weights[@]+"${weights[@]}"}
second=8322
if [ "${AGAINST:-engine}" = llama-fa-off ]; then
  llama_server 8323 "$MODEL" -fa off
  second=8323
  wait_up http://127.0.0.1:8323
fi
wait_up http://127.0.0.1:8321; wait_up http://127.0.0.1:8322
python3 scripts/greedy-agreement.py "gemma-3-270m Q4_K_M" 8321 "$second" "${AGAINST:-engine}" 8322 "${PROMPTS:-4}"
