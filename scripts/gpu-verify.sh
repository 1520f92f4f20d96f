#!/usr/bin/env bash
# The whole GPU check in one device call, from the project root on the device machine.
# Nothing is built there: build here and pack the binaries first with scripts/gpu-pack.sh
# (stripped, xz-compressed, plus the golden tiny models the GPU tests read). Steps, in the
# order they run (most needed first, so that a run cut off at its limit keeps what ran; each
# writes its results to $OUT as it finishes and its wall time to $OUT/times.txt):
#   tests     the GPU tests (tiny models with both prefill and both decode kernels, the
#             windowed Mistral and Phi-3, the tiny Gemma 3 and Gemma 2, the tiny Qwen3-MoEs and
#             the tiny gpt-oss (sinks, MXFP4 experts), graphs, sampling, K-quant GGUFs) and the
#             NVRTC compile tests (H200, 2026-11-28: 156 s)
#   api       `engine serve --device cuda` on the tiny Llama: JSON-schema output (greedy and
#             sampled), a required tool call, a stream (3 s)
#   model     a random Qwen3-0.6B-shaped bf16 model with transformers' reference logprobs,
#             bf16 and f32 (29-40 s)
#   logprobs  those logprobs through `engine serve`: the default kernels, then the direct
#             decode kernel
#   bench     `engine bench`, each decode kernel: one stream (512 + 256) and nano-vLLM's
#             bench.py workload (28-30 s)
#   dims      tensor-core prefill at head dims 64 and 32 (small random models) vs
#             transformers
#   ncu       ncu: decode attention's share of HBM peak at batch 64 x 512 (NCU_DECODE_KERNELS,
#             default the pipelined one), the pipelined kernel's stall reasons at batch 256
#             (NCU_DETAIL=1), every kernel's GPU time over a decode step at batch 256 and at
#             batch 1 (34 s without the detail)
#   ncu-prefill  ncu: the prefill kernels (PREFILL_KERNELS, default mma) over the 16k-token
#             step (7 s a kernel)
#   serve     `loadgen sweep --rates search` (the knee) of `engine serve --device cuda` (chat
#             profile, p99 SLOs, 10-s probe steps (3-s ones, shorter than a chat answer,
#             estimated 5.6 req/s against a knee near 50 on an H200), up to seven levels to an
#             8% bracket), then 40 cut streams
#   peer      the 64-sequence slice beside transformers' generate_batch (not in the default)
# STEPS picks a subset (the default: all but peer). Results go to $OUT (the device tool
# brings them back).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# The device tool brings back at most 8 files: every step appends its summary to
# $OUT/verify.txt and keeps its raw files in $W, packed into $OUT/raw.tar.gz after each step.
W=/tmp/gv
mkdir -p "$W"
V=$OUT/verify.txt
# A step that calls a function this script no longer defines says so in the summary, instead
# of writing nothing (a session once lost its bench step that way).
command_not_found_handle() { echo "gpu-verify.sh: no command or function \`$1\`" | tee -a "$V" >&2; return 127; }
STEPS=${STEPS:-tests api model logprobs bench dims ncu ncu-prefill serve}
T0=$(date +%s)
# Each step's wall time, appended as it ends: `timed NAME` after the step.
LAST=$T0
timed() {
    local now; now=$(date +%s)
    echo "## step $1: $((now - LAST)) s (at $((now - T0)) s)" | tee -a "$V" "$OUT/times.txt"
    LAST=$now
    tar -czf "$OUT/raw.tar.gz" -C "$W" . 2>/dev/null
}
G=/tmp/gbin
mkdir -p $G
for f in .gpu/*.xz; do xz -dc "$f" > "$G/$(basename "$f" .xz)"; done
chmod +x "$G"/*
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$V"
# NVRTC and cuBLAS from the Python environment's nvidia-* wheels when the system has none.
NV=$(python3 -c 'import nvidia, os, glob; print(":".join(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib"))))' 2>/dev/null)
export LD_LIBRARY_PATH=${NV}:${LD_LIBRARY_PATH:-}

if has tests; then
    # The test binary looks for ../shared/golden beside the checkout it was built in.
    BUILT_IN=$(cat .gpu/built-in)
    # ... and for engine/tests/fixtures inside it (the K-quant GGUFs).
    mkdir -p "$BUILT_IN/engine" && ln -sfn "$PWD/.gpu/shared" "$(dirname "$BUILT_IN")/shared"
    ln -sfn "$PWD/engine/tests" "$BUILT_IN/engine/tests"
    (cd "$BUILT_IN" && timeout 300 "$G/cuda-tests" --test-threads=1 --nocapture 2>&1) > "$W/cuda-tests.txt"
    grep -E "^test |test result|panicked|error|relative error|skipped" "$W/cuda-tests.txt" | tee -a "$V"
    (cd "$BUILT_IN" && timeout 60 "$G/nvrtc-tests" 2>&1) > "$W/nvrtc-tests.txt"
    grep -E "test result|FAILED|panicked" "$W/nvrtc-tests.txt" | tee -a "$V"
    timed tests
fi

if has api; then
    # Structured output and tool calls on CUDA (the grammar masks ride in the sampler's
    # metadata): whatever the random model would say, the grammar decides the shape.
    "$G/engine" serve --model .gpu/shared/golden/llama-tiny --device cuda --port 8125 > "$W/serve-api.log" 2>&1 &
    sp=$!
    for _ in $(seq 1 60); do curl -sf localhost:8125/health >/dev/null && break; sleep 1; done
    PYTHONUNBUFFERED=1 timeout 60 python3 - <<'PY' 2>&1 | tee -a "$V"
import json, urllib.request
def post(body):
    req = urllib.request.Request("http://127.0.0.1:8125/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req, timeout=30))
    except Exception as e:
        return {"error": f"{e} {getattr(e, 'read', lambda: b'')()[:300]}"}
person = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}
ok = True
for temperature, seed in [(0.0, 0), (1.0, 11), (1.0, 12)]:
    out = post({"messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 200, "temperature": temperature,
                "seed": seed, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": person}}})
    try:
        v = json.loads(out["choices"][0]["message"]["content"])
        good = (out["choices"][0]["finish_reason"] == "stop" and set(v) == {"name", "age"}
                and 1 <= len(v["name"]) <= 8 and isinstance(v["age"], int) and 0 <= v["age"] <= 120)
    except Exception as e:
        good = False
    ok &= good
    print(f"api: json_schema at temperature {temperature}: {'ok' if good else 'WRONG'}: {str(out)[:300]}")
tools = [{"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
          "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": False}}}]
out = post({"messages": [{"role": "user", "content": "What time is it?"}], "tools": tools, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 100, "temperature": 0})
try:
    call = out["choices"][0]["message"]["tool_calls"][0]["function"]
    good = call["name"] == "get_time" and json.loads(call["arguments"])["tz"] in ("UTC", "CET") and out["choices"][0]["finish_reason"] == "tool_calls"
except Exception:
    good = False
ok &= good
print(f"api: required tool call: {'ok' if good else 'WRONG'}: {str(out)[:300]}")
req = urllib.request.Request("http://127.0.0.1:8125/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 20, "stream": True, "ignore_eos": True}).encode(), {"content-type": "application/json"})
try:
    chunks = [l for l in urllib.request.urlopen(req, timeout=30).read().decode().split("\n") if l.startswith("data: ")]
    good = chunks[-1] == "data: [DONE]" and len(chunks) >= 10
except Exception as e:
    chunks, good = [str(e)], False
ok &= good
print(f"api: stream of 20 tokens: {'ok' if good else 'WRONG'}: {len(chunks)} data lines")
print("api: all ok" if ok else "api: FAILED")
PY
    kill $sp; wait $sp 2>/dev/null
    grep -iE "error|panic" "$W/serve-api.log" | head -5 | tee -a "$V"
    timed api
fi

M=/tmp/q06
# A random Qwen3-shaped bf16 model with transformers' reference logprobs (ref.json):
# make_model DIR HIDDEN LAYERS HEADS KV_HEADS HEAD_DIM FFN.
make_model() {
    PYTHONUNBUFFERED=1 timeout 240 python3 - "$@" <<'PY' 2>&1 | tail -3 | tee -a "$V"
import json, random, sys, shutil, torch
from pathlib import Path
from transformers import Qwen3Config, Qwen3ForCausalLM
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
hidden, layers, heads, kv_heads, head_dim, ffn = map(int, sys.argv[2:8])
torch.manual_seed(0)
cfg = Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
    head_dim=head_dim, intermediate_size=ffn, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
    max_position_embeddings=40960, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
m = Qwen3ForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
m.save_pretrained(out, safe_serialization=True)
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(f".gpu/shared/golden/qwen3-tiny/bf16/{f}", out / f)
rng = random.Random(1); cases = []
with torch.no_grad():
    for n in [1, 7, 64, 513, 1024, 1537, 2000]:
        ids = [rng.randrange(0, 10000) for _ in range(n)]
        lp = torch.log_softmax(m(torch.tensor([ids], device="cuda")).logits[0, -1].float(), -1)
        top = torch.topk(lp, 200)
        cases.append({"ids": ids, "top_ids": top.indices.tolist(), "top_lp": top.values.tolist()})
    # The same model in f32: how far transformers' own bf16 run is from it sets the scale of
    # a bf16 engine's differences.
    m = m.float()
    for c in cases:
        lp = torch.log_softmax(m(torch.tensor([c["ids"]], device="cuda")).logits[0, -1], -1)
        c["top_lp_f32"] = torch.topk(lp, 200).values.tolist()
json.dump(cases, open(out / "ref.json", "w"))
print("model written", out)
PY
}
if has model; then
    # A warm machine keeps the model of an earlier call.
    [ -f $M/ref.json ] || make_model $M 1024 28 16 8 128 3072
    timed model
fi

# Logprobs through `engine serve` against transformers' (the model folder's ref.json): $1 the
# model, $2 names the output files, the rest are extra serve flags.
logprobs_check() {
    local model=$1 tag=$2; shift 2
    "$G/engine" serve --model "$model" --device cuda --port 8123 --max-num-seqs 64 "$@" > "$W/serve$tag.log" 2>&1 &
    sp=$!
    for _ in $(seq 1 120); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
    PYTHONUNBUFFERED=1 timeout 120 python3 - "$model" <<'PY' 2>&1 | sed "s/^/logprobs$tag: /" | tee -a "$V"
import json, sys, urllib.request
cases = json.load(open(sys.argv[1] + "/ref.json"))
name = json.load(urllib.request.urlopen("http://127.0.0.1:8123/v1/models"))["data"][0]["id"]
worst = worst32 = bf16_vs_f32 = 0.0
# Each prompt is sent twice: the repeat hits the prefix cache, and for 513 and 1537 tokens
# (32 and 96 full blocks cached) only the last token is computed, through the decode kernel.
for c in cases:
  for attempt in ("first", "repeat"):
    body = {"model": name, "prompt": c["ids"], "max_tokens": 1, "temperature": 0, "logprobs": 20}
    req = urllib.request.Request("http://127.0.0.1:8123/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        r = json.load(urllib.request.urlopen(req, timeout=60))
    except Exception as e:
        print(f"n={len(c['ids'])}: request failed: {e}", getattr(e, "read", lambda: b"")()[:300]); worst = 99; continue
    lp = r["choices"][0]["logprobs"]
    ours = sorted(lp["top_logprobs"][0].values(), reverse=True)
    ref = c["top_lp"]
    # The tokenizer (49,152 ids) is smaller than the model's vocabulary (151,936): ids past it
    # share one text, so top_logprobs keys collide. Match values, not ids; the greedy token's
    # own logprob is compared with transformers' top-1.
    d = max(min(abs(v - x) for x in ref) for v in ours)
    d1 = abs(lp["token_logprobs"][0] - ref[0])
    worst = max(worst, d, d1)
    ref32 = c["top_lp_f32"]
    worst32 = max(worst32, max(min(abs(v - x) for x in ref32) for v in ours), abs(lp["token_logprobs"][0] - ref32[0]))
    bf16_vs_f32 = max(bf16_vs_f32, max(min(abs(v - x) for x in ref32) for v in ref[:20]), abs(ref[0] - ref32[0]))
    cached = r.get("usage", {}).get("prompt_tokens_details") or {}
    print(f"n={len(c['ids'])} {attempt} (cached {cached.get('cached_tokens', '?')}): greedy token logprob {lp['token_logprobs'][0]:.4f} vs transformers' top-1 {ref[0]:.4f}; "
          f"{len(ours)} distinct top values, each within {d:.4f} of a transformers top-200 value")
print(f"worst |d logprob| = {worst:.4f} from transformers' bf16 run; {worst32:.4f} from its f32 run "
      f"(where transformers' own bf16 run is {bf16_vs_f32:.4f} from it)")
PY
    kill $sp; wait $sp 2>/dev/null
    grep -iE "error|panic" "$W/serve$tag.log" | head -5 | tee -a "$V"
}
bench() {
    local name=$1; shift
    echo "== $name: engine bench $*" | tee -a "$V"
    timeout "${BENCH_TIMEOUT:-150}" "$G/engine" bench --model $M --device cuda --max-num-batched-tokens 16384 "$@" > "$W/bench-$name.txt" 2>&1
    grep -E "Total|Prefill|Decode|rror|panic" "$W/bench-$name.txt" | tee -a "$V"
}
# nano-vLLM's bench.py workload, and the 16k-token prefill step (16 prompts of 1024).
NANO=(--num-seqs 256 --max-num-seqs 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --gpu-memory-utilization 0.9)
P16K=(--num-seqs 16 --max-num-seqs 16 --min-input-len 1024 --max-input-len 1024 --min-output-len 1 --max-output-len 1)
if has logprobs; then
    # The default kernels (tensor-core prefill, two heads a block here; pipelined decode),
    # then the direct decode.
    logprobs_check $M -default
    logprobs_check $M -direct --decode-attention direct
    timed logprobs
fi
if has bench; then
    for k in pipelined direct; do
        bench "decode1-$k" --decode-attention $k --num-seqs 1 --max-num-seqs 1 --min-input-len 512 --max-input-len 512 --min-output-len 256 --max-output-len 256
        bench "nanovllm-$k" --decode-attention $k "${NANO[@]}"
    done
    timed bench
fi
if has dims; then
    # The tensor-core prefill kernel at head dims 64 and 32 (128 is the model step's).
    for d in 64 32; do
        make_model /tmp/qd$d 512 2 8 4 $d 1024
        logprobs_check /tmp/qd$d -mma-d$d --prefill-attention mma
    done
    timed dims
fi

if has ncu; then
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    # A profiled program that ncu gave up on can outlive ncu's timeout and hold the GPU's
    # memory: each run ends by ending any engine left.
    reap() { pkill -f "$G/engine" 2>/dev/null; sleep 2; }
    # (a) Decode attention at batch 64 with 512-token contexts, each kernel: GPU time and
    # DRAM bytes per launch over 28 launches (one per layer) after the warm-up and the
    # prefill, as a share of HBM peak.
    for k in ${NCU_DECODE_KERNELS:-pipelined}; do
        timeout 60 "$NCU" --clock-control none --kernel-name regex:"paged_decode_(g|async)" --launch-skip 112 --launch-count 28 --csv \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
            "$G/engine" bench --model $M --device cuda --decode-attention $k --num-seqs 64 --max-num-seqs 64 \
            --max-num-batched-tokens 16384 --min-input-len 512 --max-input-len 512 --min-output-len 6 --max-output-len 6 \
            > "$W/ncu-decode-$k.csv" 2> "$W/ncu-decode-$k.err"
        reap
    done
    # (a2) Where the pipelined decode kernel stalls (NCU_DETAIL=1; last run on 398abd9's tree):
    # one eager launch at batch 256 with 1024-token contexts (bench.py's regime; the warm-up and
    # the 16 prefill steps, decodes mixed in, come to about 500 launches of it), with ncu's
    # throughput, occupancy, warp-state and memory sections.
    if [ -n "${NCU_DETAIL:-}" ]; then
    timeout 90 "$NCU" --clock-control none --kernel-name regex:paged_decode_async --launch-skip 600 --launch-count 1 --csv --page raw \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section SchedulerStats \
        "$G/engine" bench --model $M --device cuda --decode-attention pipelined --enforce-eager --num-seqs 256 \
        --max-num-seqs 256 --max-num-batched-tokens 16384 --min-input-len 1024 --max-input-len 1024 \
        --min-output-len 24 --max-output-len 24 > "$W/ncu-decode-detail.csv" 2> "$W/ncu-decode-detail.err"
    reap
    python3 - "$W/ncu-decode-detail.csv" <<'PY' | tee -a "$V"
import csv, io, re, sys
text = open(sys.argv[1]).read()
rows = list(csv.reader(io.StringIO(text[text.find('"ID"'):]))) if '"ID"' in text else []
if len(rows) < 3:
    print("ncu detail: nothing profiled")
    sys.exit()
names, units, vals = rows[0], rows[1], rows[2]
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None
got = {n: (num(v), u) for n, u, v in zip(names, units, vals)}
for k in ["Kernel Name", "Grid Size", "Block Size"]:
    print(f"ncu detail: {k} = {vals[names.index(k)] if k in names else '?'}")
for n in ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
          "sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
          "smsp__issue_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
          "launch__occupancy_limit_registers", "smsp__average_warp_latency_per_inst_issued.ratio"]:
    if n in got:
        print(f"ncu detail: {n} = {got[n][0]} {got[n][1]}")
stalls = sorted(((v, n) for n, (v, u) in got.items() if v is not None and re.match(r"smsp__average_warps?_(latency_)?issue_stalled_.*\.ratio$", n)), reverse=True)
for v, n in stalls[:10]:
    print(f"ncu detail: {n} = {v:.3f}")
PY
    fi
    # (b) Every kernel's GPU time over about one decode step at batch 256 and at batch 1
    # (the default kernels), eager so that every kernel is its own launch (batch 256, 512-token prompts: the warm-up
    # and 8 prefill steps come to about 4,000 launches, a decode step to about 320).
    timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 9000 --launch-count 330 \
        "$G/engine" bench --model $M --device cuda --enforce-eager --num-seqs 256 \
        --max-num-seqs 256 --max-num-batched-tokens 16384 --min-input-len 512 --max-input-len 512 \
        --min-output-len 48 --max-output-len 48 > "$W/ncu.csv" 2> "$W/ncu.err"
    reap
    timeout 90 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 2500 --launch-count 330 \
        "$G/engine" bench --model $M --device cuda --enforce-eager --num-seqs 1 \
        --max-num-seqs 1 --min-input-len 512 --max-input-len 512 --min-output-len 16 --max-output-len 16 \
        > "$W/ncu-b1.csv" 2> "$W/ncu-b1.err"
    reap
    python3 - "$W" <<'PY' 2>&1 | tee -a "$V"
import csv, sys, collections, io, os
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
def rows(name):
    path = os.path.join(sys.argv[1], name)
    if not os.path.exists(path):
        return []
    text = open(path).read()
    return list(csv.DictReader(io.StringIO(text[text.find('"ID"'):]))) if '"ID"' in text else []
for k in ["direct", "pipelined"]:
    per = collections.defaultdict(dict)
    for r in rows(f"ncu-decode-{k}.csv"):
        v = float(r["Metric Value"].replace(",", ""))
        per[r["ID"]][r["Metric Name"]] = (v, r.get("Metric Unit", ""))
    us = sum(m["gpu__time_duration.sum"][0] * scale.get(m["gpu__time_duration.sum"][1], 1) for m in per.values())
    byt = sum(m["dram__bytes_read.sum"][0] * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(m["dram__bytes_read.sum"][1], 1) for m in per.values())
    pct = [m["dram__throughput.avg.pct_of_peak_sustained_elapsed"][0] for m in per.values()]
    if per:
        print(f"ncu: decode attention ({k}), batch 64 x 512: {len(per)} launches, {us:.1f} us, {byt/1e6:.1f} MB read, "
              f"{byt/us/1e3:.0f} GB/s; DRAM throughput {sum(pct)/len(pct):.1f}% of peak (mean over launches)")
    else:
        print(f"ncu: decode attention ({k}): nothing profiled")
for name, what in [("ncu.csv", "batch 256"), ("ncu-b1.csv", "batch 1")]:
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for r in rows(name):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        k = r["Kernel Name"].split("(")[0][:70]
        tot[k] += float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", ""), 1.0)
        cnt[k] += 1
    print(f"ncu: {what} decode: {sum(cnt.values())} kernel launches profiled; total GPU time {sum(tot.values())/1000:.3f} ms")
    for k, v in sorted(tot.items(), key=lambda x: -x[1])[:14]:
        print(f"ncu: {what}: {v/1000:9.3f} ms  {cnt[k]:6d} launches  {k}")
PY
    timed ncu
fi
if has ncu-prefill; then
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    # The tensor-core prefill kernels' GPU time over the 16k-token step's 28 layers (after the
    # warm-up's 16-token prefill, 28 launches); PREFILL_KERNELS="scalar mma" for the CUDA-core one.
    for k in ${PREFILL_KERNELS:-mma}; do
        timeout 90 "$NCU" --clock-control none --kernel-name regex:prefill_attention --launch-skip 28 --launch-count 28 --csv --metrics gpu__time_duration.sum \
            "$G/engine" bench --model $M --device cuda --prefill-attention $k "${P16K[@]}" --max-num-batched-tokens 16384 \
            > "$W/ncu-prefill-$k.csv" 2> "$W/ncu-prefill-$k.err"
        pkill -f "$G/engine" 2>/dev/null; sleep 2
        python3 - "$W/ncu-prefill-$k.csv" "$k" <<'PY' | tee -a "$V"
import csv, io, sys
text = open(sys.argv[1]).read()
rows = [r for r in csv.DictReader(io.StringIO(text[text.find('"ID"'):])) if r.get("Metric Name") == "gpu__time_duration.sum"] if '"ID"' in text else []
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
ms = sum(float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", ""), 1e-3) for r in rows)
print(f"ncu: prefill attention ({sys.argv[2]}), 16 x 1024 tokens: {len(rows)} launches, {ms:.2f} ms")
PY
    done
    timed ncu-prefill
fi
if has serve; then
    # `engine serve --device cuda` under an open-loop sweep of the ShareGPT-like chat profile,
    # then 40 streams cut mid-way: the KV cache is freed and the server stays up.
    "$G/engine" serve --model $M --device cuda --port 8124 --max-num-seqs 256 \
        --max-num-batched-tokens 8192 > "$W/serve-sweep.log" 2>&1 &
    sp=$!
    for _ in $(seq 1 120); do curl -sf localhost:8124/health >/dev/null && break; sleep 1; done
    timeout 300 "$G/loadgen" sweep --url http://127.0.0.1:8124 --workload sharegpt-like --profile chat --prompt-ids \
        --rates search --probe-duration 10s --max-rate 200 --max-levels 7 --precision 0.08 --duration 15s --warmup 3s --seed 1 \
        --slo ttft:p99:1s,tpot:p99:50ms --out $W/sweep > "$W/sweep.txt" 2>&1
    tail -25 "$W/sweep.txt" | tee -a "$V"
    cut=()
    for _ in $(seq 1 40); do
        timeout 0.5 curl -sN localhost:8124/v1/completions -H 'content-type: application/json' \
            -d '{"prompt":[1,2,3,4,5,6,7,8],"max_tokens":600,"ignore_eos":true,"stream":true}' >/dev/null 2>&1 &
        cut+=($!)
    done
    wait "${cut[@]}"
    sleep 3
    curl -s localhost:8124/metrics | grep -E "^vllm:(num_requests_running|kv_cache_usage_perc|request_success_total)" | tee -a "$V"
    curl -sf localhost:8124/health >/dev/null && echo "alive after 40 cut streams" | tee -a "$V"
    kill $sp; wait $sp 2>/dev/null
    timed serve
fi

if has peer; then
    bench slice64 --num-seqs 64 --max-num-seqs 64 --min-input-len 100 --max-input-len 1024 --min-output-len 128 --max-output-len 128
    PYTHONUNBUFFERED=1 timeout 200 python3 - "$M" <<'PY' 2>&1 | tee -a "$V"
import random, sys, time, torch, transformers
from transformers import AutoModelForCausalLM, GenerationConfig
print("transformers", transformers.__version__, "torch", torch.__version__)
random.seed(0)
prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(64)]
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, attn_implementation="paged|sdpa").cuda().eval()
gc = GenerationConfig(max_new_tokens=128, do_sample=False, eos_token_id=-1, pad_token_id=0,
                      use_cuda_graph=False, num_blocks=4096, block_size=256, max_batch_tokens=8192)
m.generate_batch(inputs=prompts[:4], generation_config=gc, progress_bar=False)
t = time.perf_counter()
out = m.generate_batch(inputs=prompts, generation_config=gc, progress_bar=False)
dt = time.perf_counter() - t
n = sum(len(o.generated_tokens) for o in out.values())
print(f"transformers generate_batch ({m.config._attn_implementation}): {n} tokens in {dt:.2f}s = {n/dt:.1f} tok/s")
PY
    timed peer
fi

ls -la "$OUT" "$W"
