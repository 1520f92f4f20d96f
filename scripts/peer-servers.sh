# Sourced by the greedy checks (kquant-, gemma- and moe-greedy-check.sh), from the project
# root with PEERS set: llama.cpp's servers beside ours, each started in the background and all
# stopped on exit, and the quantised files they read.
[ -x "$PEERS/bin/llama-server" ] || { echo "run ../shared/peers/build-llama-cpp.sh first" >&2; exit 1; }
[ -x target/release/engine ] || { echo "build the engine first: cargo build --release" >&2; exit 1; }
export LD_LIBRARY_PATH="$PEERS/bin:${LD_LIBRARY_PATH:-}"
pids=()
trap 'kill ${pids[@]+"${pids[@]}"} 2>/dev/null || true' EXIT
# wait_up URL: until its /health answers (60 s), else exit.
wait_up() { for _ in $(seq 1 300); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.2; done; echo "no server at $1" >&2; exit 1; }
# llama_server PORT FILE [FLAGS...]: llama-server on FILE, 2 threads, 2048 positions.
llama_server() { local port=$1 file=$2; shift 2; "$PEERS/bin/llama-server" -m "$file" --port "$port" -t 2 -c 2048 "$@" >/dev/null 2>&1 & pids+=($!); }
# engine_server PORT FILE [FLAGS...]: `engine serve` on FILE, 2 threads.
engine_server() { local port=$1 file=$2; shift 2; target/release/engine serve --model "$file" --port "$port" --threads 2 "$@" >/dev/null 2>&1 & pids+=($!); }
# stop_servers: ends every server started so far.
stop_servers() { kill ${pids[@]+"${pids[@]}"} 2>/dev/null || true; wait ${pids[@]+"${pids[@]}"} 2>/dev/null || true; pids=(); }
# quantized SOURCE FILE SCHEME: FILE made from SOURCE by llama-quantize unless it exists (through
# FILE.part, the log's tail shown on failure).
quantized() {
  [ -f "$2" ] && return 0
  "$PEERS/bin/llama-quantize" "$1" "$2.part" "$3" >"$2.log" 2>&1 || { tail -5 "$2.log" >&2; exit 1; }
  mv "$2.part" "$2"
}
