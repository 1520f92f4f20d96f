#!/usr/bin/env bash
# The project's test command (the README's second command): formatting, lints, every test.
# The kernel tests (engine/tests/nvrtc.rs) compile kernels/*.cu with NVRTC and fail without
# it: nvrtc-env.sh installs it from PyPI on the first run (cached after) and sets
# LD_LIBRARY_PATH for the tests. The HTML report check needs Debian's `chromium` (.ci/run
# installs it). The Kubernetes manifest check needs `envsubst` (gettext-base) and installs
# PyPI's kubernetes-validate on its first run, the quantised fixtures PyPI's gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
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
