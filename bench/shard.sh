#!/usr/bin/env bash
# Sharded analysis on the analysis benchmark's trace (bench/analyze.sh builds it: the public web
# captures looped 19 times with rewritten addresses, ~2.3 M frames): one unsharded run, N shard
# runs (`mimic analyze --shard K/N`, P at a time) and `mimic merge`, then a row-by-row check
# that the merged database IS the unsharded one: every table but meta compared as multisets of
# whole rows (every column; GROUP BY all columns with the row count, EXCEPT both ways), and
# every meta row but command / shards / merged_from / peak_connections (the merged peak is the
# sum of the shards' peaks, an upper bound). Prints the counts, the wall-clock times and
# MATCH or MISMATCH; exits 1 on a mismatch.
# The last line, "scale: N P UNSHARDED_S SHARDS_S MERGE_S", is for bench/analyze-scale.sh.
# Usage: bench/shard.sh [N] [P]    (defaults: 4 shards, 2 at a time: this machine has 2 cores)
# With MIMIC=BIN (and GEN_TRACE=BIN, or TRACE=FILE already built) it builds and installs
# nothing and runs those binaries: how it runs on a machine without Rust or the packages (the
# trace is made from CAPTURES, default ../shared/traces/public/web; python3 does the check).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
p=${2:-2}
if [ -z "${MIMIC:-}" ]; then
  scripts/deps.sh test >/dev/null
  cargo build --release -q -p mimic -p mimic-bench
fi
mimic=${MIMIC:-./target/release/mimic}
out=${OUT:-bench/out}
mkdir -p "$out"
trace=${TRACE:-$out/web-loop.pcap}
if [ ! -s "$trace" ]; then
  "${GEN_TRACE:-./target/release/gen-trace}" --out "$trace" --loops 19 \
    "${CAPTURES:-../shared/traces/public/web}"/*
fi
work=$(mktemp -d "$out/shard.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat "$trace" > /dev/null   # warm the page cache

now() { date +%s.%N; }
t0=$(now)
"$mimic" -q analyze "$trace" -o "$work/full.db" > /dev/null
t1=$(now)
seq 1 "$n" | xargs -P "$p" -I{} "$mimic" -q analyze "$trace" -o "$work/shard{}.db" --shard "{}/$n" > /dev/null
t2=$(now)
shards=()
for k in $(seq 1 "$n"); do shards+=("$work/shard$k.db"); done
"$mimic" -q merge "${shards[@]}" -o "$work/merged.db" > /dev/null
t3=$(now)

python3 - "$work/full.db" "$work/merged.db" "$n" "$p" "$t0" "$t1" "$t2" "$t3" "${shards[@]}" <<'PY'
import sqlite3, sys
full, merged, n, p = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0, t1, t2, t3 = (float(x) for x in sys.argv[5:9])
shards = sys.argv[9:]
c = sqlite3.connect(merged)
c.execute("ATTACH DATABASE ? AS f", (full,))
tables = [r[0] for r in c.execute(
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'meta' ORDER BY name")]
ftables = [r[0] for r in c.execute(
    "SELECT name FROM f.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'meta' ORDER BY name")]
bad = []
if tables != ftables:
    bad.append(f"tables differ: {tables} vs {ftables}")
print(f"{'table':14} {'unsharded':>10} {'merged':>10} {'rows differing':>15}")
for t in tables:
    cols = ", ".join(f'"{r[1]}"' for r in c.execute(f"PRAGMA main.table_info('{t}')"))
    fcols = ", ".join(f'"{r[1]}"' for r in c.execute(f"PRAGMA f.table_info('{t}')"))
    if cols != fcols:
        bad.append(f"{t}: columns differ")
        continue
    na = c.execute(f'SELECT count(*) FROM f."{t}"').fetchone()[0]
    nb = c.execute(f'SELECT count(*) FROM main."{t}"').fetchone()[0]
    g = lambda s: f'SELECT {cols}, count(*) FROM {s}."{t}" GROUP BY {cols}'
    diff = c.execute(f"SELECT count(*) FROM ({g('f')} EXCEPT {g('main')})").fetchone()[0] + \
           c.execute(f"SELECT count(*) FROM ({g('main')} EXCEPT {g('f')})").fetchone()[0]
    print(f"{t:14} {na:10,} {nb:10,} {diff:15,}")
    if na != nb or diff:
        bad.append(f"{t}: {na} rows unsharded, {nb} merged, {diff} differing")
skip = {"command", "shards", "merged_from", "peak_connections"}
ma = dict(c.execute("SELECT key, value FROM f.meta"))
mb = dict(c.execute("SELECT key, value FROM main.meta"))
for k in sorted(set(ma) | set(mb)):
    if k not in skip and ma.get(k) != mb.get(k):
        bad.append(f"meta {k}: {ma.get(k)!r} unsharded, {mb.get(k)!r} merged")
if int(mb["peak_connections"]) < int(ma["peak_connections"]):
    bad.append("merged peak_connections below the unsharded run's")
per = [sqlite3.connect(s).execute("SELECT count(*) FROM connections").fetchone()[0] for s in shards]
print(f"meta rows compared: {len(set(ma) | set(mb)) - len(skip & (set(ma) | set(mb)))} "
      f"(not: {', '.join(sorted(skip))}); peak_connections {ma['peak_connections']} unsharded, "
      f"{mb['peak_connections']} merged (sum of the shards')")
print(f"frames {int(ma['frames']):,}; connections per shard: {', '.join(f'{x:,}' for x in per)}")
print(f"wall: unsharded {t1 - t0:.2f} s; {n} shards {p} at a time {t2 - t1:.2f} s; merge {t3 - t2:.2f} s")
if bad:
    print("MISMATCH:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print(f"MATCH: the {n} merged shards equal the unsharded run in every table and meta row compared")
print(f"scale: {n} {p} {t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f}")
PY
