#!/usr/bin/env bash
# One run, one machine: our `engine bench` against llama.cpp's `llama-batched-bench` on the same
# GGUF file, 2 threads each, one after the other (keep the machine otherwise idle):
# - prefill and decode tok/s at batch 1, 4 and 16 (128 prompt + 128 generated tokens each);
# - single-stream decode tok/s at 512, 2048 and 8192 tokens of context (a prompt of the context
#   less 64 tokens, then 64 generated);
# - at single-stream decode, the GB/s each side would stream reading the file's tensor bytes
#   plus its KV cache per token (f16 on both sides), beside the machine's memory bandwidth
#   measured by a STREAM-like copy (2 threads, bytes read + written) in the same run. A lower
#   bound for ours on K-quant and Q5 files: we stream more than the file holds (Q4_K: 4.625
#   bits per weight with its scales, against the file's 4.5; the Q5 types and Q6_K sit on
#   8-bit panels, Q6_K at 8.56 bits against 6.56).
# Usage: [ENGINE=path/to/engine] scripts/cpu-side-by-side.sh [MODEL.gguf] [CONTEXTS]   (PEERS as for
# ../shared/peers/build-llama-cpp.sh; CONTEXTS default "512 2048 8192")
set -euo pipefail
ENGINE=${ENGINE:+$(realpath "$ENGINE")}
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
CONTEXTS=${2:-512 2048 8192}
E=${ENGINE:-./target/release/engine}
PEER="$PEERS/bin/llama-batched-bench"
[ -x "$E" ] || { echo "no engine at $E (build it: cargo build --release)" >&2; exit 1; }
[ -x "$PEER" ] || { echo "run ../shared/peers/build-llama-cpp.sh first (no $PEER)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The machine's memory bandwidth: a 2-thread copy of 256 MiB arrays, best of 10 (STREAM "Copy").
cat >"$tmp/copy.c" <<'C'
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  size_t n = (size_t)256 << 20 >> 3;
  double *a = malloc(n * 8), *b = malloc(n * 8), best = 0;
  #pragma omp parallel for
  for (size_t i = 0; i < n; i++) { a[i] = 1.0; b[i] = 0.0; }
  for (int r = 0; r < 10; r++) {
    double t = omp_get_wtime();
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) b[i] = a[i];
    t = omp_get_wtime() - t;
    double gbs = 2.0 * n * 8 / t / 1e9;
    if (gbs > best) best = gbs;
  }
  printf("%.2f\n", best + b[n / 2] * 0);
  return 0;
}
C
gcc -O3 -fopenmp "$tmp/copy.c" -o "$tmp/copy"
bandwidth=$(OMP_NUM_THREADS=2 "$tmp/copy")

# Model shape from the file: tensor bytes and KV bytes per token of context.
read -r tensor_bytes kv_per_token < <(PYTHONPATH="$(./scripts/pip-target.sh gguf 0.19.0)" python3 - "$MODEL" <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
arch = r.get_field("general.architecture").contents()
f = lambda k: r.get_field(f"{arch}.{k}").contents()
heads, kv_heads, hidden = f("attention.head_count"), f("attention.head_count_kv"), f("embedding_length")
head_dim = r.get_field(f"{arch}.attention.key_length").contents() if r.get_field(f"{arch}.attention.key_length") else hidden // heads
# Hybrid models (qwen35, qwen3next) cache K and V in their attention layers only, and not in
# the MTP blocks past block_count - nextn_predict_layers.
recurrent = r.get_field(f"{arch}.attention.recurrent_layers")
mtp = r.get_field(f"{arch}.nextn_predict_layers")
layers = (f("block_count") - (sum(bool(x) for x in recurrent.contents()) if recurrent else 0)
          - (mtp.contents() if mtp else 0))
print(sum(int(t.n_bytes) for t in r.tensors), 2 * layers * kv_heads * head_dim)
PY
)

ours() { # batch prompt generated -> "prefill_tok/s decode_tok/s"
  $E bench --model "$MODEL" --threads 2 --num-seqs "$1" --max-num-seqs "$1" --max-model-len $(($2 + $3)) \
    --min-input-len "$2" --max-input-len "$2" --min-output-len "$3" --max-output-len "$3" 2>"$tmp/ours.err" |
    awk -F'Throughput: ' '/^Prefill:/{pp=$2+0} /^Decode:/{tg=$2+0} END{print pp, tg}' >"$tmp/ours.out"
  read -r pp tg <"$tmp/ours.out"
  [ -n "$tg" ] && [ "$tg" != 0 ] || { echo "engine bench failed:" >&2; tail -3 "$tmp/ours.err" >&2; exit 1; }
  echo "$pp $tg"
}
peer() { # batches largest_batch prompt generated -> lines "batch prefill_tok/s decode_tok/s"
  "$PEER" -m "$MODEL" -npp "$3" -ntg "$4" -npl "$1" -t 2 -c $(($2 * ($3 + $4) + 64)) -b 2048 -ub 512 -kvu \
    >"$tmp/peer.out" 2>"$tmp/peer.err" || { echo "llama-batched-bench failed:" >&2; tail -3 "$tmp/peer.err" >&2; exit 1; }
  awk -F'|' '$4+0>0 {gsub(/ /,""); print $4, $7, $9}' "$tmp/peer.out"
}

echo "model: $MODEL ($(awk -v b="$tensor_bytes" 'BEGIN{printf "%.1f MB of tensors", b/1e6}')); memory bandwidth (2-thread copy): $bandwidth GB/s"
printf '%-26s %12s %12s %12s %12s %9s %9s\n' case "ours pp/s" "llama pp/s" "ours tg/s" "llama tg/s" prefill decode
# llama.cpp's runs first, then ours: never both at once.
peer 1,4,16 16 128 128 >"$tmp/batches"
while read -r b pp tg; do
  read -r opp otg < <(ours "$b" 128 128)
  awk -v c="batch $b, 128+128" -v op="$opp" -v pp="$pp" -v ot="$otg" -v tg="$tg" \
    'BEGIN { printf "%-26s %12.1f %12.1f %12.1f %12.1f %8.2fx %8.2fx\n", c, op, pp, ot, tg, op/pp, ot/tg }'
done <"$tmp/batches"
for ctx in $CONTEXTS; do
  read -r _ pp tg < <(peer 1 1 $((ctx - 64)) 64)
  read -r opp otg < <(ours 1 $((ctx - 64)) 64)
  awk -v c="1 stream at $ctx context" -v op="$opp" -v pp="$pp" -v ot="$otg" -v tg="$tg" \
    -v w="$tensor_bytes" -v kv="$kv_per_token" -v ctx="$ctx" -v bw="$bandwidth" \
    'BEGIN {
       ours_gbs = ot * (w + 2 * kv * ctx) / 1e9; peer_gbs = tg * (w + 2 * kv * ctx) / 1e9
       printf "%-26s %12.1f %12.1f %12.1f %12.1f %8.2fx %8.2fx   file bytes + KV: ours %.1f GB/s, llama.cpp %.1f GB/s (%.0f%% / %.0f%% of %.1f)\n",
         c, op, pp, ot, tg, op/pp, ot/tg, ours_gbs, peer_gbs, 100*ours_gbs/bw, 100*peer_gbs/bw, bw }'
done
