#!/usr/bin/env bash
# Analysis speed: mimic analyze (1 and 2 threads) against tcptrace -n and tshark on the same
# large many-connection trace (the public web captures looped 19 times with rewritten
# addresses, ~2.3 M frames). Prints wall-clock seconds (median of RUNS), frames/s and the ratio
# to tcptrace. mimic's time includes writing and fsyncing the database.
# Then the floors, measured in the same run: reading the trace alone, the analysis without the
# database, and SQLite storing the rows mimic wrote (moved as stored, and by value), beside the
# issue's targets (3x tcptrace, and 1.8x that with --threads 2) and what those leave of the
# machine's CPU (bench/src/bin/analyze_floor.rs says what each floor measures).
# With --format parquet (or both, the default) mimic analyze --format parquet is timed beside
# the SQLite runs, and the floor of writing the same rows as Parquet beside SQLite's.
# Usage: bench/analyze.sh [--format sqlite|parquet|both] [RUNS]   (run on a quiet machine)
set -euo pipefail
cd "$(dirname "$0")/.."
format=both
if [ "${1:-}" = --format ]; then
  format=${2:?--format needs sqlite, parquet or both}; shift 2
fi
case "$format" in sqlite|parquet|both) ;; *) echo "--format: sqlite, parquet or both" >&2; exit 2 ;; esac
runs=${1:-3}
scripts/deps.sh test >/dev/null
cargo build --release -q -p mimic -p mimic-bench
cargo build --release -q -p mimic-analyze --example analyze_nodb
out=bench/out
mkdir -p "$out"
trace=$out/web-loop.pcap
if [ ! -s "$trace" ]; then
  ./target/release/gen-trace --out "$trace" --loops 19 ../shared/traces/public/web/*
fi
frames=$(capinfos -c -M "$trace" | awk -F: '/Number of packets/ {gsub(/ /, "", $2); print $2}')
cat "$trace" > /dev/null   # warm the page cache for every tool alike
load=$(cut -d' ' -f1-3 /proc/loadavg)

# the tools in rounds (each tool once per round, the order kept), so that a change in the
# machine's load during the run falls on every tool alike; SQLite's run comes last in each
# round and leaves bench.db for the floors below
names=("tcptrace -n" "tshark -q -z conv,tcp")
[ "$format" != parquet ] && names+=("mimic analyze --threads 2")
[ "$format" != sqlite ] && names+=("mimic analyze --format parquet")
names+=("mimic analyze")
run_tool() { # name
  case "$1" in
    "tcptrace -n") tcptrace -n "$trace" ;;
    "tshark -q -z conv,tcp") tshark -r "$trace" -q -z conv,tcp ;;
    "mimic analyze --threads 2") ./target/release/mimic analyze "$trace" -o "$out/bench.db" -q --threads 2 ;;
    "mimic analyze --format parquet") ./target/release/mimic analyze "$trace" -o "$out/bench.parquet" -q --format parquet ;;
    "mimic analyze") ./target/release/mimic analyze "$trace" -o "$out/bench.db" -q ;;
  esac
}
export -f run_tool
export trace out
declare -A ts
for _ in $(seq "$runs"); do
  for name in "${names[@]}"; do
    # every run writes a new database: replacing the previous one would add the file
    # system's release of its blocks (~30 ms for 70 MB on ext4) to the time
    rm -rf "$out/bench.db" "$out/bench.parquet"
    # wall and CPU (user + system) seconds of the whole process tree
    /usr/bin/time -f "%e %U %S" -o "$out/time" bash -c 'run_tool "$0"' "$name" > /dev/null 2>&1
    ts[$name]+=" $(awk '{printf "%s,%.2f", $1, $2 + $3}' "$out/time")"
  done
done
results=$(for name in "${names[@]}"; do echo "$name${ts[$name]}"; done)
conns=$(sqlite3 "$out/bench.db" "select count(*) from connections")

# floors: each tool's own clock (no process start-up), so each is a little below what a whole
# run of the same work would take
floor_it() { # name, command...; the command prints its seconds as the field before the last
  local name=$1; shift
  local ts=()
  for _ in $(seq "$runs"); do
    ts+=("$("$@" | awk '{print $(NF-1)}')")
  done
  echo "$name ${ts[*]}"
}
floors=$(
  floor_it "read" ./target/release/analyze-floor read "$trace"
  floor_it "analysis" ./target/release/examples/analyze_nodb "$trace"
  floor_it "db_copy" ./target/release/analyze-floor db "$out/bench.db" "$out/floor.db"
  floor_it "db_insert" ./target/release/analyze-floor db --by-value "$out/bench.db" "$out/floor.db"
  if [ "$format" != sqlite ]; then
    floor_it "parquet" ./target/release/analyze-floor parquet "$out/bench.db" "$out/floor.parquet"
  fi
)
rm -rf "$out/floor.db" "$out/floor.parquet" "$out/bench.parquet" "$out/time"
python3 - "$frames" "$conns" "$(nproc)" <<PY
import statistics, sys
frames, conns, cores = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rows = []
for line in """$results""".strip().splitlines():
    pairs = [x.split(",") for x in line.split()[-$runs:]]
    wall = statistics.median(float(w) for w, _ in pairs)
    cpu = statistics.median(float(c) for _, c in pairs)
    rows.append((" ".join(line.split()[:-$runs]), wall, cpu))
base = {n: w for n, w, _ in rows}["tcptrace -n"]
print(f"trace: {frames:,} frames, {conns:,} connections (mimic's count); median of $runs runs; "
      f"load average before: $load")
print(f"{'tool':32} {'seconds':>8} {'CPU s':>7} {'M frames/s':>11} {'vs tcptrace':>12}")
for name, t, cpu in rows:
    print(f"{name:32} {t:8.3f} {cpu:7.2f} {frames / t / 1e6:11.2f} {base / t:11.2f}x")

fl = {}
for line in """$floors""".strip().splitlines():
    name, *vals = line.split()
    fl[name] = statistics.median(float(x) for x in vals)
print()
print(f"floors (median of $runs runs, each tool's own clock):")
print(f"  reading the trace alone (mimic's reader, frames dropped)      {fl['read']:8.3f} s")
print(f"  analysis without the database (records dropped, one thread)   {fl['analysis']:8.3f} s  {base / fl['analysis']:5.2f}x tcptrace")
print(f"  SQLite storing mimic's rows as stored records (serial floor)  {fl['db_copy']:8.3f} s")
print(f"  SQLite storing mimic's rows by value (its insert path)        {fl['db_insert']:8.3f} s")
if 'parquet' in fl:
    print(f"  Parquet storing the same rows (mimic's writer, from memory)   {fl['parquet']:8.3f} s"
          f"  ({fl['db_insert'] / fl['parquet']:.2f}x faster than SQLite's insert path)")
print()
io = fl['read'] + fl['db_insert']          # no analysis at all
proper = fl['analysis'] - fl['read']        # the analysis beyond reading
for label, ratio in [("3x tcptrace (--threads 1)", 3.0), ("1.8 x 3x tcptrace (--threads 2)", 5.4)]:
    t = base / ratio
    budget = t * cores
    print(f"target {label}: {t:.3f} s, so at most {budget:.3f} s of CPU on {cores} cores")
    print(f"  reading and SQLite's insert path alone: {io:.3f} s of CPU "
          f"({'OVER' if io > budget else 'within'} the budget before any analysis)")
    print(f"  with today's analysis ({proper:.3f} s beyond reading): {io + proper:.3f} s of CPU; "
          f"the analysis would have to take at most {max(budget - io, 0):.3f} s "
          f"even with the {cores} cores perfectly shared")
PY
