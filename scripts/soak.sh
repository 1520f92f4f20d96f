#!/usr/bin/env bash
# Fuzz and soak `engine serve` on the tiny golden Llama (../shared/golden/llama-tiny):
# The KV cache is small (2 MiB, 4,096 tokens) so that the warm-up touches all of it and
# preemption is exercised. scripts/soak.py sends a seeded mix of good and bad requests, floods and hang-ups, checks
# every answer, then that the server is idle, healthy and did not grow (see soak.py).
#   scripts/soak.sh                      # the long form: 10,000 requests
#   scripts/soak.sh --requests 1000      # the short form scripts/test.sh runs
# Other flags go to soak.py (--concurrency, --seed, --bad-fraction, --disconnect-fraction).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-${CARGO_TARGET_DIR:-target}/release/engine}
cargo build --release -q -p engine   # a no-op when up to date: never soak a stale binary
MODEL=${MODEL:-../shared/golden/llama-tiny}
PORT=${PORT:-18631}
MAX_BODY=65536
MAX_LEN=512
LOG=$(mktemp -t soak-serve.XXXXXX)
"$ENGINE" serve --model "$MODEL" --device cpu --threads 1 --port "$PORT" --max-num-seqs 16 \
    --max-waiting-requests 32 --max-body-bytes $MAX_BODY --max-model-len $MAX_LEN \
    --kv-cache-memory 2MiB --served-model-name soak > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    curl -sf "127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { echo "engine serve exited:"; cat "$LOG"; exit 1; }
    sleep 0.2
done
status=0
python3 scripts/soak.py --port "$PORT" --pid $SERVER --max-body-bytes $MAX_BODY --max-model-len $MAX_LEN "$@" || status=$?
if grep -qiE "panicked|ERROR" "$LOG"; then
    echo "the server log has errors:"; grep -iE "panicked|ERROR" "$LOG" | head -10
    status=1
fi
exit $status
