#!/usr/bin/env bash
# The independent-truth testbed (issue 18): real clients (curl; Python's http.client with
# keep-alive, several requests per connection and think times) and real servers (Debian's
# nginx; a small threaded query server whose replies wait the configured response and query
# delays) in network namespaces this script builds, behind shapers mimic did not write (the
# kernel's htb per client address, and netem for delay and loss where the kernel has it),
# captured with tcpdump at the server. Each connection's configured truth is written beside the
# capture (truth.csv, keyed by client address and port; requests.csv; server.csv: what the
# query server really did). Then `mimic analyze` reads the capture, the analysis is joined with
# the truth per connection, `mimic replay --lab` replays the analyzed flows.db and `mimic
# compare` pairs the replay with it; the per-class tables (analyzer accuracy, replay fidelity)
# are printed and written to OUT/table.{txt,json,csv} (atomically).
#
# Usage (root): bench/independent.sh [--connections N] [--quick] [--no-delay] [--coarse-tick]
#                                    [--netem-guest [IMAGE]] [--classes A,B] [--seed S]
#                                    [--no-replay] [--out DIR] [--regrade DIR]
#                                    [--server-initcwnd N] [--addrs N] [--fast-addrs N]
#                                    [--fast-shaper htb|netem-rate] [--keep-replay-capture]
#                                    [--predict [--predict-initcwnd FROM,TO]]
#   --connections N  connections in all (default 2000), spread evenly over the classes
#   --quick          100 connections on two classes (isdn-128k, dsl-4m): checks the harness
#   --no-delay       rate-only classes (the LAN's own RTT, no loss): what runs where the kernel
#                    has no netem. Without it a class with delay or loss needs netem, and the
#                    script stops with an error naming what is missing, unless a kernel image
#                    for a router guest is at hand (below).
#   --netem-guest [IMAGE]  the router is a QEMU guest on IMAGE (default: the newest kernel
#                    `mimic lab fetch-kernel` put in its cache; Debian's stock kernel has netem),
#                    booted with `mimic lab up --kernel`: the testbed's own htb + netem commands
#                    run in it (not mimic's renderer), clients and servers stay in namespaces
#                    of this machine. The automatic choice when a class needs delay or loss,
#                    this kernel has no netem and such an image is in the cache (said on
#                    stderr). Under TCG the guest adds ~1 ms of forwarding (measured: the base
#                    RTT) and 60-170 us of timer jitter. All eight classes run in it: the two
#                    over 12 Mbit/s on netem's rate (--fast-shaper) and with 1 address each
#                    (--fast-addrs), the others on htb with 8 (--addrs). See GUIDE.md.
#   --coarse-tick    packets leave the shapers on the kernel's timer tick (dummynet-like). With
#                    --netem-guest the router guest boots with highres=off (mimic lab up
#                    --kernel-cmdline) and its hrtimer resolution is checked in it: Debian's
#                    HZ=250 kernel ticks every 4 ms, coarser than dummynet's 1 ms. Each htb
#                    bucket then holds one tick's bytes at the class's rate + one packet (a
#                    100-byte bucket would send one packet per tick: goodput -25% at 4 Mbit/s,
#                    -70% at 12; the tick's bucket 0.0%, netem rate -0.9%; htb kept so only
#                    the tick differs between modes). Six guest classes, 1,200 connections:
#                    bandwidth within 20% 97.5% (<= 10 Mbit/s), replay 91.1% (fine timers
#                    99.9% / 96.8%); netem's delays end on the tick too (pings +1-7 ms).
#                    Without --netem-guest
#                    this kernel must run at tick resolution (booted with highres=off);
#                    refused, saying so, where its timers are high-resolution. See GUIDE.md.
#   --classes A,B    only these classes (names in bench/independent.py: CLASSES)
#   --addrs N        client addresses per class, each running one connection at a time
#                    (default 32; with --netem-guest 8: a TCG guest does not forward the
#                    full mix's bursts, see GUIDE.md)
#   --fast-addrs N   client addresses of each class over 12 Mbit/s (cable-25m, fibre-50m;
#                    default --addrs; with --netem-guest 1: with 8 the guest's own queueing
#                    during the eight-class workload reached 50 ms at p99 and the fast
#                    classes' min RTT fell to 75%, with 2 fibre-50m replayed 65% within
#                    +-20%, with 1 85% and every class >= 85%; see GUIDE.md)
#   --fast-shaper htb|netem-rate  what limits the rate of the classes over 12 Mbit/s (the
#                    truth's shaper column says it per connection): htb, a token bucket of
#                    100 bytes (the default on this machine, every class's shaper), or netem's
#                    rate, a serializing link (the default with --netem-guest: htb's bucket of
#                    less than a packet loses the tokens of every late timer, and the guest's
#                    timers end 60-170 us late, so it held 25 and 50 Mbit/s 12% and 24% short;
#                    netem's rate schedules each departure from the previous one's and held
#                    both within 0.3%). netem-rate needs netem: here, or in the guest.
#   --no-replay      the analyzer table only
#   --out DIR        output folder (default bench/out/independent; replaced)
#   --regrade DIR    no new traffic: copy an earlier run's capture and truth from DIR into
#                    --out and analyze, replay and report them again (with this build), so two
#                    builds are compared on the very same original connections
#   --keep-replay-capture  keep the replay's own capture (pcapng, at the server as the
#                    original's) in OUT/replay-cap/, to compare the two per packet
# MIMIC=path/to/mimic uses that binary instead of building target/release/mimic.
set -euo pipefail
cd "$(dirname "$0")/.."

