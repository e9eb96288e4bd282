#!/usr/bin/env bash
# Two builds of mimic compared on the analysis benchmark's trace: checks that they write the
# same database, then times them in alternating order (A B, then B A, ...) with tcptrace -n
# after each pair, and prints the medians, how often B was faster and the ratio.
# The order matters on this kind of machine: in a fixed order, two builds executing the same
# instructions measured 7% apart; alternating, 0.3%.
# Usage: bench/analyze-ab.sh MIMIC_A MIMIC_B [PAIRS]   (e.g. a copy of an older
# target/release/mimic and the current one; run bench/analyze.sh once first for the trace)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: bench/analyze-ab.sh MIMIC_A MIMIC_B [PAIRS]" >&2
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

cat "$trace" > /dev/null
run() { # label, command...
  local label=$1; shift
  rm -f "$tmp/t.db"
  local t0 t1
  t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N)
  echo "$label $t0 $t1"
}
for i in $(seq "$pairs"); do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for v in $order; do
    if [ "$v" = A ]; then bin=$a; else bin=$b; fi
    run "$v" "$bin" analyze "$trace" -o "$tmp/t.db" -q
  done
  run T tcptrace -n "$trace"
done > "$tmp/times"
python3 - "$tmp/times" <<'EOF'
import statistics as st, sys
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
