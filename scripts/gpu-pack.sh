#!/usr/bin/env bash
# Builds what scripts/gpu-verify.sh runs on the device machine and packs it into the
# git-ignored .gpu/: stripped, xz-compressed release binaries (engine, loadgen, the GPU and
# NVRTC test binaries) and the golden tiny models the GPU tests read.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p engine -p loadgen
cargo test --release -p engine --test cuda --test nvrtc --no-run 2>&1 | tail -3
mkdir -p .gpu/shared/golden
newest() { ls -t target/release/deps/"$1"-* | grep -v '\.d$' | head -n1; }
pack() { strip -o ".gpu/$2" "$1" && xz -T2 -6 -f ".gpu/$2"; }
pack target/release/engine engine
pack target/release/loadgen loadgen
pack "$(newest cuda)" cuda-tests
pack "$(newest nvrtc)" nvrtc-tests
cp -r ../shared/golden/qwen3-tiny ../shared/golden/llama-tiny .gpu/shared/golden/
rm -rf .gpu/shared/golden/qwen3-tiny/f32
pwd > .gpu/built-in
du -sh .gpu
