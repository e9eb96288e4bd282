#!/usr/bin/env bash
# Two builds of mimic compared on the analysis benchmark's trace: checks that they write the
# same database (every row of every table, in order) and the same Parquet dataset (every row
# of every table), then times them in alternating order (A B, then B A, ...) with tcptrace -n
# after each pair, and prints the medians, how often B was faster and the ratio.
# The order matters on this kind of machine: in a fixed order, two builds executing the same
# instructions measured 7% apart; alternating, 0.3%.
# The timed runs write SQLite, or with --format parquet a Parquet dataset.
# Usage: bench/analyze-ab.sh [--format sqlite|parquet] MIMIC_A MIMIC_B [PAIRS]   (e.g. a copy
# of an older target/release/mimic and the current one; run bench/analyze.sh once first for
# the trace)
set -euo pipefail
cd "$(dirname "$0")/.."
format=sqlite
if [ "${1:-}" = --format ]; then
  format=${2:?--format needs sqlite or parquet}; shift 2
fi
case "$format" in sqlite|parquet) ;; *) echo "analyze-ab: --format: sqlite or parquet" >&2; exit 2 ;; esac
if [ $# -lt 2 ]; then
  echo "usage: bench/analyze-ab.sh [--format sqlite|parquet] MIMIC_A MIMIC_B [PAIRS]" >&2
  exit 2
fi
a=$(realpath "$1"); b=$(realpath "$2"); pairs=${3:-10}
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "analyze-ab: $bin is not an executable" >&2; exit 2; }
done
trace=bench/out/web-loop.pcap
[ -s "$trace" ] || { echo "analyze-ab: $trace is missing: run bench/analyze.sh once" >&2; exit 2; }
command -v tcptrace >/dev/null || { echo "analyze-ab: tcptrace is missing (scripts/deps.sh test)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the same database from both: every table's rows, in order
digest() { # binary, db
  "$1" analyze "$trace" -o "$2" -q > /dev/null
  python3 - "$2" <<'EOF'
import hashlib, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for t in ("connections", "exchanges", "rtt_samples", "bw_samples"):
    h = hashlib.sha256()
    for row in db.execute(f"SELECT * FROM {t} ORDER BY rowid"):
        h.update(repr(row).encode())
    print(t, h.hexdigest())
EOF
}
if ! diff <(digest "$a" "$tmp/a.db") <(digest "$b" "$tmp/b.db") >&2; then
  echo "analyze-ab: the two builds wrote different databases" >&2
  exit 1
fi
rm -f "$tmp"/*.db
# ... and the same Parquet dataset: every table's rows as a multiset (DuckDB, EXCEPT ALL both
# ways), the row counts beside them
py=${MIMIC_PYENV:-/var/cache/mimic/pyenv}/bin/python
[ -x "$py" ] || { echo "analyze-ab: $py is missing (scripts/deps.sh test makes it)" >&2; exit 2; }
"$a" analyze "$trace" -o "$tmp/a.parquet" -q --format parquet > /dev/null
"$b" analyze "$trace" -o "$tmp/b.parquet" -q --format parquet > /dev/null
if ! "$py" - "$tmp/a.parquet" "$tmp/b.parquet" >&2 <<'EOF'
import duckdb, sys
a, b = sys.argv[1:]
con = duckdb.connect()
bad = 0
for t in ("connections", "exchanges", "rtt_samples", "bw_samples"):
    qa = f"read_parquet('{a}/table={t}/*/*.parquet')"
    qb = f"read_parquet('{b}/table={t}/*/*.parquet')"
    na = con.execute(f"SELECT count(*) FROM {qa}").fetchone()[0]
    nb = con.execute(f"SELECT count(*) FROM {qb}").fetchone()[0]
    only_a = con.execute(f"SELECT count(*) FROM (SELECT * FROM {qa} EXCEPT ALL SELECT * FROM {qb})").fetchone()[0]
    only_b = con.execute(f"SELECT count(*) FROM (SELECT * FROM {qb} EXCEPT ALL SELECT * FROM {qa})").fetchone()[0]
    print(f"parquet {t}: {na} and {nb} rows, {only_a} only in A, {only_b} only in B")
    bad += na != nb or only_a > 0 or only_b > 0
sys.exit(1 if bad else 0)
EOF
then
  echo "analyze-ab: the two builds wrote different Parquet datasets" >&2
  exit 1
fi
rm -rf "$tmp"/*.parquet

cat "$trace" > /dev/null
if [ "$format" = parquet ]; then out_args=(-o "$tmp/t.parquet" --format parquet); else out_args=(-o "$tmp/t.db"); fi
run() { # label, command...
  local label=$1; shift
  rm -rf "$tmp/t.db" "$tmp/t.parquet"
  local t0 t1
  t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N)
  echo "$label $t0 $t1"
}
for i in $(seq "$pairs"); do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for v in $order; do
    if [ "$v" = A ]; then bin=$a; else bin=$b; fi
    run "$v" "$bin" analyze "$trace" "${out_args[@]}" -q
  done
  run T tcptrace -n "$trace"
done > "$tmp/times"
python3 - "$tmp/times" "$format" <<'EOF'
import statistics as st, sys
print(f"mimic analyze writing {sys.argv[2]}; load average now: {open('/proc/loadavg').read().split()[:3]}")
d = {}
for line in open(sys.argv[1]):
    label, t0, t1 = line.split()
    d.setdefault(label, []).append(float(t1) - float(t0))
a, b, t = d["A"], d["B"], d["T"]
for name, xs in (("A", a), ("B", b), ("tcptrace -n", t)):
    runs = " ".join(f"{x:.3f}" for x in xs)
    print(f"{name:12} median {st.median(xs):.3f} s  ({runs})")
wins = sum(y < x for x, y in zip(a, b))
print(f"B/A median {st.median(b) / st.median(a):.4f}; B faster in {wins} of {len(a)} pairs (order alternated)")
print(f"vs tcptrace: A {st.median(t) / st.median(a):.3f}x, B {st.median(t) / st.median(b):.3f}x")
EOF
