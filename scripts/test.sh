#!/usr/bin/env bash
# The project's test command (the README's second command): formatting, lints, every test.
# It does its own set-up first, so that a missing tool stops it before the tests, not after:
# Debian's `chromium` (the HTML report check) and `envsubst` (gettext-base, the Kubernetes
# manifest check) are installed with apt-get when it runs as root, else it names the command.
# The kernel tests (engine/tests/nvrtc.rs) compile kernels/*.cu with NVRTC and fail without
# it: nvrtc-env.sh installs it from PyPI on the first run (cached after) and sets
# LD_LIBRARY_PATH for the tests. The Kubernetes manifest check installs PyPI's
# kubernetes-validate on its first run, the quantised fixtures PyPI's gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required: https://rustup.rs"; exit 1; }
command -v python3 >/dev/null || { echo "python3 with pip is required (NVRTC, gguf and the openai client come from PyPI)"; exit 1; }
# `need COMMAND PACKAGE WHY`: installs the Debian package that provides COMMAND when missing.
need() {
    command -v "$1" >/dev/null && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq "$2" >/dev/null
    else
        echo "$1 is required $3: run 'sudo apt-get install -y $2'"; exit 1
    fi
}
need chromium chromium "(headless, to check the rendered HTML reports)"
need envsubst gettext-base "(to fill the deploy/k8s manifests' variables)"
./scripts/fetch-model.sh
# The second real model, Gemma 3 270M (engine/tests/tokenizer.rs reads its SentencePiece vocabulary).
./scripts/fetch-model.sh gemma3
# GGUF fixtures in every quantised format, written by PyPI's gguf (engine/tests/quant_formats.rs).
./scripts/make-quant-fixtures.sh >/dev/null
# shellcheck source=scripts/nvrtc-env.sh
source ./scripts/nvrtc-env.sh
# The official `openai` Python client, which an engine test drives (engine/tests/server.rs).
OPENAI_PYTHONPATH="$(./scripts/pip-target.sh openai 3.57.0)"
export OPENAI_PYTHONPATH
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
# The rendered run, sweep and comparison reports open in headless Chromium without console errors.
./scripts/check-report-html.sh
# The Kubernetes manifests (deploy/k8s) validate against the API schema, offline.
./scripts/check-k8s.sh
# The short form of the fuzz and soak run against `engine serve` (scripts/soak.sh).
./scripts/soak.sh --requests 1000 --warmup-fraction 0.3
