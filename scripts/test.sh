#!/usr/bin/env bash
# The test command: installs what the tests need, builds once, runs every test.
# Tests that need root and network namespaces run for real (CI runs as root) and fail with a
# message naming what is missing otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh test
. scripts/cargo-env.sh
if [ ! -d ../shared/traces/public ]; then
  echo "mimic tests: ../shared/traces/public is missing (check out shared/ beside this repository)" >&2
  exit 1
fi

export CARGO_TERM_COLOR=never
# DPDK is built and tested too: the binary's `dpdk` feature (which turns on the capture
# crate's). The DPDK tests are not compiled out without it: they fail, saying DPDK is missing.
lib_features=(--features mimic-capture/dpdk)
bin_features=(--features dpdk)
# one optimised build without LTO (Cargo.toml's test-build profile): the release profile's
# whole-program optimisation would be repeated for every test binary
profile=(--profile test-build)
cargo build "${profile[@]}" --workspace --all-targets --features mimic/dpdk
# every library crate: unit tests, integration tests (e.g. netemu's golden renders), doc tests
cargo test "${profile[@]}" --workspace --exclude mimic "${lib_features[@]}"
# the mimic binary and its command-line integration tests (no root needed)
cargo test "${profile[@]}" -p mimic "${bin_features[@]}" --bins --test cli
# lab tests: network namespaces, real TCP stacks, timing; one process, one test at a time
cargo test "${profile[@]}" -p mimic "${bin_features[@]}" --test lab -- --test-threads=1 --show-output
