#!/usr/bin/env bash
# Threads that do not fight the load generator (issue 11), measured, not asserted:
#  1. the CPU share of an idle `engine serve` over 10 s (bar: under 2% of a core);
#  2. single-stream decode (128 prompt + 128 new tokens, 2 threads) alone, then beside one
#     busy-looping process that holds a core the way a load generator would (bar: keep at
#     least 40%); the same for llama.cpp's llama-batched-bench when build-llama-cpp.sh
#     has built it (PEERS, default ~/.cache/peers).
# Run from the project root after `cargo build --release`; keep the machine otherwise idle.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PEERS=${PEERS:-$HOME/.cache/peers}
E=./target/release/engine
[ -x "$E" ] && [ -f "$MODEL" ] || { echo "build the engine and run scripts/fetch-model.sh first"; exit 1; }
hz=$(getconf CLK_TCK)

port=18677
"$E" serve --model "$MODEL" --port "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
t0=$(ticks); sleep 10; t1=$(ticks)
kill $server; wait $server 2>/dev/null || true
awk -v d=$((t1 - t0)) -v hz="$hz" 'BEGIN { printf "idle engine serve: %d ticks in 10 s = %.2f%% of a core\n", d, 100 * d / hz / 10 }'

busy() { sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!; }
ours() {
  "$E" bench --model "$MODEL" --num-seqs 1 --max-num-seqs 1 --min-input-len 128 --max-input-len 128 \
    --min-output-len 128 --max-output-len 128 2>/dev/null | awk -F'Throughput: ' '/^Decode:/{print $2+0}'
}
peer() {
  "$PEERS/bin/llama-batched-bench" -m "$MODEL" -npp 128 -ntg 128 -npl 1 -t 2 -c 4096 -b 2048 -ub 512 -kvu 2>/dev/null |
    awk -F'|' '$4+0 == 1 {gsub(/ /, ""); print $9}'
}
report() {
  local name=$1 alone beside hog
  alone=$($2)
  hog=$(busy); beside=$($2); kill "$hog"
  awk -v n="$name" -v a="$alone" -v b="$beside" \
    'BEGIN { printf "%-22s decode alone %7.1f tok/s, beside a busy process %7.1f tok/s: keeps %.0f%%\n", n, a, b, 100 * b / a }'
}
report "engine" ours
if [ -x "$PEERS/bin/llama-batched-bench" ]; then report "llama.cpp ($(basename "$MODEL" .gguf | sed 's/.*\.//'))" peer; fi
