#!/usr/bin/env bash
# How close the CPU's default path (integer kernels on the quantised blocks, activations
# rounded to 8 bits) stays to the model's own numbers (`--quantized-weights dequantize`: f32
# on the dequantised weights), beside how close llama.cpp's `llama-server` stays to them, on
# one GGUF file (default: the default model; `gemma3` for Gemma 3 270M Q4_K_M):
#  - greedy agreement over 32 prompts, 16 tokens each (leading tokens that agree; prompts with
#    at least 8), each server against the dequantised one;
#  - at the 17 contexts along each prompt's dequantised answer, the next token's top-1 match
#    and the largest and mean gap between each server's log-probability of the reference's
#    top-1 token and the reference's (scripts/logprob-gap.py).
# Usage: scripts/integer-accuracy-check.sh [gemma3 | FILE]   (llama.cpp from
#   ../shared/peers/build-llama-cpp.sh; PEERS as there)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
case "${1:-}" in
  "") MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf; [ -f "$MODEL" ] || ./scripts/fetch-model.sh ;;
  gemma3) MODEL=models/gemma-3-270m-q4_k_m.gguf; [ -f "$MODEL" ] || ./scripts/fetch-model.sh gemma3 ;;
  *) MODEL=$1 ;;
esac
[ -f "$MODEL" ] || { echo "no model file $MODEL" >&2; exit 1; }
source scripts/peer-servers.sh
llama_server 8321 "$MODEL"
engine_server 8322 "$MODEL" --quantized-weights dequantize
engine_server 8324 "$MODEL"
wait_up http://127.0.0.1:8321; wait_up http://127.0.0.1:8322; wait_up http://127.0.0.1:8324
label=$(basename "$MODEL")
python3 scripts/greedy-agreement.py "$label" 8321 8322 dequantised 8322 32 | tail -1
python3 scripts/greedy-agreement.py "$label (engine default as the first)" 8324 8322 dequantised 8322 32 | tail -1
python3 scripts/logprob-gap.py "$label" 8322 8322 engine-default=8324 llama-server=8321 ${PROMPTS:+--prompts $PROMPTS}
