#!/usr/bin/env bash
# Replay at scale: 10,000 connections arriving at 800/s (about 1,000 open at once) through
# per-connection pipes on this machine; prints failures, concurrency and timing figures.
#
# With --emulator netem --kernel IMAGE the pipes are kernel pipes instead: the lab's router host
# is a QEMU guest booting IMAGE (`debian`: Debian's stock kernel, fetched with `mimic lab
# fetch-kernel`), and each connection's netem pipes are installed with tc ahead of its SYN and
# removed after it closes (`--kernel-pipes per-connection`). Prints the completed share, late
# installs, the most pipes installed at once, install/removal batch times p50/p99, the removal
# lag, min RTT within 10% or 2 ms of the truth, and the guest's CPU (busy share of its one vCPU
# over the replay, from its /proc/stat). A TCG guest (no working KVM here) is far slower than a
# real router: its figures bound what the guest sustains, not what hardware does.
#
# Usage (root): bench/replay-scale.sh [--emulator netem --kernel IMAGE] [CONNECTIONS] [RATE]
#   MIMIC=path/to/mimic  use that binary instead of building a release one
#   KEEP=1               keep the lab up afterwards (kernel mode; `mimic lab down NAME` yourself)
#   LAB=NAME             use that lab (up already, its router a guest) instead of booting one;
#                        it is left up
set -euo pipefail
cd "$(dirname "$0")/.."
emulator=mimic
kernel=
pos=()
while [ $# -gt 0 ]; do
    case "$1" in
        --emulator) emulator=$2; shift 2 ;;
        --kernel) kernel=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        -*) echo "replay-scale.sh: unknown option $1" >&2; exit 2 ;;
        *) pos+=("$1"); shift ;;
    esac
done
if [ "$emulator" != mimic ] && [ -z "$kernel" ]; then
    echo "replay-scale.sh: --emulator $emulator needs --kernel IMAGE (this machine's kernel has no sch_netem)" >&2
    exit 2
fi
if [ -n "$kernel" ] && [ "$emulator" = mimic ]; then
    echo "replay-scale.sh: --kernel runs kernel pipes: give --emulator netem" >&2
    exit 2
fi
n=${pos[0]:-10000}
rate=${pos[1]:-800}
scripts/deps.sh test >/dev/null
if [ -n "${MIMIC:-}" ]; then
    m=$MIMIC
else
    cargo build --release -q
    m=./target/release/mimic
fi
if [ -z "$kernel" ]; then
    out=bench/out/scale
    rm -rf "$out"; mkdir -p "$out"
    $m synth --connections "$n" --rate "$rate" --seed 5 -o "$out/workload.db"
    /usr/bin/time -v $m replay "$out/workload.db" -o "$out/replay.db" --lab scale$$ --json > "$out/summary.json" 2> "$out/time.txt"
    # the delays as the capture of the replay shows them (analysis of the server-side capture
    # against the workload's truth): what the server emulator's own lateness figures leave out
    $m synth check "$out/workload.db" "$out/replay.db" --json > "$out/accuracy.json" || true
    python3 - "$out/summary.json" "$out/time.txt" "$out/accuracy.json" <<'PY'
import json, re, sys
s = json.load(open(sys.argv[1]))
t = open(sys.argv[2]).read()
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", t)
print(f"connections {s['connections']}: ok {s['ok']}, failed {s['failed']} {s['failures']}, missing {s['missing']}")
print(f"at most {s['max_concurrent']} open at once; run took {s['duration_s']:.0f} s")
print(f"connection starts late by p50 {s['start_lateness_us'][0]} µs, p99 {s['start_lateness_us'][1]} µs, p99.9 {s['start_lateness_p999_us']} µs, max {s['start_lateness_us'][2]} µs; {s['starts_over_1ms']} of {s['connections']} more than 1 ms late")
e = s['server']['response_delay_error']; q = s['server']['query_delay_error']
print(f"server delays late by p50 {e['p50_us']} µs / p99 {e['p99_us']} µs / p99.9 {e['p999_us']} µs / max {e['max_us']} µs (response), p99 {q['p99_us']} µs / p99.9 {q['p999_us']} µs / max {q['max_us']} µs (query)")
print(f"server delays more than 1 ms late: {e['over_1ms']} of {e['count']} responses, {q['over_1ms']} of {q['count']} query delays")
if s.get('cpu_split'): print(f"CPU split: datapath on CPU {s['cpu_split']['datapath']}, timer threads on {s['cpu_split']['timers']}")
print(f"analysis: {s['analysis']['connections']} connections, {s['analysis']['complete']} complete")
acc = json.load(open(sys.argv[3]))
for c in acc['checks']:
    if c['parameter'] in ('response delay', 'query delay'):
        print(f"{c['parameter']} in the capture vs truth: {c['n']} exchanges, {c['share']*100:.1f}% within 2 ms, |error| median {c['median_abs_error']:.3f} ms, p99 {c['p99_abs_error']:.3f} ms")
