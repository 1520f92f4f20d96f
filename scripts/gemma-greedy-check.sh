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
python3 - "$second" "${AGAINST:-engine}" "${PROMPTS:-4}" <<'PY'
import json, sys, urllib.request
def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
           "The three primary colors are", "The best way to learn a new language is",
           "import numpy as np\n", "Water boils at", "My favourite season is",
           "The mitochondria is", "In 1492, Columbus", "To make a cup of tea, first",
           "The largest planet in the solar system is", "SELECT name FROM users WHERE",
           "Dear hiring manager,", "The quick brown fox", "A healthy breakfast includes",
           "The theory of relativity states that", "Photosynthesis is the process by which",
           "for i in range(10):", "The main causes of climate change are",
           "Shakespeare wrote", "The recipe calls for two cups of", "Machine learning is",
           "The stock market today", "Once the rain stopped, the children",
           "A triangle has", "The human heart has four", "To reverse a string in Python,",
           "The moon orbits", "Good morning! Today we will learn about",
           "The French Revolution began in", "An apple a day"][:int(sys.argv[3])]
second, against = int(sys.argv[1]), sys.argv[2]
agree = []
for p in prompts:
    ask = {"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    texts = [post(port, "/v1/completions", ask)["choices"][0]["text"] for port in (8321, second)]
    ids = [post(8322, "/tokenize", {"prompt": t, "add_special_tokens": False})["tokens"] for t in texts]
    n = next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), min(map(len, ids)))
    agree.append(n)
    print(f"  {p!r}: {n} leading tokens agree\n    llama.cpp: {texts[0]!r}\n    {against + ':':11s}{texts[1]!r}")
print(f"gemma-3-270m Q4_K_M, llama-server against {against}: leading tokens in agreement {agree}; "
      f"prompts with >= 8: {sum(a >= 8 for a in agree)} of {len(prompts)}")
PY
