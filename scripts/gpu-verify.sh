#!/usr/bin/env bash
# The whole GPU check in one device call (at most 10 minutes), from the project root on the
# device machine. Nothing is built there: build here and pack the binaries first with
# scripts/gpu-pack.sh (stripped, xz-compressed, plus the golden tiny models the GPU tests read).
# Steps: (1) the GPU tests; (2) a random Qwen3-0.6B-shaped bf16 model with a tokenizer and
# transformers' reference logprobs, compared through `engine serve`; (3) `engine bench`:
# decode at batch 256, one stream, nano-vLLM's bench.py workload; (4) the 64-sequence slice
# beside transformers' `generate_batch`; (5) a loadgen sweep of `engine serve`; (6) ncu's
# kernel times; (7) the tensor-core prefill kernel (`mma`: its logprobs, a 16k-token prefill
# step and bench.py beside the CUDA-core kernel, and ncu's times of both). Results go to $OUT
# (the device tool brings them back). STEPS picks a subset of
# "tests model logprobs bench peer serve ncu mma" (the default: all, in that order).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEPS=${STEPS:-tests model logprobs bench peer serve ncu mma}
G=/tmp/gbin
mkdir -p $G
for f in .gpu/*.xz; do xz -dc "$f" > "$G/$(basename "$f" .xz)"; done
chmod +x "$G"/*
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/smi.txt"
# NVRTC and cuBLAS from the Python environment's nvidia-* wheels when the system has none.
NV=$(python3 -c 'import nvidia, os, glob; print(":".join(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib"))))' 2>/dev/null)
export LD_LIBRARY_PATH=${NV}:${LD_LIBRARY_PATH:-}

if has tests; then
    # The test binary looks for ../shared/golden beside the checkout it was built in.
    BUILT_IN=$(cat .gpu/built-in)
    mkdir -p "$BUILT_IN/engine" && ln -sfn "$PWD/.gpu/shared" "$(dirname "$BUILT_IN")/shared"
    (cd "$BUILT_IN" && timeout 180 "$G/cuda-tests" --test-threads=1 2>&1) | tee "$OUT/cuda-tests.txt" | tail -25
    (cd "$BUILT_IN" && timeout 60 "$G/nvrtc-tests" 2>&1) | tee "$OUT/nvrtc-tests.txt" | tail -6
fi

M=/tmp/q06
# A random Qwen3-shaped bf16 model with transformers' reference logprobs (ref.json):
# make_model DIR HIDDEN LAYERS HEADS KV_HEADS HEAD_DIM FFN (the log goes to $OUT/make-$(basename DIR).txt).
make_model() {
    PYTHONUNBUFFERED=1 timeout 240 python3 - "$@" <<'PY' 2>&1 | tee "$OUT/make-$(basename "$1").txt"
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
    for n in [1, 7, 64, 513, 1024, 2000]:
        ids = [rng.randrange(0, 10000) for _ in range(n)]
        lp = torch.log_softmax(m(torch.tensor([ids], device="cuda")).logits[0, -1].float(), -1)
        top = torch.topk(lp, 200)
        cases.append({"ids": ids, "top_ids": top.indices.tolist(), "top_lp": top.values.tolist()})
json.dump(cases, open(out / "ref.json", "w"))
print("model written", out)
PY
}
if has model; then
    make_model $M 1024 28 16 8 128 3072
fi

# Logprobs through `engine serve` against transformers' (the model folder's ref.json): $1 the
# model, $2 names the output files, the rest are extra serve flags.
logprobs_check() {
    local model=$1 tag=$2; shift 2
    "$G/engine" serve --model "$model" --device cuda --port 8123 --max-num-seqs 64 "$@" > "$OUT/serve$tag.log" 2>&1 &
    sp=$!
    for _ in $(seq 1 120); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
    PYTHONUNBUFFERED=1 timeout 120 python3 - "$model" <<'PY' 2>&1 | tee "$OUT/logprobs$tag.txt"
import json, sys, urllib.request
cases = json.load(open(sys.argv[1] + "/ref.json"))
name = json.load(urllib.request.urlopen("http://127.0.0.1:8123/v1/models"))["data"][0]["id"]
worst = 0.0
# Each prompt is sent twice: the repeat hits the prefix cache, and for 513 tokens (32 full
# blocks cached) only the last token is computed, through the decode kernel.
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
    cached = r.get("usage", {}).get("prompt_tokens_details") or {}
    print(f"n={len(c['ids'])} {attempt} (cached {cached.get('cached_tokens', '?')}): greedy token logprob {lp['token_logprobs'][0]:.4f} vs transformers' top-1 {ref[0]:.4f}; "
          f"{len(ours)} distinct top values, each within {d:.4f} of a transformers top-200 value")
print(f"worst |d logprob| = {worst:.4f}")
PY
    kill $sp; wait $sp 2>/dev/null
    tail -3 "$OUT/serve$tag.log"
}
if has logprobs; then
    logprobs_check $M ""
fi

bench() {
    local name=$1; shift
    echo "== $name: engine bench $*" | tee -a "$OUT/bench.txt"
    timeout "${BENCH_TIMEOUT:-150}" "$G/engine" bench --model $M --device cuda --max-num-batched-tokens 16384 "$@" 2>&1 \
        | grep -E "Total|Prefill|Decode|error" | tee -a "$OUT/bench.txt"
}
if has bench; then
    bench decode256 --num-seqs 256 --max-num-seqs 256 --min-input-len 16 --max-input-len 16 --min-output-len 64 --max-output-len 64
    bench decode1 --num-seqs 1 --max-num-seqs 1 --min-input-len 512 --max-input-len 512 --min-output-len 256 --max-output-len 256
    bench nanovllm --num-seqs 256 --max-num-seqs 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --gpu-memory-utilization 0.9
fi

if has peer; then
    bench slice64 --num-seqs 64 --max-num-seqs 64 --min-input-len 100 --max-input-len 1024 --min-output-len 128 --max-output-len 128
    PYTHONUNBUFFERED=1 timeout 200 python3 - "$M" <<'PY' 2>&1 | tee -a "$OUT/bench.txt"
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
fi
if has serve; then
    # `engine serve --device cuda` under an open-loop sweep of the ShareGPT-like chat profile,
    # then 40 streams cut mid-way: the KV cache is freed and the server stays up.
    "$G/engine" serve --model $M --device cuda --port 8124 --max-num-seqs 256 --max-num-batched-tokens 8192 > "$OUT/serve-sweep.log" 2>&1 &
    sp=$!
    for _ in $(seq 1 120); do curl -sf localhost:8124/health >/dev/null && break; sleep 1; done
    timeout 300 "$G/loadgen" sweep --url http://127.0.0.1:8124 --workload sharegpt-like --profile chat --prompt-ids \
        --rates "${SWEEP_RATES:-4,16,48}" --duration 25s --warmup 5s --seed 1 --slo ttft:p90:1s,tpot:p90:50ms \
        --out /tmp/sweep 2>&1 | tail -25 | tee "$OUT/sweep.txt"
    cp /tmp/sweep/report.md "$OUT/sweep-report.md" 2>/dev/null
    cut=()
    for _ in $(seq 1 40); do
        timeout 0.5 curl -sN localhost:8124/v1/completions -H 'content-type: application/json' \
            -d '{"prompt":[1,2,3,4,5,6,7,8],"max_tokens":600,"ignore_eos":true,"stream":true}' >/dev/null 2>&1 &
        cut+=($!)
    done
    wait "${cut[@]}"
    sleep 3
    curl -s localhost:8124/metrics | grep -E "^vllm:(num_requests_running|kv_cache_usage_perc|request_success_total)" | tee "$OUT/serve-metrics.txt"
    curl -sf localhost:8124/health >/dev/null && echo "alive after 40 cut streams" | tee -a "$OUT/serve-metrics.txt"
    kill $sp; wait $sp 2>/dev/null
fi

if has ncu; then
    # (a) Decode attention at batch 64 with 512-token contexts: GPU time and DRAM bytes per
    # launch (one launch per layer of the first all-decode step; the warm-up's 3 decode steps
    # and the step that decodes the first 32 sequences are skipped), as a share of HBM peak.
    # (b) GPU time per kernel over about one decode step of the same run.
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout 200 "$NCU" --kernel-name regex:paged_decode_g --launch-skip 112 --launch-count 28 --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        "$G/engine" bench --model $M --device cuda --num-seqs 64 --max-num-seqs 64 \
        --max-num-batched-tokens 16384 --min-input-len 512 --max-input-len 512 --min-output-len 6 --max-output-len 6 \
        > "$OUT/ncu-decode.csv" 2> "$OUT/ncu-decode.err"
    timeout 200 "$NCU" --metrics gpu__time_duration.sum --csv --launch-skip 900 --launch-count 300 \
        "$G/engine" bench --model $M --device cuda --num-seqs 64 --max-num-seqs 64 \
        --max-num-batched-tokens 16384 --min-input-len 512 --max-input-len 512 --min-output-len 6 --max-output-len 6 \
        > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
    python3 - "$OUT" <<'PY' | tee "$OUT/ncu-summary.txt"
import csv, sys, collections, io, os
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
def rows(name):
    text = open(os.path.join(sys.argv[1], name)).read()
    return list(csv.DictReader(io.StringIO(text[text.find('"ID"'):])))
per = collections.defaultdict(dict)
for r in rows("ncu-decode.csv"):
    v = float(r["Metric Value"].replace(",", ""))
    per[r["ID"]][r["Metric Name"]] = (v, r.get("Metric Unit", ""))
us = sum(m["gpu__time_duration.sum"][0] * scale.get(m["gpu__time_duration.sum"][1], 1) for m in per.values())
byt = sum(m["dram__bytes_read.sum"][0] * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(m["dram__bytes_read.sum"][1], 1) for m in per.values())
pct = [m["dram__throughput.avg.pct_of_peak_sustained_elapsed"][0] for m in per.values()]
if per:
    print(f"decode attention, batch 64 x 512: {len(per)} launches, {us:.1f} us, {byt/1e6:.1f} MB read, "
          f"{byt/us/1e3:.0f} GB/s; DRAM throughput {sum(pct)/len(pct):.1f}% of peak (mean over launches)")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows("ncu.csv"):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    k = r["Kernel Name"].split("(")[0][:70]
    tot[k] += float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", ""), 1.0)
    cnt[k] += 1
print(f"{sum(cnt.values())} kernel launches profiled; total GPU time {sum(tot.values())/1000:.3f} ms")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:20]:
    print(f"{v/1000:9.3f} ms  {cnt[k]:6d} launches  {k}")
PY
fi
if has mma; then
    # The tensor-core prefill kernel (--prefill-attention mma, off by default until this
    # step has passed): transformers' logprobs with head dims 128 (the model step's), 64 and
    # 32 (small random models made here), one 16k-token prefill step with each kernel (the
    # issue's 16 x 1024 step), bench.py's workload, and each kernel's GPU time over that
    # step's 28 layers (after the warm-up's 16-token prefill, 28 launches). Needs the model
    # step's $M: alone, STEPS="model mma".
    logprobs_check $M -mma --prefill-attention mma
    for d in 64 32; do
        make_model /tmp/qd$d 512 2 8 4 $d 1024
        logprobs_check /tmp/qd$d -mma-d$d --prefill-attention mma
    done
    for k in scalar mma; do
        bench "prefill16k-$k" --prefill-attention $k --num-seqs 16 --max-num-seqs 16 --min-input-len 1024 --max-input-len 1024 --min-output-len 1 --max-output-len 1
    done
    bench nanovllm-mma --prefill-attention mma --num-seqs 256 --max-num-seqs 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --gpu-memory-utilization 0.9
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for k in scalar mma; do
        timeout 120 "$NCU" --kernel-name regex:prefill_attention --launch-skip 28 --launch-count 28 --csv --metrics gpu__time_duration.sum \
            "$G/engine" bench --model $M --device cuda --prefill-attention $k --num-seqs 16 --max-num-seqs 16 \
            --max-num-batched-tokens 16384 --min-input-len 1024 --max-input-len 1024 --min-output-len 1 --max-output-len 1 \
            > "$OUT/ncu-prefill-$k.csv" 2> "$OUT/ncu-prefill-$k.err"
        python3 - "$OUT/ncu-prefill-$k.csv" "$k" <<'PY' | tee -a "$OUT/ncu-prefill.txt"
import csv, io, sys
text = open(sys.argv[1]).read()
rows = [r for r in csv.DictReader(io.StringIO(text[text.find('"ID"'):])) if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
ms = sum(float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", ""), 1e-3) for r in rows)
print(f"prefill attention ({sys.argv[2]}), 16 x 1024 tokens: {len(rows)} launches, {ms:.2f} ms")
PY
    done
fi

ls -la "$OUT"
