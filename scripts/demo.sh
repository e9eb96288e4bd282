#!/usr/bin/env bash
# The main job on the built-in default: installs what is missing, builds mimic, runs
# `mimic demo` (as root: it builds network namespaces). Extra arguments go to `mimic demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "mimic demo: needs root (it creates network namespaces); run: sudo $0 $*" >&2
  exit 1
fi
scripts/deps.sh demo
. scripts/cargo-env.sh
# with the DPDK capture source (`mimic capture --source dpdk:"EAL ARGS"`); deps.sh installed
# DPDK's libraries
cargo build --release --quiet --features dpdk
exec ./target/release/mimic demo "$@"
