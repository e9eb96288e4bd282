#!/usr/bin/env bash
# Time to install 1,000 / 10,000 / 65,536 kernel pipes rendered by `mimic netemu render`
# (htb classes + leaves + hashed u32 filters in one `tc -batch`), in a namespace the test
# makes and removes. This kernel has no sch_netem, so pfifo leaves stand in for netem; the
# classes and filters are the real ones. More than 256 pipes per interface go into groups of
# 256 (an htb qdisc each), which ends the per-qdisc class walk; 65,536 pipes still take 45 s to minutes
# (the kernel walks a global list of filter blocks per new class: netemu/README.md).
# Needs root. Usage: bench/netem-install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
. scripts/cargo-env.sh
cargo test --profile test-build -p mimic-netemu --test tc_apply -- --include-ignored --nocapture \
  install_ 2>&1 | grep -E '^tc install|test result'
