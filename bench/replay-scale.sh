#!/usr/bin/env bash
# Replay at scale: 10,000 connections arriving at 800/s (about 1,000 open at once) through
# per-connection pipes on this machine; prints failures, concurrency and timing figures.
# Usage (root): bench/replay-scale.sh [CONNECTIONS] [RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
rate=${2:-800}
scripts/deps.sh test >/dev/null
cargo build --release -q
m=./target/release/mimic
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
