#!/usr/bin/env bash
# What a session with a GPU runs on the device machine (issue 6). The device has no Rust
# toolchain and no internet: build here first and carry the binary:
#   cargo build --release -p engine && cargo test --release -p engine --no-run
#   run (device tool): carry=["target/release/engine", <the cuda test binary>]
#   command: bash scripts/gpu-verify.sh
# Steps: (1) the GPU tests of engine/tests/cuda.rs (logits vs the CPU backend on the tiny
# golden models, sampling); (2) the random Qwen3-0.6B-shaped bf16 model and transformers'
# reference logits; (3) nano-vLLM's bench.py workload with `engine bench`.
# Results go to $OUT (or ./gpu-out when run elsewhere).
set -euo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
nvidia-smi | tee "$OUT/nvidia-smi.txt"

# (1) GPU tests (the test binary is target/release/deps/cuda-<hash>).
test_bin=$(ls -t target/release/deps/cuda-* 2>/dev/null | grep -v '\.d$' | head -n1 || true)
if [[ -n "$test_bin" ]]; then
    "$test_bin" --nocapture --test-threads=1 2>&1 | tee "$OUT/cuda-tests.txt"
else
    echo "no cuda test binary carried (cargo test --release -p engine --no-run)" | tee "$OUT/cuda-tests.txt"
fi

# (2) The Qwen3-0.6B-shaped model and transformers' logits for prompts of 1..2000 tokens.
MODELS="${MODELS:-/tmp/gpu-models}"
python3 scripts/gpu_make_models.py "$MODELS" 2>&1 | tee "$OUT/make-models.txt"
MODEL="$MODELS/qwen3-0.6b-random"

# (3) Throughput: 256 sequences, prompt and output lengths uniform in [100, 1024], random
# prompt ids in [0, 10000), ignore_eos, one warm-up excluded. Flags as in engine/src/main.rs
# (`bench`, owned by H3); `--device` and `--gpu-memory-utilization` are the flags the CUDA
# backend asks main.rs to add. The prompt-id range [0, 10000) must be what bench draws.
./target/release/engine bench --help | tee "$OUT/bench-help.txt"
./target/release/engine bench \
    --model "$MODEL" \
    --device cuda \
    --gpu-memory-utilization 0.9 \
    --num-seqs 256 \
    --min-input-len 100 --max-input-len 1024 \
    --min-output-len 100 --max-output-len 1024 \
    --max-num-seqs 256 --max-num-batched-tokens 16384 \
    --seed 0 \
    2>&1 | tee "$OUT/bench.txt"
./target/release/engine bench --model "$MODEL" --device cuda --num-seqs 1 --max-num-seqs 1 \
    --min-input-len 512 --max-input-len 512 --min-output-len 256 --max-output-len 256 \
    2>&1 | tee "$OUT/bench-batch1.txt"
