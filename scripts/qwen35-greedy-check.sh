#!/usr/bin/env bash
# Our Qwen3.5 beside llama.cpp's on the random Qwen3.5-0.8B-shaped model of
# scripts/make-qwen35-shaped.sh (its Q4_K_M, or the F16 file given as MODEL): greedy answers (16 tokens, EOS ignored) to 12 seeded text
# prompts from llama-server (its token ids: `return_tokens`) and from `engine generate
# --logprobs` (its `token_ids`), then llama-server against itself with flash attention off
# (how far llama.cpp's own arithmetic moves a random model's answers). Each pair's leading
# agreeing tokens, and a summary line.
# Usage: scripts/qwen35-greedy-check.sh [MODEL.gguf]   (llama.cpp from
#   ../shared/peers/build-llama-cpp.sh; PEERS as there)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
MODEL=${1:-$PEERS/models/qwen35-0.8b-shaped.Q4_K_M.gguf}
source scripts/peer-servers.sh
tmp=$(mktemp -d)
trap 'stop_servers; rm -rf "$tmp"' EXIT
python3 - "$tmp/prompts.txt" <<'PY'
import random, sys
words = "the cat sat on a mat while rain fell over quiet hills and rivers ran to seas".split()
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    for _ in range(12):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randrange(4, 24))) + "\n")
PY
target/release/engine generate --model "$MODEL" --threads 2 --prompt-file "$tmp/prompts.txt" \
  --max-tokens 16 --temperature 0 --ignore-eos --logprobs 2>/dev/null >"$tmp/engine.jsonl"
llama_server 8331 "$MODEL"
llama_server 8333 "$MODEL" -fa off
wait_up http://127.0.0.1:8331; wait_up http://127.0.0.1:8333
python3 - "$tmp/prompts.txt" "$tmp/engine.jsonl" <<'PY'
import json, sys, urllib.request
prompts = open(sys.argv[1]).read().splitlines()
ours = [json.loads(line)["token_ids"] for line in open(sys.argv[2])]
def llama(port, prompt):
    body = {"prompt": prompt, "n_predict": 16, "temperature": 0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))["tokens"]
def leading(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k
for label, pairs in [("llama-server vs engine", lambda p, i: (llama(8331, p), ours[i])),
                     ("llama-server vs itself -fa off", lambda p, i: (llama(8331, p), llama(8333, p)))]:
    runs = [leading(*pairs(p, i)) for i, p in enumerate(prompts)]
    print(f"{label}: {sum(r == 16 for r in runs)}/{len(runs)} identical, leading agreement {runs}")
PY