connections=2000 quick=0 no_delay=0 coarse=0 classes="" seed=18 replay=1 regrade=
guest=auto guest_img="" addrs="" fast_addrs="" fast_shaper="" keep_rcap=0
out=bench/out/independent server_iw="" predict=0 predict_iw=3,10
# --predict runs this script twice: every option but its own, --out and --regrade goes to both
# runs as given (so a mode added later composes with it untouched)
pass=() prev=""
for a in "$@"; do
  case "$prev" in --out|--regrade|--predict-initcwnd) prev=""; continue ;; esac
  case "$a" in
    --predict) ;;
    --out|--regrade|--predict-initcwnd) prev=$a ;;
    *) pass+=("$a") ;;
  esac
done
while [ $# -gt 0 ]; do
  case "$1" in
    --connections) connections=${2:?--connections needs a number}; shift ;;
    --quick) quick=1 ;;
    --no-delay) no_delay=1 ;;
    --coarse-tick) coarse=1 ;;
    --netem-guest)
      guest=1
      if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then guest_img=$2; shift; fi ;;
    --classes) classes=${2:?--classes needs a list}; shift ;;
    --addrs) addrs=${2:?--addrs needs a number}; shift ;;
    --fast-addrs) fast_addrs=${2:?--fast-addrs needs a number}; shift ;;
    --fast-shaper) fast_shaper=${2:?--fast-shaper needs htb or netem-rate}; shift ;;
    --seed) seed=${2:?--seed needs a number}; shift ;;
    --no-replay) replay=0 ;;
    --keep-replay-capture) keep_rcap=1 ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --regrade) regrade=${2:?--regrade needs a folder}; shift ;;
    --server-initcwnd) server_iw=${2:?--server-initcwnd needs a number}; shift ;;
    --predict) predict=1 ;;
    --predict-initcwnd) predict_iw=${2:?--predict-initcwnd needs FROM,TO}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "independent: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$connections" in ''|*[!0-9]*) echo "independent: --connections $connections: not a number" >&2; exit 2 ;; esac
initcwnd_ok() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; [ "$1" -ge 1 ] && [ "$1" -le 1000 ]; }
if [ -n "$server_iw" ] && ! initcwnd_ok "$server_iw"; then
  echo "independent: --server-initcwnd $server_iw: not a window of 1 to 1000 segments" >&2; exit 2
fi
iw_from=${predict_iw%%,*} iw_to=${predict_iw#*,}
if [ "$predict" = 1 ]; then
  if ! initcwnd_ok "$iw_from" || ! initcwnd_ok "$iw_to" || [ "$iw_from" = "$iw_to" ]; then
    echo "independent: --predict-initcwnd $predict_iw: want FROM,TO, two different windows of 1 to 1000 segments" >&2; exit 2
  fi
  [ -z "$server_iw" ] || { echo "independent: --predict sets the server's initcwnd itself (--predict-initcwnd FROM,TO), not --server-initcwnd" >&2; exit 2; }
  [ "$replay" = 1 ] || { echo "independent: --predict replays the original: it cannot go with --no-replay" >&2; exit 2; }
fi
case "$fast_shaper" in ''|htb|netem-rate) ;; *) echo "independent: --fast-shaper $fast_shaper: want htb or netem-rate" >&2; exit 2 ;; esac
case "$addrs" in '') ;; *[!0-9]*|0) echo "independent: --addrs $addrs: not a number from 1 to 254" >&2; exit 2 ;; esac
[ -z "$addrs" ] || [ "$addrs" -le 254 ] || { echo "independent: --addrs $addrs: at most 254" >&2; exit 2; }
case "$fast_addrs" in '') ;; *[!0-9]*|0) echo "independent: --fast-addrs $fast_addrs: not a number from 1 to 254" >&2; exit 2 ;; esac
[ -z "$fast_addrs" ] || [ "$fast_addrs" -le 254 ] || { echo "independent: --fast-addrs $fast_addrs: at most 254" >&2; exit 2; }
if [ "$quick" = 1 ]; then
  [ -n "$classes" ] || classes=isdn-128k,dsl-4m
  [ "$connections" != 2000 ] || connections=100
fi
[ "$(id -u)" -eq 0 ] || { echo "independent: needs root (namespaces, tc, tcpdump)" >&2; exit 2; }
missing=()
for cmd in ip tc ethtool tcpdump nginx curl python3 sqlite3 ping; do
  command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "independent: missing ${missing[*]} (scripts/deps.sh bench installs them)" >&2
  exit 2
fi
if [ -n "${MIMIC:-}" ]; then
  m=$MIMIC
else
  cargo build --release -q -p mimic
  m=./target/release/mimic
fi
[ -x "$m" ] || { echo "independent: $m: no mimic binary" >&2; exit 2; }
py=bench/independent.py

