#!/usr/bin/env bash
# Reading a database: what opening one costs a reader. `mimic export --format csv` of the
# analysis benchmark's database (bench/analyze.sh's trace analyzed: ~46,000 connections,
# ~595,000 exchanges), once as this build writes it (STRICT tables: SQLite holds every value to
# its column's type, so the reader trusts them) and once with the same rows in tables that are
# not STRICT, as builds before 2026-12-02 wrote them (every reader then scans every value when
# it opens the database), beside the peer: sqlite3 writing the same view as CSV
# (`sqlite3 -csv -header DB 'SELECT * FROM conn_summary'`). Median of RUNS, in alternating
# order; the two mimic exports must be the same file (exit 1 otherwise).
# Usage: bench/db-read.sh [RUNS]    (run on a quiet machine; default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
scripts/deps.sh test >/dev/null
cargo build --release -q -p mimic -p mimic-bench
mimic=./target/release/mimic
out=bench/out
mkdir -p "$out"
trace=$out/web-loop.pcap
if [ ! -s "$trace" ]; then
  ./target/release/gen-trace --out "$trace" --loops 19 ../shared/traces/public/web/*
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mimic-db-read.XXXXXX")
trap 'rm -rf "$work"' EXIT
strict=$work/strict.db
loose=$work/loose.db
"$mimic" -q analyze "$trace" -o "$strict" >/dev/null
# the same rows, the tables declared as before STRICT (the CREATE text is kept as written)
sqlite3 "$strict" .dump | sed 's/) STRICT;$/);/' | sqlite3 "$loose"
sqlite3 "$loose" "PRAGMA user_version = $(sqlite3 "$strict" 'PRAGMA user_version')"
n_strict=$(sqlite3 "$strict" "SELECT count(*) FROM pragma_table_list WHERE schema = 'main' AND strict")
n_loose=$(sqlite3 "$loose" "SELECT count(*) FROM pragma_table_list WHERE schema = 'main' AND strict")
if [ "$n_strict" -eq 0 ] || [ "$n_loose" -ne 0 ]; then
  echo "db-read: expected STRICT tables in $strict ($n_strict) and none in $loose ($n_loose)" >&2
  exit 1
fi
conns=$(sqlite3 "$strict" 'SELECT count(*) FROM connections')
exch=$(sqlite3 "$strict" 'SELECT count(*) FROM exchanges')
rtt=$(sqlite3 "$strict" 'SELECT count(*) FROM rtt_samples')
cat "$strict" "$loose" >/dev/null   # warm the page cache for both alike

names=("sqlite3 -csv conn_summary" "mimic export (STRICT tables)" "mimic export (tables not STRICT)")
cmds=(
  "sqlite3 -csv -header $strict 'SELECT * FROM conn_summary' > $work/peer.csv"
  "$mimic -q export --format csv $strict -o $work/strict.csv"
  "$mimic -q export --format csv $loose -o $work/loose.csv"
)
declare -A times
for ((r = 0; r < runs; r++)); do
  for i in "${!cmds[@]}"; do
    t0=$(date +%s.%N)
    bash -c "${cmds[$i]}"
    t1=$(date +%s.%N)
    times[$i]+="$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.6f", a - b}') "
  done
done
if ! cmp -s "$work/strict.csv" "$work/loose.csv"; then
  echo "db-read: the two exports differ" >&2
  exit 1
fi
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
peer=$(echo "${times[0]}" | median)
echo "db-read: $conns connections, $exch exchanges, $rtt RTT samples; median of $runs; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-36s %9s %12s\n' tool seconds "vs sqlite3"
for i in "${!cmds[@]}"; do
  m=$(echo "${times[$i]}" | median)
  printf '%-36s %9.3f %11.2fx\n' "${names[$i]}" "$m" "$(awk -v p="$peer" -v m="$m" 'BEGIN {print p / m}')"
done
echo "db-read: the two mimic exports are the same file ($(wc -l < "$work/strict.csv") lines)"
