#!/usr/bin/env bash
# Analysis scaling past this machine's 2 cores, on the analysis benchmark's trace (the public
# web captures looped 19 times with rewritten addresses, ~2.3 M frames, as bench/analyze.sh):
#   1. tcptrace -n against mimic analyze with THREADS analyzer threads (default 1 2 4 8), in
#      RUNS rounds (each tool once a round, the order kept), medians;
#   2. bench/shard.sh with N shards all at once (P = N) for each N in SHARDS (default 1 2 4 8
#      16), every merge checked row by row against the unsharded run (MISMATCH fails the run);
#   3. the same N shards writing one Parquet dataset (--format parquet, no merge: DuckDB and
#      Spark read the shards as one table), its connection rows counted with pyarrow where
#      python3 has it against the SQLite run's (a difference fails the run).
# Counts above the machine's CPU count are left out and said so. Prints both tables: wall
# seconds, frames/s, the ratio to tcptrace and the speed-up over the unsharded run.
# Usage: bench/analyze-scale.sh [RUNS]     (default 3; run on a quiet machine)
# Environment: MIMIC, GEN_TRACE, TRACE, CAPTURES, OUT as bench/shard.sh (with MIMIC set nothing
# is built or installed: how it runs on a machine without Rust); TCPTRACE (default tcptrace;
# without it the ratios are left out); THREADS and SHARDS (space-separated counts).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
command -v python3 > /dev/null || { echo "analyze-scale: python3 (with sqlite3) is needed for the row checks and tables" >&2; exit 2; }
if [ -z "${MIMIC:-}" ]; then
  scripts/deps.sh test >/dev/null
  cargo build --release -q -p mimic -p mimic-bench