if [ "$predict" = 1 ]; then
  # the prediction check: two runs of this script (same options, same seeded plan), then the
  # FROM original replayed at TO, and the report
  if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/predict.args" ]; then
    echo "independent: $out: exists and is not an earlier --predict output of this script; give another --out" >&2
    exit 2
  fi
  if [ -n "$regrade" ]; then
    for d in "iw$iw_from" "iw$iw_to"; do
      [ -f "$regrade/$d/truth.csv" ] ||
        { echo "independent: --predict --regrade $regrade: no $d/truth.csv there (not a --predict output with these windows?)" >&2; exit 2; }
    done
    [ "$(cd "$regrade" && pwd)" != "$(mkdir -p "$out" && cd "$out" && pwd)" ] ||
      { echo "independent: --regrade needs an --out other than $regrade" >&2; exit 2; }
  fi
  rm -rf "$out"
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  printf '%s\n' "$0" "$@" >"$out/predict.args"
  export MIMIC=$m
  tag=ind$$
  trap '"$m" lab down "$tag" >/dev/null 2>&1 || true' EXIT
  export MIMIC_LAB_OWNER=$$   # killed before the trap runs: `mimic lab sweep` removes the lab
  for iw in "$iw_from" "$iw_to"; do
    echo "independent: --predict: the workload with the server at initcwnd $iw" >&2
    run_args=("${pass[@]}" --server-initcwnd "$iw" --out "$out/iw$iw")
    if [ -n "$regrade" ]; then run_args+=(--regrade "$regrade/iw$iw"); fi
    # the TO run needs no replay of its own: its analysis is the real outcome
    if [ "$iw" = "$iw_to" ]; then run_args+=(--no-replay); fi
    "$0" "${run_args[@]}"
  done
  echo "independent: --predict: replaying the initcwnd $iw_from original with --stack initcwnd=$iw_to (the prediction)" >&2
  "$m" -q replay "$out/iw$iw_from/flows.db" -o "$out/predicted.db" --lab "$tag" \
    --stack "initcwnd=$iw_to" --json >"$out/predicted.json"
  # mimic compare's own KS (exact p) of the same distributions, as a cross-check
  "$m" -q compare "$out/iw$iw_to/flows.db" "$out/predicted.db" "$out/iw$iw_from/flows.db" \
    --json "$out/compare.json" >"$out/compare.txt"
  python3 "$py" predict --from-dir "$out/iw$iw_from" --to-dir "$out/iw$iw_to" \
    --predicted "$out/predicted.db" --compare-json "$out/compare.json" --out "$out"
  echo "independent: prediction in $out/prediction.{txt,json,csv}" >&2
  exit 0
fi

# --coarse-tick with --netem-guest boots the router guest with highres=off and checks its
# timers there (after `lab up`, below); on this kernel the check is here
if [ "$coarse" = 1 ] && [ "$guest" != 1 ]; then
  # hrtimer resolution of CPU 0's clocks: 1 ns with high-resolution timers, the tick
  # (1/HZ) with highres=off. The qdisc watchdogs of htb, tbf and netem are hrtimers.
  res=$(awk '/\.resolution:/ {print $2; exit}' /proc/timer_list 2>/dev/null || echo "")
  if [ -z "$res" ] || [ "$res" -lt 1000000 ]; then
    echo "independent: --coarse-tick: this kernel's timers are high-resolution (hrtimer resolution ${res:-unknown} ns)," >&2
    echo "  so htb/tbf/netem release packets at their exact times, not on a tick; run the testbed in a guest" >&2
    echo "  booted with highres=off (a HZ=1000 kernel gives 1 ms ticks; Debian's stock kernel is HZ=250: 4 ms):" >&2
    echo "  give --netem-guest too (the router guest boots with highres=off)" >&2
    exit 2
  fi
  tick_ms=$(awk -v r="$res" 'BEGIN {printf "%g", r / 1e6}')
fi

# the output folder is replaced, but only when it is one of ours (or empty)
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/truth.csv" ]; then
  echo "independent: $out: exists and is not an earlier output of this script; give another --out" >&2
  exit 2
fi
if [ -n "$regrade" ]; then
  for f in truth.csv requests.csv server.csv clients.csv classes.txt base_rtt_us cap.pcap; do
    [ -f "$regrade/$f" ] || { echo "independent: --regrade $regrade: no $f there (not an output of this script?)" >&2; exit 2; }
  done
  [ "$(cd "$regrade" && pwd)" != "$(mkdir -p "$out" && cd "$out" && pwd)" ] ||
    { echo "independent: --regrade needs an --out other than $regrade" >&2; exit 2; }
  was_iw=$(cat "$regrade/server_initcwnd" 2>/dev/null || echo "")
  if [ -n "$server_iw" ] && [ "$server_iw" != "$was_iw" ]; then
    echo "independent: --regrade $regrade: its server ran at initcwnd ${was_iw:-10 (the kernel default)}, not $server_iw" >&2
    exit 2
  fi
fi
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tag=ind$$
# client ports of the shaping check's downloads (the plan's lie in 20000-23000)
CHECK_PORTS=40000-40999

