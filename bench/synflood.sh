#!/usr/bin/env bash
# Memory on hostile input: a SYN scan nobody answers (COUNT connection attempts, 3 M by
# default, 100,000 SYNs/s, each from its own source address and port; `bench/src/bin/
# syn_flood.rs`) through `mimic analyze`, under `/usr/bin/time -v`. Prints the peak RSS, the
# wall and CPU time, and the bytes of peak RSS per connection attempt; fails when the peak is
# over LIMIT_KIB (1 GiB by default: the goal of issue 21). RETRIES=R resends every SYN R more
# times (1 s apart, as an unanswered client does).
# Usage: bench/synflood.sh [COUNT]   (PROFILE=test-build to time the test suite's binary)
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-3000000}
profile=${PROFILE:-release}
retries=${RETRIES:-0}
limit_kib=${LIMIT_KIB:-1048576}
scripts/deps.sh bench >/dev/null
if [ "$profile" = release ]; then
  cargo build --release -q -p mimic -p mimic-bench   # as bench/analyze.sh builds it
else
  cargo build --profile "$profile" -q -p mimic -p mimic-bench --features mimic/dpdk   # as the tests do
fi
bin=./target/$profile
out=bench/out
mkdir -p "$out"
trace=$out/synflood-$count-r$retries.pcap
if [ ! -s "$trace" ]; then
  "$bin/syn-flood" --out "$trace" --count "$count" --retries "$retries"
fi
cat "$trace" > /dev/null   # warm the page cache
rm -f "$out/synflood.db"
log=$out/synflood.time
/usr/bin/time -v "$bin/mimic" analyze "$trace" -o "$out/synflood.db" -q 2> "$log"
rm -f "$out/synflood.db"
python3 - "$log" "$count" "$limit_kib" <<'PY'
import re, sys
log, count, limit = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
def field(name):
    return re.search(re.escape(name) + r": (.*)", log).group(1).strip()
rss = int(field("Maximum resident set size (kbytes)"))
wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)")
user, sys_ = float(field("User time (seconds)")), float(field("System time (seconds)"))
print(f"{count:,} unanswered SYNs: peak RSS {rss:,} KiB ({rss / 1048576:.2f} GiB), "
      f"{rss * 1024 / count:.0f} bytes per connection attempt; "
      f"wall {wall}, CPU {user:.1f} s user + {sys_:.1f} s system")
if rss > limit:
    print(f"over the limit of {limit:,} KiB", file=sys.stderr)
    sys.exit(1)
PY