fi
export MIMIC=${MIMIC:-./target/release/mimic}
export OUT=${OUT:-bench/out}
export TRACE=${TRACE:-$OUT/web-loop.pcap}
mkdir -p "$OUT"
if [ ! -s "$TRACE" ]; then
  "${GEN_TRACE:-./target/release/gen-trace}" --out "$TRACE" --loops 19 \
    "${CAPTURES:-../shared/traces/public/web}"/*
fi
tcptrace=${TCPTRACE:-tcptrace}
command -v "$tcptrace" > /dev/null || { echo "analyze-scale: no $tcptrace: no ratios to it" >&2; tcptrace=; }
cpus=$(nproc)
keep() { for x in "$@"; do [ "$x" -le "$cpus" ] && echo "$x"; done; return 0; }
threads=($(keep ${THREADS:-1 2 4 8}))
shards=($(keep ${SHARDS:-1 2 4 8 16}))
echo "machine: $cpus CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "threads: ${threads[*]}; shards: ${shards[*]} (counts above $cpus CPUs left out)"
cat "$TRACE" > /dev/null   # warm the page cache for every tool alike

work=$(mktemp -d "$OUT/scale.XXXXXX")
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
names=()
[ -n "$tcptrace" ] && names+=("tcptrace -n")
for t in "${threads[@]}"; do names+=("mimic analyze --threads $t"); done
for t in "${threads[@]}"; do names+=("mimic analyze --format parquet --threads $t"); done
: > "$work/times"
for r in $(seq 1 "$runs"); do
  for name in "${names[@]}"; do
    t0=$(now)
    case "$name" in
      tcptrace*) "$tcptrace" -n "$TRACE" > /dev/null ;;
      *parquet*) rm -rf "$work/a.parquet"
        "$MIMIC" -q analyze "$TRACE" -o "$work/a.parquet" --format parquet --threads "${name##* }" > /dev/null ;;
      *) "$MIMIC" -q analyze "$TRACE" -o "$work/a.db" --threads "${name##* }" > /dev/null ;;
    esac
    t1=$(now)
    echo "$name|$(awk "BEGIN { print $t1 - $t0 }")" >> "$work/times"
  done
done
read -r frames conns < <(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute(\"SELECT value FROM meta WHERE key='frames'\").fetchone()[0], c.execute('SELECT count(*) FROM connections').fetchone()[0])" "$work/a.db")

: > "$work/scale"
for n in "${shards[@]}"; do
  bench/shard.sh "$n" "$n" > "$work/shard-$n.txt"
  grep '^scale:' "$work/shard-$n.txt" >> "$work/scale"
  grep -E '^(MATCH|frames)' "$work/shard-$n.txt" | sed "s/^/$n shards: /"
done

: > "$work/pq"
for n in "${shards[@]}"; do
  rm -rf "$work/s.parquet"
  # made beforehand: builds before 2026-11-28 raced creating it when the shards start at once
  mkdir "$work/s.parquet"
  t0=$(now)
  seq 1 "$n" | xargs -P "$n" -I{} "$MIMIC" -q analyze "$TRACE" -o "$work/s.parquet" \
    --format parquet --shard "{}/$n" > /dev/null
  t1=$(now)
  rows=$(python3 - "$work/s.parquet/table=connections" <<'PY'
import sys
try:
    import pyarrow.dataset as ds
except ImportError:
    print("-")
else:
    print(ds.dataset(sys.argv[1], format="parquet", partitioning="hive").count_rows())
PY
)
  if [ "$rows" != - ] && [ "$rows" != "$conns" ]; then
    echo "analyze-scale: MISMATCH: $n Parquet shards hold $rows connections, the SQLite run $conns" >&2
    exit 1
  fi
  echo "$n $(awk "BEGIN { print $t1 - $t0 }") $rows" >> "$work/pq"
done

python3 - "$work/times" "$work/scale" "$frames" "$runs" "$work/pq" "$conns" <<'PY'
import statistics, sys
times, scale, frames, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pq, conns = sys.argv[5], int(sys.argv[6])
by = {}
for l in open(times):
    k, v = l.rstrip("\n").split("|")
    by.setdefault(k, []).append(float(v))
ref = statistics.median(by["tcptrace -n"]) if "tcptrace -n" in by else None
print(f"\n{frames:,} frames; median of {runs} rounds; mimic's time includes writing and fsyncing the database")
print(f"{'tool':44} {'seconds':>8} {'range':>15} {'M frames/s':>10} {'vs tcptrace':>11}")
for k, v in by.items():
    m = statistics.median(v)
    vs = f"{ref / m:10.2f}x" if ref else "          -"
    print(f"{k:44} {m:8.3f} {min(v):7.3f}-{max(v):<7.3f} {frames / m / 1e6:10.2f} {vs}")
rows = [l.split()[1:] for l in open(scale) if l.strip()]
if rows:
    print(f"\nsharded (bench/shard.sh N N: N shard processes at once, each reading the whole trace, then mimic merge)")
    print(f"{'shards':>6} {'unsharded s':>11} {'shards s':>9} {'merge s':>8} {'total s':>8} {'speed-up':>9} {'M frames/s':>10}")
    for n, p, t_full, t_sh, t_m in rows:
        t_full, t_sh, t_m = float(t_full), float(t_sh), float(t_m)
        tot = t_sh + t_m
        print(f"{n:>6} {t_full:11.3f} {t_sh:9.3f} {t_m:8.3f} {tot:8.3f} {t_full / tot:8.2f}x {frames / tot / 1e6:10.2f}")
rows = [l.split() for l in open(pq) if l.strip()]
if rows:
    one = by.get("mimic analyze --format parquet --threads 1")
    one = statistics.median(one) if one else None
    print(f"\nsharded into one Parquet dataset (N shard processes at once, no merge); speed-up over "
          f"the unsharded Parquet run (--threads 1, median above); connections counted with pyarrow "
          f"against the SQLite run's {conns:,} ('-': no pyarrow here)")
    print(f"{'shards':>6} {'seconds':>8} {'speed-up':>9} {'M frames/s':>10} {'connections':>11}")
    for n, t, r in rows:
        t = float(t)
        sp = f"{one / t:8.2f}x" if one else "        -"
        print(f"{n:>6} {t:8.3f} {sp} {frames / t / 1e6:10.2f} {r:>11}")
PY