# analyze the capture, replay it, compare, and print the tables
grade() {
  echo "independent: analyzing the capture" >&2
  # (the readiness probe from 198.19.255.1 and the departure probe are not part of the workload)
  run "$m" -q analyze "$out/cap.pcap" -o "$out/flows.db" --filter 'not host 198.19.255.1 and not host 198.19.254.1' \
    --json >"$out/analyze.json"
  local report_args=()
  if [ "$replay" = 1 ]; then
    echo "independent: replaying flows.db in mimic's lab" >&2
    # connections without a bandwidth estimate get their client's or RTT class's median
    # (--unestimated pooled, the default) and an inferred delayed-ACK timeout over the pipe's 2 s
    # is replayed as the default; replay.json's rate_sources counts both (the report prints them)
    # the replay's server gets the original server's initial window (--server-initcwnd)
    local stack=()
    if [ -f "$out/server_initcwnd" ]; then stack=(--stack "initcwnd=$(cat "$out/server_initcwnd")"); fi
    if [ "$keep_rcap" = 1 ]; then stack+=(--keep-capture "$out/replay-cap"); fi
    run "$m" -q replay "$out/flows.db" -o "$out/replay.db" --lab "$tag" "${stack[@]}" --json >"$out/replay.json"
    "$m" -q compare "$out/flows.db" "$out/replay.db" --json "$out/compare.json" >"$out/compare.txt"
    report_args=(--replay "$out/replay.db" --compare-json "$out/compare.json")
  fi
  python3 "$py" report --dir "$out" --flows "$out/flows.db" --out "$out" \
    $([ "$no_delay" = 1 ] && echo --no-delay) "${report_args[@]}"
  echo "independent: tables in $out/table.{txt,json,csv}; per connection in $out/analyzer.csv" \
    "$([ "$replay" = 1 ] && echo "and $out/replay.csv")" >&2
}

if [ -n "$regrade" ]; then
  fg_pid=""
  run() { "$@" & fg_pid=$!; wait "$fg_pid"; fg_pid=""; }
  trap '[ -n "$fg_pid" ] && kill -TERM "$fg_pid" 2>/dev/null; "$m" lab down "$tag" >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT TERM
  for f in "$regrade"/*; do
    case "$(basename "$f")" in
      flows.db|replay.db|replay.json|compare.*|analyze.json|table.*|analyzer.csv|replay.csv) ;;
      *) [ -f "$f" ] && cp "$f" "$out/" ;;
    esac
  done
  # rate-only when every class has neither delay nor loss
  no_delay=$(awk '$5 != 0 || $6 != 0 {d = 1} END {print d ? 0 : 1}' "$out/classes.txt")
  echo "independent: regrading $regrade's capture ($(wc -l <"$out/truth.csv" | awk '{print $1 - 1}') connections)" >&2
  grade
  exit 0
fi
# what the servers read and write lives in memory (tmpfs): on a busy machine a write to disk
# can wait hundreds of ms on dirty-page throttling, which would add a server delay the truth
# does not have
mem=$(mktemp -d /dev/shm/mimic-independent.XXXXXX)
C=$tag-c R=$tag-r S=$tag-s
# the interfaces: the clients' and the server's (tcpdump's tap), the shaper's towards the
# clients (downstream) and towards the server (upstream); a router guest has its own (below)
cif=c0 sif=s0 down_if=r0 up_if=r1
pids=() fg_pid=""
cleanup() {
  local rc=$?
  if [ -n "$fg_pid" ]; then kill -TERM "$fg_pid" 2>/dev/null || true; wait "$fg_pid" 2>/dev/null || true; fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -f "$mem/nginx/nginx.pid" ]; then kill "$(cat "$mem/nginx/nginx.pid")" 2>/dev/null || true; fi
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for n in "$C" "$R" "$S" "$tag-nm"; do ip netns del "$n" 2>/dev/null || true; done
  "$m" lab down "$tag" >/dev/null 2>&1 || true
  rm -rf "$mem"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export MIMIC_LAB_OWNER=$$   # killed before the trap runs: `mimic lab sweep` removes its guest lab
# a long step runs in the background and is waited for, so Ctrl-C or a TERM reaches the trap
# at once (not when the step ends) and the cleanup stops the step
run() { "$@" & fg_pid=$!; wait "$fg_pid"; fg_pid=""; }

# ---- where the shapers run: this kernel's htb (and netem where it has it), or a router guest
# (every class has a one-way delay: without --no-delay they need netem)
needs_netem=$([ "$no_delay" = 1 ] && echo 0 || echo 1)
# has_netem: whether this machine's kernel takes a netem qdisc (tried in a throwaway namespace)
has_netem() {
  ip netns add "$tag-nm"
  ip -n "$tag-nm" link add nmchk0 type veth peer name nmchk1
  local ok=0
  tc -n "$tag-nm" qdisc add dev nmchk0 root netem delay 1ms 2>/dev/null && ok=1
  ip netns del "$tag-nm"
  [ "$ok" = 1 ]
}
# the newest kernel image in `mimic lab fetch-kernel`'s cache
cached_kernel() {
  { ls -d "${MIMIC_CACHE_DIR:-/var/cache/mimic}"/kernels/*/boot/vmlinuz-* 2>/dev/null || true; } |
    sort -V | tail -n 1
}
if [ "$guest" = auto ]; then
  guest=0
  if [ "$needs_netem" = 1 ] && ! has_netem; then
    guest_img=$(cached_kernel)
    if [ -z "$guest_img" ]; then
      echo "independent: the classes need delay and loss, and this kernel has no netem qdisc" >&2
      echo "  (tc qdisc add ... netem: unknown qdisc kind), nor is a kernel image for a router guest" >&2
      echo "  in ${MIMIC_CACHE_DIR:-/var/cache/mimic}/kernels: fetch Debian's (mimic lab fetch-kernel) and run" >&2
      echo "  again (or give --netem-guest IMAGE), or give --no-delay for rate-only classes with the LAN's RTT" >&2
      exit 2
    fi
    guest=1
    echo "independent: this kernel has no netem: the shapers run in a router guest on $guest_img" >&2
    echo "  (QEMU, booted with mimic lab up --kernel; the testbed's own tc commands; --no-delay keeps" >&2
    echo "  rate-only classes on this kernel's htb instead)" >&2
  fi
