#!/usr/bin/env bash
# Multi-turn chat sessions against `engine serve` on a hybrid model (Qwen3.5's Gated DeltaNet
# beside attention), once per prefix-cache setting: `off` (--no-enable-prefix-caching) and,
# for each number N, --state-checkpoint-every N (0: checkpoints at prompt ends only). Each
# setting gets a fresh server and the same seeded sessions (loadgen run --turns); printed
# per setting: the prefix-cache hit rate, the KV pool the checkpoints held at the end
# (engine:state_checkpoint_blocks × /version's kv_block_bytes) and the checkpoints taken, and
# per turn the median TTFT and the share of its prompt served from the cache.
# Usage: scripts/checkpoint-turns.sh [MODEL.gguf]
#   default model: $PEERS/models/qwen35-0.8b-shaped.Q4_K_M.gguf (scripts/make-qwen35-shaped.sh)
# Knobs: SETTINGS ("off 0 4 16"), TURNS (6), RATE (sessions/s, 0.05), DURATION (150s),
#   INPUT (tokens a user turn, 192), OUTPUT (32), SEED (1), PORT (8137), OUT (runs/checkpoint-turns-<time>).
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-$HOME/.cache/peers}
MODEL=${1:-$PEERS/models/qwen35-0.8b-shaped.Q4_K_M.gguf}
SETTINGS=${SETTINGS:-"off 0 4 16"}
TURNS=${TURNS:-6}
RATE=${RATE:-0.05}
DURATION=${DURATION:-150s}
INPUT=${INPUT:-192}
OUTPUT=${OUTPUT:-32}
SEED=${SEED:-1}
PORT=${PORT:-8137}
OUT=${OUT:-runs/checkpoint-turns-$(date +%Y%m%d-%H%M%S)}
[ -f "$MODEL" ] || { echo "no model at $MODEL (scripts/make-qwen35-shaped.sh makes it)" >&2; exit 1; }
cargo build --release -q -p engine -p loadgen
mkdir -p "$OUT"
url="http://127.0.0.1:$PORT"
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; true' EXIT
for setting in $SETTINGS; do
  case "$setting" in
    off) flags=(--no-enable-prefix-caching) ;;
    *) flags=(--state-checkpoint-every "$setting") ;;
  esac
  ./target/release/engine serve --model "$MODEL" --chat-template templates/qwen3_5.jinja \
    --port "$PORT" --max-model-len 8192 --kv-cache-memory 2GiB "${flags[@]}" \
    > "$OUT/serve-$setting.log" 2>&1 &
  server=$!
  for _ in $(seq 1 120); do curl -sf "$url/health" > /dev/null && break; sleep 1; done
  curl -sf "$url/version" > "$OUT/version-$setting.json"
  ./target/release/loadgen run --url "$url" --backend chat --turns "constant:$TURNS" \
    --rate "$RATE" --duration "$DURATION" --warmup 0s --seed "$SEED" \
    --max-input-len "$INPUT" --max-output-len "$OUTPUT" \
    --extra-body '{"chat_template_kwargs": {"enable_thinking": false}}' \
    --out "$OUT/$setting" > "$OUT/loadgen-$setting.txt" 2>&1
  curl -sf "$url/metrics" > "$OUT/metrics-$setting.txt"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
done
python3 - "$OUT" $SETTINGS <<'PY'
import json, os, sys
out, settings = sys.argv[1], sys.argv[2:]
def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
for s in settings:
    m = open(os.path.join(out, f"metrics-{s}.txt")).read()
    v = json.load(open(os.path.join(out, f"version-{s}.json")))
    q, h = metric(m, "vllm:prefix_cache_queries_total"), metric(m, "vllm:prefix_cache_hits_total")
    mib = metric(m, "engine:state_checkpoint_blocks") * v["kv_block_bytes"] / 2**20
    saved = metric(m, "engine:state_checkpoints_total")
    print(f"{s}: hit rate {h / q if q else 0:.3f} ({h:.0f} of {q:.0f} prompt tokens), "
          f"checkpoints held {mib:.0f} MiB ({saved:.0f} taken, "
          f"{v['state_checkpoint_bytes'] / 2**20:.1f} MiB each)")
    summary = json.load(open(os.path.join(out, s, "summary.json")))
    for t in summary["sessions"]["by_turn"]:
        share = t.get("cached_share")
        print(f"  turn {t['turn']}: {t['completed']} done, prompt {t['prompt_tokens_mean']:.0f} tokens, "
              f"TTFT p50 {t['ttft']['p50']:.0f} ms (mean {t['ttft']['mean']:.0f}), "
              f"cached {'-' if share is None else f'{share:.3f}'}")
PY
echo "results in $OUT"
