#!/usr/bin/env bash
# The project's test command (the README's second command): formatting, lints, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-model.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