elif [ "$guest" = 1 ] && [ -z "$guest_img" ]; then
  guest_img=$(cached_kernel)
  [ -n "$guest_img" ] || {
    echo "independent: --netem-guest: no kernel image in ${MIMIC_CACHE_DIR:-/var/cache/mimic}/kernels;" >&2
    echo "  fetch Debian's with mimic lab fetch-kernel, or name one: --netem-guest IMAGE" >&2
    exit 2
  }
fi
[ -n "$addrs" ] || addrs=$([ "$guest" = 1 ] && echo 8 || echo 32)
[ -n "$fast_addrs" ] || fast_addrs=$([ "$guest" = 1 ] && echo 1 || echo "$addrs")
# the shaper of the classes over 12 Mbit/s (--fast-shaper): a serializing netem rate in the
# router guest (htb's sub-packet bucket loses the tokens of the guest's late timers), htb on
# this machine (its timers are on time; the kept rate-only grades were taken with it)
[ -n "$fast_shaper" ] || fast_shaper=$([ "$guest" = 1 ] && echo netem-rate || echo htb)
if [ "$fast_shaper" = netem-rate ] && [ "$guest" = 0 ] && ! has_netem; then
  echo "independent: --fast-shaper netem-rate: this kernel has no netem qdisc; run in a router guest (--netem-guest)" >&2
  exit 2
fi
if [ "$guest" = 1 ]; then
  echo "independent: router guest: the classes over 12 Mbit/s shaped by $fast_shaper, the others by htb (--fast-shaper)" >&2
fi
python3 "$py" plan --out "$out" --www "$mem/www" --connections "$connections" --seed "$seed" \
  --addrs "$addrs" --fast-addrs "$fast_addrs" --fast-shaper "$fast_shaper" ${classes:+--classes "$classes"} $([ "$no_delay" = 1 ] && echo --no-delay)

if [ "$guest" = 1 ]; then
  [ -f "$guest_img" ] || { echo "independent: --netem-guest $guest_img: no such kernel image" >&2; exit 2; }
  command -v qemu-system-x86_64 >/dev/null ||
    { echo "independent: --netem-guest: qemu-system-x86_64 is missing (scripts/deps.sh test installs it)" >&2; exit 2; }
fi

if [ "$guest" = 1 ]; then
  # ---- topology: mimic's lab with its router host a QEMU guest (plumbing only: mimic's own
  # emulator does not run; the guest's bridge forwards and the testbed's tc shapes its NICs).
  # Clients in $tag-cli (the class addresses lie in the lab's local 198.19.0.0/19 pool),
  # the server 198.18.0.1 in $tag-srv.
  C=$tag-cli S=$tag-srv cif=$tag-c sif=$tag-s down_if=$tag-ec up_if=$tag-es
  echo "independent: namespaces $tag-cli $tag-emu $tag-srv (lab $tag: the router a QEMU guest on $guest_img)" >&2
  # --coarse-tick: the guest's hrtimers (the watchdogs of htb and netem) at tick resolution
  up_extra=()
  [ "$coarse" = 1 ] && up_extra=(--kernel-cmdline highres=off)
  if ! run "$m" lab up "$tag" --kernel "$guest_img" "${up_extra[@]}" >"$out/lab-up.log" 2>&1; then
    cat "$out/lab-up.log" >&2
    echo "independent: --netem-guest: mimic lab up $tag --kernel $guest_img ${up_extra[*]} failed (above)" >&2
    exit 2
  fi
  if [ "$coarse" = 1 ]; then
    # hrtimer resolution in the guest: the tick (1/HZ) with highres=off, 1 ns otherwise
    # (awk reads to the end: an early exit could break lab exec's pipe and, under pipefail, end
    # the script without a word)
    res=$("$m" lab exec "$tag" emu -- cat /proc/timer_list | awk '/\.resolution:/ && !r {r = $2} END {print r}')
    if [ -z "$res" ] || [ "$res" -lt 1000000 ]; then
      echo "independent: --coarse-tick: the router guest's timers are high-resolution (hrtimer resolution" >&2
      echo "  ${res:-unknown} ns) although it booted with highres=off; its packets would not leave on a tick" >&2
      exit 2
    fi
    tick_ms=$(awk -v r="$res" 'BEGIN {printf "%g", r / 1e6}')
    echo "independent: --coarse-tick: the router guest's timers run on its ${tick_ms} ms tick (hrtimer resolution $res ns)" >&2
    echo "$tick_ms" >"$out/tick_ms"
  fi
  # the unshaped base-RTT address and the departure probe's lie outside the pool
  for a in 198.19.255.1 198.19.254.1; do
    ip -n "$C" addr add "$a/32" dev "$cif"
    ip -n "$S" route add "$a/32" via 198.18.0.2
  done
  "$m" lab exec "$tag" emu -- grep -q '^sch_netem ' /proc/modules || {
    echo "independent: --netem-guest: the guest's kernel ($guest_img) has no sch_netem module loaded" >&2
    exit 2
  }
  printf 'QEMU guest (%s) on kernel %s: htb%s\n' \
    "$("$m" lab status "$tag" --json | python3 -c 'import json,sys; h=[h for h in json.load(sys.stdin)["hosts"] if h["role"]=="emu"][0]; print(h["guest"]["accel"])')" \
    "$("$m" lab exec "$tag" emu -- uname -r)" "$([ "$needs_netem" = 1 ] && echo ' + netem')" >"$out/router.txt"
  [ "$coarse" = 1 ] && echo "  booted with highres=off: timers on its $tick_ms ms tick; htb burst one tick at the rate + 1514 bytes" >>"$out/router.txt"
