#!/usr/bin/env bash
# Capture-rate benchmark for `mimic capture` against `tcpdump -w` on the same veth traffic.
#
# Builds two network namespaces joined by a veth pair (198.18.90.0/24, offloads off), runs
# iperf3 TCP through them at several offered rates (small MSS for a high packet rate), and
# captures on the server's veth with each tool in turn:
#   tcpdump -w        (-s 128, -B 64 MiB ring)
#   mimic libpcap     (iface:, headers only, anonymized, 64 MiB ring)
#   mimic DPDK        (net_af_packet vdev on the veth; needs a --features dpdk build)
# For each run it prints packets/s kept and two loss figures: "missing" = the veth's own packet
# counters (rx + tx, the truth) over the run minus what the tool captured, and "reported" =
# what the tool itself says it dropped (tcpdump's "dropped by kernel"; mimic's kernel +
# interface + capture drops). The share is missing / counters.
# Fairness: tcpdump runs with --immediate-mode (otherwise its TPACKET_V3 ring hands packets over
# only when a block fills or its 1 s timeout passes, and packets still in the ring when it is
# stopped look "lost"), and every tool is stopped only STOP_WAIT (1.5 s) after iperf3 ends.
# Then it measures DPDK net_pcap throughput from a file against the plain file source.
#
# Usage: bench/capture.sh [path/to/mimic]   (root; iperf3, tcpdump, ethtool, mergecap)
set -euo pipefail
cd "$(dirname "$0")/.."
MIMIC=${1:-target/release/mimic}
SECS=${SECS:-5}
RATES=${RATES:-"100M 300M 0"}   # the README rows: 100 Mbit/s, 300 Mbit/s, unlimited
STOP_WAIT=${STOP_WAIT:-1.5}
[ "$(id -u)" -eq 0 ] || { echo "bench/capture.sh needs root (namespaces)" >&2; exit 1; }
for t in iperf3 tcpdump ethtool mergecap; do command -v $t >/dev/null || { echo "missing $t (scripts/deps.sh bench)" >&2; exit 1; }; done
[ -x "$MIMIC" ] || { echo "build mimic first: cargo build --release --features dpdk" >&2; exit 1; }

P=$$
C=mcb-$P-c; S=mcb-$P-s; CI=mcb${P}c; SI=mcb${P}s
WORK=$(mktemp -d /tmp/mimic-bench-capture.XXXXXX)
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  ip netns pids "$S" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$C" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$C" 2>/dev/null || true
  ip netns del "$S" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$C"; ip netns add "$S"
ip link add "$CI" type veth peer name "$SI"
ip link set "$CI" netns "$C"; ip link set "$SI" netns "$S"
ip -n "$C" addr add 198.18.90.1/24 dev "$CI"; ip -n "$S" addr add 198.18.90.2/24 dev "$SI"
for ns in "$C" "$S"; do ip -n $ns link set lo up; done
ip -n "$C" link set "$CI" up; ip -n "$S" link set "$SI" up
ip netns exec "$C" ethtool -K "$CI" tso off gso off gro off tx off >/dev/null 2>&1 || true
ip netns exec "$S" ethtool -K "$SI" tso off gso off gro off tx off >/dev/null 2>&1 || true
ip netns exec "$S" iperf3 -s -D -B 198.18.90.2 -p 5201 >/dev/null
sleep 0.5

ifpkts() { ip netns exec "$S" sh -c "echo \$(( \$(cat /sys/class/net/$SI/statistics/rx_packets) + \$(cat /sys/class/net/$SI/statistics/tx_packets) ))"; }
wait_ready() { for _ in $(seq 200); do [ -e "$1/capture.ready" ] && return 0; sleep 0.05; done; echo "capture never ready" >&2; return 1; }

