#!/usr/bin/env bash
# The test command: installs what the tests need, builds once, runs every test.
# Tests that need root and network namespaces run for real (CI runs as root) and fail with a
# message naming what is missing otherwise.
# The public corpus (third-party captures: ../shared/traces/public beside the checkout, or
# $MIMIC_TRACES; scripts/corpus.sh fetches it) is used when present. Without it the tests run
# on the suite's own generated captures and say so; CI=true or MIMIC_CORPUS=required make an
# absent corpus an error.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh test
. scripts/cargo-env.sh
if [ -n "${MIMIC_TRACES:-}" ]; then
  # absolute: the tests run from different folders (the crates' own for their unit tests)
  MIMIC_TRACES=$(cd "$MIMIC_TRACES" 2>/dev/null && pwd) || { echo "mimic tests: MIMIC_TRACES is not a folder" >&2; exit 1; }
  export MIMIC_TRACES
fi
corpus=${MIMIC_TRACES:-../shared/traces/public}
if [ "${MIMIC_CORPUS:-}" != generated ] && [ -d "$corpus" ]; then
  echo "mimic tests: public corpus at $corpus" >&2
elif [ "${MIMIC_CORPUS:-}" = required ] || { [ "${CI:-}" = true ] && [ "${MIMIC_CORPUS:-}" != generated ]; }; then
  echo "mimic tests: the public corpus is required (CI=true or MIMIC_CORPUS=required) but $corpus is missing: check out shared/ beside this repository or run scripts/corpus.sh" >&2
  exit 1
else
  echo "mimic tests: public corpus absent ($corpus): the tests run on generated captures; scripts/corpus.sh fetches it" >&2
  # each test that falls back adds a line here (tests/common/mod.rs); summed when the run ends
  MIMIC_CORPUS_LOG=$(mktemp "${TMPDIR:-/tmp}/mimic-corpus-log.XXXXXX")
  export MIMIC_CORPUS_LOG
  corpus_summary() {
    local n t
    n=$(sort -u "$MIMIC_CORPUS_LOG" | grep -c . || true)
    t=$(sed -n 's/^public corpus absent: \([^ ]*\) .*/\1/p' "$MIMIC_CORPUS_LOG" | sort -u | grep -c . || true)
    echo "public corpus absent: $n checks in $t tests ran on generated captures only; scripts/corpus.sh fetches it" >&2
    rm -f "$MIMIC_CORPUS_LOG"
  }
  trap corpus_summary EXIT
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
# the container LAN (docker/): the image from this build's binary, the roles on three Docker
# networks, a 300-connection replay captured at the server host by serve, judged and compared
# with a client-side capture and the same workload in the lab; then the sharded analysis
# (Kubernetes Job scripts, shard-run.sh) in containers of that image (~5 minutes)
MIMIC_BIN=${CARGO_TARGET_DIR:-target}/test-build/mimic docker/lan-test.sh