else
echo "independent: namespaces $C $R $S" >&2
printf 'namespace of this machine on kernel %s: htb%s\n' "$(uname -r)" \
  "$([ "$needs_netem" = 1 ] && echo ' + netem')" >"$out/router.txt"
# ---- topology: clients (C) — router (R) — server (S); 198.19.0.0/16 clients, 198.18.0.0/24 server
for n in "$C" "$R" "$S"; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip link add "$tag-c0" netns "$C" type veth peer name "$tag-r0" netns "$R"
ip link add "$tag-s0" netns "$S" type veth peer name "$tag-r1" netns "$R"
ip -n "$C" link set "$tag-c0" name c0
ip -n "$R" link set "$tag-r0" name r0
ip -n "$R" link set "$tag-r1" name r1
ip -n "$S" link set "$tag-s0" name s0
ip -n "$R" addr add 198.19.255.254/16 dev r0
ip -n "$R" addr add 198.18.0.254/24 dev r1
ip -n "$S" addr add "198.18.0.1/24" dev s0
ip -n "$C" addr add 198.19.255.1/16 dev c0 # unshaped: the base RTT probe
while read -r k name down up delay loss qdown qup naddr _; do
  for h in $(seq 1 "$naddr"); do ip -n "$C" addr add "198.19.$k.$h/16" dev c0; done
done <"$out/classes.txt"
for pair in "$C c0" "$R r0" "$R r1" "$S s0"; do
  set -- $pair
  ip -n "$1" link set "$2" up
  # real packets at the tap and at the shapers, as mimic's lab does: no segmentation offloads,
  # and (end hosts) checksums computed in software so tcpdump sees them right
  ip netns exec "$1" ethtool -K "$2" tso off gso off gro off >/dev/null 2>&1 || true
  case "$2" in c0|s0) ip netns exec "$1" ethtool -K "$2" tx off >/dev/null 2>&1 || true ;; esac
done
ip -n "$C" route add default via 198.19.255.254
ip -n "$S" route add 198.19.0.0/16 via 198.18.0.254
ip netns exec "$R" sysctl -qw net.ipv4.ip_forward=1
if [ "$needs_netem" = 1 ] && ! has_netem; then
  echo "independent: the classes need delay and loss, and this kernel has no netem qdisc" >&2
  echo "  (tc qdisc add ... netem: unknown qdisc kind); run them in a router guest on Debian's" >&2
  echo "  stock kernel (--netem-guest), or give --no-delay for rate-only classes with the LAN's RTT" >&2
  exit 2
fi
fi
if [ -n "$server_iw" ]; then
  # the server's initial window towards the clients (--server-initcwnd): a route metric, which
  # every TCP socket on the route starts with (nginx's and the query server's alike); set on
  # each of the server's routes via the router, in either topology
  ip -n "$S" -4 route show | grep ' via ' | while read -r r; do
    # shellcheck disable=SC2086 # the route's own words
    ip -n "$S" route change $r initcwnd "$server_iw"
  done
  echo "$server_iw" >"$out/server_initcwnd"
fi

