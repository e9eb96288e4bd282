#!/usr/bin/env bash
# Prediction, Monkey §5.2 style: a workload runs in the lab under initcwnd=3 (captured and
# analyzed: the "original"), the same workload runs under initcwnd=10 (the real outcome), and
# the original is replayed with --stack initcwnd=10 (the prediction). Prints the KS distance
# between the predicted and the real initcwnd=10 response-time distributions, next to the
# distance between the two real runs (how much the change moved the distribution).
# Usage (root): bench/prediction.sh [CONNECTIONS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-400}
seed=${2:-11}
scripts/deps.sh test >/dev/null
cargo build --release -q
m=./target/release/mimic
out=bench/out/prediction
rm -rf "$out"; mkdir -p "$out"
lab=pred$$
trap '$m lab down $lab >/dev/null 2>&1 || true' EXIT
export MIMIC_LAB_OWNER=$$   # killed before the trap runs: \`mimic lab sweep\` removes the lab
$m lab up $lab >/dev/null
$m synth --connections "$n" --rate 20 --seed "$seed" -o "$out/workload.db"
echo "running the workload under initcwnd=3 (captured) ..."
$m -q replay "$out/workload.db" -o "$out/run-iw3.db" --lab $lab --stack initcwnd=3 --keep-capture "$out/cap-iw3"
$m -q analyze "$out"/cap-iw3/*.pcapng -o "$out/original-iw3.db" --server-port 80
echo "running the same workload under initcwnd=10 (the real outcome) ..."
$m -q replay "$out/workload.db" -o "$out/real-iw10.db" --lab $lab --stack initcwnd=10
echo "replaying the initcwnd=3 original with --stack initcwnd=10 (the prediction) ..."
$m -q replay "$out/original-iw3.db" -o "$out/predicted-iw10.db" --lab $lab --stack initcwnd=10
$m compare "$out/real-iw10.db" "$out/predicted-iw10.db" "$out/original-iw3.db" --json="$out/report.json" --html "$out/report.html" > "$out/report.txt"
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
by = {c["other"]: c for c in r["comparisons"]}
def row(label, c):
    ks = c["ks"]
    p = {x["stat"]: x for x in c["rows"]}
    print(f"{label:44} KS D={ks['d']:.3f} (p={ks['p_value']:.3g})  p50 {p['p50']['rel']*100:+.1f}%  p90 {p['p90']['rel']*100:+.1f}%")
print("against the real initcwnd=10 run:")
row("predicted (initcwnd=3 original replayed at 10)", by["predicted-iw10"])
row("unchanged (the initcwnd=3 original itself)", by["original-iw3"])
PY
echo "report: $out/report.html"
