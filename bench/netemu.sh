#!/usr/bin/env bash
# Datapath benchmark for `mimic netemu`: forwarding rate and added-delay error with 1, 1,000
# and 65,536 active pipes, side by side with plain kernel forwarding (tc mirred redirect) and
# kernel tbf on the same veths of one lab. See bench/src/bin/netemu_bench.rs for the method.
#
# Usage: bench/netemu.sh [SECONDS]   (root; writes bench/out/netemu.json and prints a table)
# Goals (issue 3): 65,536 pipes with p99 delay error <= 50 us and >= 50% of kernel
# forwarding's packet rate. Other work on the machine (2 cores) disturbs both figures.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/netemu.sh needs root (namespaces, AF_PACKET)" >&2; exit 1; }
for t in ip tc ethtool; do command -v $t >/dev/null || { echo "missing $t (scripts/deps.sh bench)" >&2; exit 1; }; done
cargo build --release -p mimic-bench --bin netemu-bench >&2
mkdir -p bench/out
dir=${CARGO_TARGET_DIR:-target}
"$dir/release/netemu-bench" --seconds "${1:-3}" --out bench/out/netemu.json
