#!/usr/bin/env bash
# Added-delay error of kernel netem beside mimic's own datapath, in ONE router guest on
# Debian's stock kernel (this machine's kernel has no sch_netem): `mimic lab up --kernel`
# boots the guest, and netemu-bench runs inside it (`lab exec NAME emu`) with --netem, so
# kernel forwarding, one shared netem qdisc (delay 5 ms) and mimic's datapath (5 ms per pipe)
# are measured by the same generator and receiver in the same run.
# Under TCG (no working KVM here) the guest's CPU is emulated: its timings are NOT those of
# real hardware, and the load rate must stay low. Published anchor for netem on hardware:
# median 71 us, worst 769 us added-delay error.
#
# Usage: bench/netem-delay.sh [SECONDS [LOAD_PPS [PIPES]]]   (root; prints the bench's table)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/netem-delay.sh needs root (QEMU guest, namespaces)" >&2; exit 1; }
for t in qemu-system-x86_64 ip tc; do command -v $t >/dev/null || { echo "missing $t (scripts/deps.sh test)" >&2; exit 1; }; done
cargo build --release -p mimic-bench --bin netemu-bench >&2
cargo build --release -p mimic --features dpdk --bin mimic >&2
dir=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
mimic="$dir/release/mimic"
kernel=$("$mimic" lab fetch-kernel | tail -1)
name="nd$$"
trap '"$mimic" lab down "$name" >/dev/null 2>&1 || true' EXIT
export MIMIC_LAB_OWNER=$$   # killed before the trap runs: `mimic lab sweep` removes the lab
"$mimic" lab up "$name" --kernel "$kernel" >&2
"$mimic" lab exec "$name" emu -- uname -r >&2
"$mimic" lab exec "$name" emu -- "$dir/release/netemu-bench" --netem \
  --seconds "${1:-2}" --load-pps "${2:-5000}" --pipes "${3:-1,1000}"