# the shapers' tc commands are collected (tcl) and run in one batch (tc_apply): `tc -batch` in
# the router namespace, or in the guest over its command channel, a chunk per call (one
# argument stays under the kernel's 128 KiB)
batch=$mem/shaper.tc
: >"$batch"
tcl() { printf '%s\n' "$*" >>"$batch"; }
tc_apply() {
  if [ "$guest" = 1 ]; then
    local chunk=$mem/shaper.chunk.
    split -l 700 "$batch" "$chunk"
    for f in "$chunk"*; do
      "$m" lab exec "$tag" emu -- sh -c 'printf "%s\n" "$1" | tc -batch -' sh "$(cat "$f")" ||
        { echo "independent: tc in the router guest failed (commands in $f)" >&2; exit 2; }
      rm -f "$f"
    done
  else
    tc -n "$R" -batch "$batch"
  fi
  : >"$batch"
}
# tc -s output of the router's qdiscs on DEV
tc_show() {
  if [ "$guest" = 1 ]; then "$m" lab exec "$tag" emu -- tc -s qdisc show dev "$1"; else tc -n "$R" -s qdisc show dev "$1"; fi
}

# shape DEV MATCH(src|dst) CLASSNUM RATE_BPS DELAY_MS LOSS QUEUE NADDR [KIND]
# One htb class per client address (each client has its own access link of the class's rate;
# a client address runs one connection at a time), rate counted on IP bytes (stab overhead
# -14 takes the Ethernet header off: the root's stab sets the packet length every qdisc
# below it counts, netem's rate too). KIND says what limits the rate:
# * htb (a token bucket): a burst of 100 bytes so back-to-back packets leave at the link rate.
#   Like every token bucket, htb sends the first packet of a busy period at once (the next one
#   pays its tokens back): that packet leaves at the start of its transmission slot, not at its
#   end as on a store-and-forward link (or mimic's pipes); with a burst of a full packet two
#   would. The leaf is netem (delay, loss, queue limit) when the class has delay or loss, else
#   a pfifo of QUEUE packets. A bucket that banks less than a packet loses the tokens of every
#   late timer: in a TCG guest (timers 60-170 us late) that costs 12% of 25 Mbit/s and 24% of
#   50 Mbit/s (the shaping check's goodput), hence
# * netem-rate (a serializing link, what mimic's pipes are): the htb class only classifies
#   (no limit of its own) and the leaf netem's rate spaces the packets, each departure
#   scheduled from the previous one's, so a late timer sends what is due at once and the
#   average holds (goodput -0.1 to -0.3% at 25 and 50 Mbit/s in the guest); its limit (QUEUE)
#   counts the packets in its delay line too, as with htb's netem leaf.
# --coarse-tick: htb's watchdog fires only on the tick, and a bucket of 100 bytes would send one
# packet per tick; the htb bucket then holds one tick's bytes at the rate plus a full packet, so
# each tick releases every packet that came due (as dummynet does). netem-rate needs no bucket.
shape() {
  local dev=$1 match=$2 k=$3 rate=$4 delay=$5 loss=$6 queue=$7 naddr=$8 kind=${9:-htb} l burst=100
  l=$(awk -v p="$loss" 'BEGIN {printf "%g%%", p * 100}')
  [ "$coarse" = 1 ] && burst=$(awk -v r="$rate" -v t="$tick_ms" 'BEGIN {printf "%d", r * t / 8000 + 1514}')
  for h in $(seq 1 "$naddr"); do
    local id=$((k * 256 + h))
    local cid
    cid=$(printf '%x' "$id")
    if [ "$kind" = netem-rate ]; then
      tcl class add dev "$dev" parent 1: classid "1:$cid" htb rate 10gbit ceil 10gbit quantum 1514
      tcl qdisc add dev "$dev" parent "1:$cid" handle "$cid:" netem delay "${delay}ms" \
        loss "$l" rate "${rate}bit" limit "$queue"
    else
      tcl class add dev "$dev" parent 1: classid "1:$cid" htb rate "${rate}bit" ceil "${rate}bit" \
        burst "$burst" cburst "$burst" quantum 1514
      if [ "$delay" != 0 ] || [ "$loss" != 0 ]; then
        tcl qdisc add dev "$dev" parent "1:$cid" handle "$cid:" netem delay "${delay}ms" \
          loss "$l" limit "$queue"
      else
        tcl qdisc add dev "$dev" parent "1:$cid" handle "$cid:" pfifo limit "$queue"
      fi
    fi
    tcl filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
      match ip "$match" "198.19.$k.$h/32" flowid "1:$cid"
  done
}

for dev in "$down_if" "$up_if"; do
  tcl qdisc add dev "$dev" root handle 1: stab overhead -14 htb default 1
  tcl class add dev "$dev" parent 1: classid 1:1 htb rate 10gbit quantum 60000
done
while read -r k name down up delay loss qdown qup naddr kind; do
  # the class's one-way delay in each direction (down on r0, towards the clients; up on r1),
  # its loss downstream only (what mimic infers and replays); netem's limit counts the
  # packets in its delay line too
  # and its shaper (classes.txt's last column: the plan's, see --fast-shaper)
  shape "$down_if" dst "$k" "$down" "$delay" "$loss" "$qdown" "$naddr" "${kind:-htb}"
  shape "$up_if" src "$k" "$up" "$delay" 0 "$qup" "$naddr" "${kind:-htb}"
done <"$out/classes.txt"
# the departure probe's address: one 3.3 Mbit/s downlink (3.636 ms per full-size packet, not a
# whole number of ms, so a tick grid would show)
probe_rate=3300000
[ "$guest" = 1 ] || ip -n "$C" addr add 198.19.254.1/16 dev c0
shape "$down_if" dst 254 "$probe_rate" 0 0 100 1
tc_apply