if rss: print(f"peak RSS of the orchestrator and client emulator: {int(rss.group(1))/1024:.0f} MiB")
PY
    exit 0
fi

# kernel pipes in the lab's router guest
if [ "$kernel" = debian ]; then
    kernel=$($m lab fetch-kernel linux-image-amd64)
fi
out=bench/out/scale-$emulator
rm -rf "$out"; mkdir -p "$out"
lab=${LAB:-ks$$}
[ -z "${LAB:-}" ] || KEEP=1
down() { [ -n "${KEEP:-}" ] || $m -q lab down "$lab" >/dev/null 2>&1 || true; }
trap down EXIT
[ -n "${KEEP:-}" ] || export MIMIC_LAB_OWNER=$$   # killed before the trap runs: `mimic lab sweep` removes the lab
trap 'exit 130' INT TERM
$m synth --connections "$n" --rate "$rate" --seed 5 --max-response 50000 -o "$out/workload.db" > /dev/null
[ -n "${LAB:-}" ] || $m -q lab up "$lab" --kernel "$kernel"
$m lab exec "$lab" emu -- cat /proc/stat > "$out/stat-before.txt"
/usr/bin/time -v $m replay "$out/workload.db" -o "$out/replay.db" --lab "$lab" --keep-lab \
    --emulator "$emulator" --kernel-pipes per-connection --json > "$out/summary.json" 2> "$out/time.txt" || {
    echo "replay failed:" >&2; tail -20 "$out/time.txt" >&2; exit 1; }
$m lab exec "$lab" emu -- cat /proc/stat > "$out/stat-after.txt"
left=$($m lab exec "$lab" emu -- tc qdisc show | grep -c -e netem -e '6d69:' || true)
python3 - "$out" "$n" "$rate" "$left" <<'PY'
import json, sqlite3, sys
out, n, rate, left = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = json.load(open(f"{out}/summary.json"))
k = s["kernel_pipes"]
def cpu(f):
    for l in open(f):
        if l.startswith("cpu "):
            v = [int(x) for x in l.split()[1:]]
            return sum(v[:8]), v[3] + v[4]
(t0, i0), (t1, i1) = cpu(f"{out}/stat-before.txt"), cpu(f"{out}/stat-after.txt")
busy = 1 - (i1 - i0) / max(t1 - t0, 1)
db = sqlite3.connect(f"{out}/replay.db")
db.execute("ATTACH DATABASE ? AS t", (f"{out}/workload.db",))
replayed, complete = db.execute(
    "SELECT count(m.replay_conn_id), coalesce(sum(r.complete), 0) FROM replay_map m "
    "LEFT JOIN connections r ON r.id = m.replay_conn_id").fetchone()
rtt_ok, rtt_n = db.execute(
    "SELECT coalesce(sum(abs(r.min_rtt_us - o.min_rtt_us) <= max(0.1 * o.min_rtt_us, 2000)), 0), count(*) "
    "FROM replay_map m JOIN t.connections o ON o.id = m.orig_conn_id "
    "JOIN connections r ON r.id = m.replay_conn_id "
    "WHERE r.min_rtt_us IS NOT NULL AND o.min_rtt_us IS NOT NULL").fetchone()
print(f"kernel pipes on {k['router']}: {n} connections arriving at {rate:g}/s, per connection")
print(f"replayed {replayed} of {n} ({100*replayed/n:.1f}%), complete {complete} ({100*complete/n:.1f}%); client ok {s['ok']}, failed {s['failed']} {s['failures']}, missing {s['missing']}")
print(f"late installs {k['late_installs']} of {n}; at most {k['max_installed']} connections' pipes installed at once ({2*k['max_installed']} pipes); {s['max_concurrent']} connections open at once")
ib, rb, lag = k["install_batch_ms"], k["remove_batch_ms"], k["remove_lag_ms"]
print(f"install batches {k['batches']}: p50 {ib[0]:.0f} ms, p99 {ib[1]:.0f} ms, max {k['batch_max_ms']:.0f} ms; lead time at the end {k['lead_ms']:.0f} ms")
print(f"removal batches {k['remove_batches']}: p50 {rb[0]:.0f} ms, p99 {rb[1]:.0f} ms, max {rb[2]:.0f} ms; removal lag p99 {lag[0]:.0f} ms, max {lag[1]:.0f} ms; {k['remove_errors']} failed")
print(f"router calls {k['router_calls']} ({k['router_calls']/max(s['duration_s'],1e-9):.1f}/s)")
print(f"min RTT within 10% or 2 ms of the truth: {rtt_ok} of {rtt_n} ({100*rtt_ok/max(rtt_n,1):.1f}%)")
print(f"guest CPU busy {100*busy:.0f}% of its vCPU over the replay ({s['duration_s']:.0f} s)")
print(f"mimic's qdiscs left in the guest after the replay: {left}")
PY
echo "host load: $(cat /proc/loadavg)"
