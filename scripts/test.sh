#!/usr/bin/env bash
# The test command: installs what the tests need, builds once, runs every test.
# Tests that need root and network namespaces run for real (CI runs as root) and fail with a
# message naming what is missing otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh test
if [ ! -d ../shared/traces/public ]; then
  echo "mimic tests: ../shared/traces/public is missing (check out shared/ beside this repository)" >&2
  exit 1
fi

export CARGO_TERM_COLOR=never
features=(--features dpdk)
cargo build --release --workspace --all-targets "${features[@]}"
# unit tests of every crate
cargo test --release --workspace "${features[@]}" --lib --bins
# command-line integration tests (no root needed)
cargo test --release "${features[@]}" --test cli
# lab tests: network namespaces, real TCP stacks, timing; one process, one test at a time
cargo test --release "${features[@]}" --test lab -- --test-threads=1
