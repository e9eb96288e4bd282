#!/usr/bin/env bash
# Analysis speed: mimic analyze (1 and 2 threads) against tcptrace -n and tshark on the same
# large many-connection trace (the public web captures looped 19 times with rewritten
# addresses, ~2.3 M frames). Prints wall-clock seconds (median of RUNS), frames/s and the ratio
# to tcptrace. mimic's time includes writing and fsyncing the database.
# Usage: bench/analyze.sh [RUNS]   (run on a quiet machine)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
scripts/deps.sh test >/dev/null
cargo build --release -q -p mimic -p mimic-bench
out=bench/out
mkdir -p "$out"
trace=$out/web-loop.pcap
if [ ! -s "$trace" ]; then
  ./target/release/gen-trace --out "$trace" --loops 19 ../shared/traces/public/web/*
fi
frames=$(capinfos -c -M "$trace" | awk -F: '/Number of packets/ {gsub(/ /, "", $2); print $2}')
cat "$trace" > /dev/null   # warm the page cache for every tool alike

time_it() { # name, command...
  local name=$1; shift
  local ts=()
  for _ in $(seq "$runs"); do
    local t0 t1
    # every run writes a new database: replacing the previous one would add the file
    # system's release of its blocks (~30 ms for 70 MB on ext4) to the time
    rm -f "$out/bench.db"
    t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N)
    ts+=("$(python3 -c "print($t1 - $t0)")")
  done
  echo "$name ${ts[*]}"
}

results=$(
  time_it "tcptrace -n" tcptrace -n "$trace"
  time_it "tshark -q -z conv,tcp" tshark -r "$trace" -q -z conv,tcp
  time_it "mimic analyze" ./target/release/mimic analyze "$trace" -o "$out/bench.db" -q
  time_it "mimic analyze --threads 2" ./target/release/mimic analyze "$trace" -o "$out/bench.db" -q --threads 2
)
conns=$(sqlite3 "$out/bench.db" "select count(*) from connections")
python3 - "$frames" "$conns" <<PY
import statistics, sys
frames, conns = int(sys.argv[1]), int(sys.argv[2])
rows = []
for line in """$results""".strip().splitlines():
    *name, = line.split(" ")
    vals = [float(x) for x in line.split()[-$runs:]]
    rows.append((" ".join(line.split()[:-$runs]), statistics.median(vals)))
base = dict(rows)["tcptrace -n"]
print(f"trace: {frames:,} frames, {conns:,} connections (mimic's count); median of $runs runs")
print(f"{'tool':28} {'seconds':>8} {'M frames/s':>11} {'vs tcptrace':>12}")
for name, t in rows:
    print(f"{name:28} {t:8.3f} {frames / t / 1e6:11.2f} {base / t:11.2f}x")
PY