# base RTT of the LAN (unshaped address): the truth's RTT is 2 x one-way delay + this
ip netns exec "$C" ping -q -c 20 -i 0.01 -I 198.19.255.1 198.18.0.1 |
  awk -F'[/ =]+' '/^rtt/ {printf "%d\n", $6 * 1000}' >"$out/base_rtt_us"

# ---- servers and the tap
# servers and the tap run at a higher priority than the clients (nice -10), so a loaded
# machine delays them less; what the query server really did is logged, and is the truth
mkdir -p "$mem/nginx" "$out/nginx"
cat >"$out/nginx/nginx.conf" <<EOF
user root;
worker_processes 1;
daemon on;
pid $mem/nginx/nginx.pid;
error_log $out/nginx/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  sendfile on;
  keepalive_timeout 120s;
  keepalive_requests 100000;
  default_type application/octet-stream;
  open_file_cache max=1000;
  server { listen 198.18.0.1:80 backlog=4096; root $mem/www; location / { } }
}
EOF
ip netns exec "$S" nice -n -10 nginx -p "$mem/nginx" -c "$out/nginx/nginx.conf" -e "$out/nginx/error.log"
ip netns exec "$S" nice -n -10 python3 "$py" query-server --log "$mem/server.csv" 2>"$out/query-server.log" &
pids+=($!)
ip netns exec "$S" nice -n -10 tcpdump -i "$sif" -s 256 -B 65536 -n -w "$out/cap.pcap" \
  "tcp and not portrange $CHECK_PORTS" 2>"$out/tcpdump.log" &
tcpdump_pid=$!
pids+=("$tcpdump_pid")
for _ in $(seq 50); do
  if ip netns exec "$C" curl -s -o /dev/null --interface 198.19.255.1 http://198.18.0.1:8080/ &&
    grep -q listening "$out/tcpdump.log"; then break; fi
  sleep 0.1
done

# how the shaper really releases packets (the coarse-tick question): a backlogged 1 MB download
# through the probe's link, captured at the client
ip netns exec "$C" tcpdump -i "$cif" -s 96 -n -w "$out/departures.pcap" 'host 198.19.254.1' 2>"$out/departures-tcpdump.log" &
probe_pid=$!
pids+=("$probe_pid")
for _ in $(seq 50); do grep -q listening "$out/departures-tcpdump.log" && break; sleep 0.1; done
ip netns exec "$C" curl -sS -o /dev/null --interface 198.19.254.1 http://198.18.0.1/probe
sleep 0.5
kill -INT "$probe_pid"; wait "$probe_pid" || true
python3 "$py" departures --pcap "$out/departures.pcap" --rate "$probe_rate" --out "$out/departures.json" \
  --tick-ms "${tick_ms:-1}"

# the shaping itself, per class, before it is trusted: ping RTT against 2 x delay + the base RTT,
# a download's goodput against the rate (from client ports in $CHECK_PORTS, which the capture
# leaves out); printed, and in the report (shaping.json)
ip netns exec "$C" python3 "$py" shaping-check --dir "$out" --www "$mem/www" --ports "$CHECK_PORTS"

echo "independent: $(wc -l <"$out/truth.csv" | awk '{print $1 - 1}') connections," \
  "classes $(awk '{printf "%s%s", s, $2; s=","}' "$out/classes.txt")$([ "$no_delay" = 1 ] && echo ' (rate only)')" >&2
# the host's load around the workload: servers on a busy machine answer later, which the
# query server's log accounts for and nginx's nominal 0 does not
cut -d' ' -f1-3 /proc/loadavg >"$out/loadavg-start"
# the unshaped RTT through the router while the clients run: whether the router keeps up
ip netns exec "$C" ping -n -D -i 0.1 -I 198.19.255.1 198.18.0.1 >"$out/load-ping.txt" 2>&1 &
load_ping=$!
pids+=("$load_ping")
run ip netns exec "$C" python3 "$py" clients --dir "$out" --seed "$seed"
kill -INT "$load_ping" 2>/dev/null || true
wait "$load_ping" || true
cut -d' ' -f1-3 /proc/loadavg >"$out/loadavg-end"
sleep 2
cp "$mem/server.csv" "$out/server.csv"
kill -INT "$tcpdump_pid"
wait "$tcpdump_pid" || true
cat "$out/tcpdump.log" >&2
dropped=$(awk '/dropped by kernel/ {print $1}' "$out/tcpdump.log")
if [ "${dropped:-0}" != 0 ]; then
  echo "independent: tcpdump dropped $dropped packets: the capture is not whole" >&2
fi
# the tc counters, for the record (drops per class show queue overflows)
tc_show "$down_if" >"$out/tc-r0.txt"
tc_show "$up_if" >"$out/tc-r1.txt"
if [ "$guest" = 1 ]; then
  # the replay builds its own lab (on this machine, mimic's emulator) under the same name
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  kill "$(cat "$mem/nginx/nginx.pid")" 2>/dev/null || true
  "$m" lab down "$tag" >/dev/null
fi

grade
