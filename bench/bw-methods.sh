#!/usr/bin/env bash
# Bottleneck-bandwidth combiners against the truth: synthetic workloads (all client classes)
# replayed through the lab, the server-side capture analyzed once per combiner
# (--bw-method mode | capprobe | median), each analysis scored by `mimic synth check` against
# the rates the pipes were configured with. Prints, per combiner and over all seeds, the share
# of estimates within 20% of the truth, the median and p99 of the error and how many
# connections got an estimate. Needs root (the lab).
# Usage: bench/bw-methods.sh [SEED...]   (default: 7 11 23; run on a quiet machine)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(7 11 23)
[ "$(id -u)" -eq 0 ] || { echo "bw-methods: the lab needs root" >&2; exit 2; }
scripts/deps.sh test >/dev/null
cargo build --release -q -p mimic
m=./target/release/mimic
out=bench/out/bw-methods
rm -rf "$out"
mkdir -p "$out"
lab=bwm$$
cleanup() { "$m" lab down "$lab" >/dev/null 2>&1 || true; }
trap cleanup EXIT

for seed in "${seeds[@]}"; do
  d=$out/seed-$seed
  mkdir -p "$d"
  "$m" -q synth --connections 320 --rate 20 --seed "$seed" -o "$d/synth.db" --json >/dev/null
  "$m" -q replay "$d/synth.db" -o "$d/replay.db" --lab "$lab" --keep-capture "$d/cap" \
    --json >"$d/replay.json"
  # the replay's own analysis (the default combiner), for reference
  "$m" -q synth check "$d/synth.db" "$d/replay.db" --json >"$d/as-replayed.json" || true
  for method in mode capprobe median; do
    "$m" -q analyze "$d"/cap/* -o "$d/$method.db" --server-port 80 --bw-method "$method" >/dev/null
    # pair the connections with the workload's as the replay did
    sqlite3 "$d/$method.db" "ATTACH '$d/replay.db' AS r; INSERT INTO replay_map SELECT * FROM r.replay_map;"
    "$m" -q synth check "$d/synth.db" "$d/$method.db" --json >"$d/$method.json" || true
  done
done

python3 - "$out" "${seeds[@]}" <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
def bw(path):
    r = json.load(open(path))
    c = next(c for c in r["checks"] if c["parameter"] == "bandwidth")
    return c, r.get("bw_coverage")
print(f"bottleneck bandwidth against the truth, {len(seeds)} workloads of 320 connections (seeds {' '.join(seeds)})")
print(f"{'combiner':14} {'within 20%':>16} {'median err %':>13} {'p99 err %':>10} {'estimates':>10}")
for method in ["as-replayed", "mode", "capprobe", "median"]:
    ok = n = 0
    meds, p99s, cov = [], [], []
    for s in seeds:
        c, coverage = bw(f"{out}/seed-{s}/{method}.json")
        ok += c["ok"]; n += c["n"]
        meds.append(c["median_abs_error"]); p99s.append(c["p99_abs_error"]); cov.append(coverage)
        print(f"  seed {s:>4} {method:12} {c['ok']:>4}/{c['n']:<4} {100 * c['share']:5.1f}%"
              f" {c['median_abs_error']:8.1f} {c['p99_abs_error']:10.1f} {100 * coverage:9.1f}%")
    print(f"{method:14} {ok:>6}/{n:<5} {100 * ok / max(n, 1):5.1f}%"
          f" {sum(meds) / len(meds):12.1f} {max(p99s):10.1f} {100 * sum(cov) / len(cov):9.1f}%")
PY