printf "%-16s %8s %12s %12s %10s %10s %10s\n" tool rate if_pkts/s captured/s missing reported share
run() { # tool rate
  local tool=$1 rate=$2 out="$WORK/$1-$2" pid before after got dropped
  mkdir -p "$out"
  case $tool in
    tcpdump)
      ip netns exec "$S" tcpdump -i "$SI" -n -s 128 -B 65536 --immediate-mode -w "$out/t.pcap" 2>"$out/err" & pid=$!
      for _ in $(seq 100); do [ -e "$out/t.pcap" ] && break; sleep 0.05; done; sleep 0.3 ;;
    mimic-libpcap)
      ip netns exec "$S" "$MIMIC" -q capture --source "iface:$SI" -o "$out" --buffer 64MiB 2>"$out/err" & pid=$!
      wait_ready "$out" ;;
    mimic-dpdk)
      ip netns exec "$S" "$MIMIC" -q capture -o "$out" --source "dpdk:--no-huge --no-pci --no-shconf --no-telemetry --log-level=warning -m 512 --vdev=net_af_packet0,iface=$SI,framecnt=65536,blocksz=4096,framesz=2048" 2>"$out/err" & pid=$!
      wait_ready "$out" ;;
  esac
  before=$(ifpkts)
  ip netns exec "$C" iperf3 -c 198.18.90.2 -p 5201 -t "$SECS" -M 536 -b "$rate" >/dev/null
  # let every tool hand over what its ring still holds before reading the counters and stopping
  sleep "$STOP_WAIT"
  after=$(ifpkts)
  kill -TERM $pid; wait $pid || true
  if [ $tool = tcpdump ]; then
    got=$(grep -o '^[0-9]* packets captured' "$out/err" | cut -d' ' -f1)
    dropped=$(grep -o '^[0-9]* packets dropped by kernel' "$out/err" | cut -d' ' -f1)
  else
    # packets the capture saw (it writes the TCP ones; ARP and other non-TCP frames are dropped by policy)
    got=$(python3 -c "import json;s=json.load(open('$out/capture-summary.json'));print(s['received']-s['capture_dropped'])")
    dropped=$(python3 -c "import json;s=json.load(open('$out/capture-summary.json'));print(s['kernel_dropped']+s['interface_dropped']+s['capture_dropped'])")
  fi
  local total=$((after - before))
  # the veth counters are the truth: whatever the capture did not get is missing
  local lost=$(( total > got ? total - got : 0 ))
  python3 - "$tool" "$rate" "$total" "$got" "${dropped:-0}" "$lost" "$SECS" <<'PY'
import sys
tool, rate, total, got, dropped, lost, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
share = lost / total if total else 0.0
print(f"{tool:<16} {rate if rate != '0' else 'max':>8} {total/secs:12.0f} {got/secs:12.0f} {lost:10d} {dropped:10d} {share*100:9.3f}%")
PY
  rm -rf "$out"
}
for rate in $RATES; do
  for tool in tcpdump mimic-libpcap mimic-dpdk; do
    run $tool $rate
  done
done

echo
echo "file throughput (same big file, headers only, anonymized, all connections):"
BIG="$WORK/big.pcap"
SRC=../shared/traces/public/web/zeek_echo-connections.pcap
mergecap -F pcap -a -w "$BIG" $(for i in $(seq 10); do echo $SRC; done)
N=$(capinfos -c -M "$BIG" | awk '/Number of packets/ {print $4}')
for how in file dpdk-net_pcap; do
  out="$WORK/f-$how"; mkdir -p "$out"
  if [ $how = file ]; then src="pcap:$BIG"; else src="dpdk:--no-huge --no-pci --no-shconf --no-telemetry --log-level=warning -m 512 --vdev=net_pcap0,rx_pcap=$BIG"; fi
  start=$(date +%s.%N)
  "$MIMIC" -q capture --source "$src" -o "$out" 2>/dev/null
  end=$(date +%s.%N)
  python3 - "$how" "$N" "$start" "$end" "$out/capture-summary.json" <<'PY'
import json, sys
how, n, start, end, summ = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
s = json.load(open(summ))
wall = end - start
extra = " (includes EAL start-up and the 0.5 s end-of-file idle detection)" if how != "file" else ""
print(f"{how:<16} {s['received']:9d}/{n} packets in {wall:6.2f} s = {s['received']/wall:10.0f} packets/s{extra}")
PY
  rm -rf "$out"
done
