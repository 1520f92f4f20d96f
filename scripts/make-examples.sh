#!/usr/bin/env bash
# Regenerates reports/examples/: one knee search (sweep --rates search) + capacity plan + online A/B compare,
# all against the built-in mock server, and records how long each step took.
#
#   scripts/make-examples.sh            # work files in target/examples-work/
#
# The mock for the sweep has 4 slots and a 100 ms service time (20 ms TTFT + 16 × 5 ms ITL
# with 17 output tokens), so it saturates at 4 / 0.1 s = 40 req/s. The comparison runs the
# mock against itself with a 15% longer TTFT on B (`--ttft-factor 1.15`), each side started by
# loadgen for every round (--a-cmd / --b-cmd), 4 rounds per side in the order A B B A A B B A.
# Only the small files are kept (report.md, report.html, sweep/plan/compare/summary JSON);
# the records stay in the work folder.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p loadgen
bin=target/release/loadgen
work=target/examples-work
examples=reports/examples
rm -rf "$work"
mkdir -p "$work" "$examples"

"$bin" mock-server --port 18431 --ttft 20ms --itl 5ms --slots 4 >"$work/mock.log" 2>&1 &
mock=$!
trap 'kill "$mock" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  curl -sf http://127.0.0.1:18431/health >/dev/null && break
  sleep 0.1
done

timed() { # timed NAME COMMAND…: runs it, appends "NAME: N s" to the timings
  local name=$1 start end
  shift
  start=$(date +%s.%N)
  "$@"
  end=$(date +%s.%N)
  printf '%s: %.1f s\n' "$name" "$(echo "$end - $start" | bc)" >>"$work/timings.txt"
}

timed "sweep (--rates search: probe + levels)" "$bin" sweep --url http://127.0.0.1:18431 \
  --workload random --random-input-len 32 --random-output-len 17 \
  --rates search --probe-duration 2s \
  --warmup 1s --duration 5s --seed 1 --slo ttft:p99:300ms,tpot:p99:20ms \
  --no-progress --out "$work/sweep" >"$work/sweep.txt"
timed "plan" "$bin" plan "$work/sweep" --target-qps 100 --gpus-per-instance 1 \
  --headroom 1.2 --gpu-hour-usd 2.5 >"$work/plan.txt"
kill "$mock" 2>/dev/null || true
timed "compare (online, --a-cmd/--b-cmd, 4 rounds per side)" "$bin" compare \
  --a-cmd "$bin mock-server --ttft 20ms --itl 5ms" \
  --b-cmd "$bin mock-server --ttft 20ms --itl 5ms --ttft-factor 1.15" \
  --rounds 4 --workload random --random-input-len 32 --random-output-len 17 \
  --rate 20 --warmup 1s --duration 2s --seed 2 --no-progress \
  --out "$work/compare" >"$work/compare.txt"

rm -rf "$examples/sweep" "$examples/compare"
mkdir -p "$examples/sweep" "$examples/compare"
cp "$work/sweep/"{sweep.json,plan.json,report.md,report.html} "$examples/sweep/"
for level in "$work/sweep"/level-*; do
  cp "$level/summary.json" "$examples/sweep/$(basename "$level")-summary.json"
done
cp "$work/sweep.txt" "$work/plan.txt" "$examples/sweep/"
cp "$work/compare/"{compare.json,report.md,report.html} "$work/compare.txt" "$examples/compare/"
cp "$work/timings.txt" "$examples/timings.txt"
cat "$work/timings.txt"
du -sh "$examples"
