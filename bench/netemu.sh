#!/usr/bin/env bash
# Datapath benchmark for `mimic netemu`: forwarding rate and added-delay error with 1, 1,000
# and 65,536 active pipes, side by side with plain kernel forwarding (tc mirred redirect) and
# kernel tbf (one tbf qdisc shared by all flows) on the same veths of one lab, each at 1, 1,000
# and 65,536 flows. Delay error is measured twice: paced probes (10 kpps) and a timestamped
# load across all pipes (LOAD_PPS, default 50,000); the forwarding rate in a third, untimed
# blast phase. See bench/src/bin/netemu_bench.rs for the method.
#
# Usage: bench/netemu.sh [SECONDS [LOAD_PPS [NETEMU-BENCH FLAGS...]]]   (root; writes
# bench/out/netemu.json, prints a table). Flags after the first two go to netemu-bench, e.g.
# `bench/netemu.sh 1 50000 --pipes 65536 --spin-rule fixed,load`.
# Goals (issue 3): 65,536 pipes with p99 delay error <= 50 us and >= 50% of kernel
# forwarding's packet rate. Other work on the machine (2 cores) disturbs both figures: each
# row gives its phases' host load and CPU pressure, and names other processes' real-time
# threads that ran meanwhile (also warned on stderr). mimic's datapath runs with three spin
# rules (the fixed budget, `mimic netemu run`'s default; the load-following one the replay's
# lab router uses; and busy-polling, `always`, on a CPU of its own), alternating per pipe count.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/netemu.sh needs root (namespaces, AF_PACKET)" >&2; exit 1; }
for t in ip tc ethtool; do command -v $t >/dev/null || { echo "missing $t (scripts/deps.sh bench)" >&2; exit 1; }; done
cargo build --release -p mimic-bench --bin netemu-bench >&2
mkdir -p bench/out
dir=${CARGO_TARGET_DIR:-target}
"$dir/release/netemu-bench" --seconds "${1:-3}" --load-pps "${2:-50000}" --out bench/out/netemu.json "${@:3}"
