#!/usr/bin/env bash
# mimic-role ROLE [ARGS...]: prepares this container's interfaces for one role of a replay LAN
# and starts it (the image's entrypoint; docker/compose.yaml sets the environment).
#
#   client  [CMD...]  route the server and the client address pool over the data segment, then
#                     run CMD (default: wait; `docker exec` runs `mimic replay` here)
#   router  [ARGS...] bridge the client and server segments through `mimic netemu run ARGS`
#   server  [ARGS...] `mimic serve ARGS` on the server segment, routing the pool back via the client;
#                     a controller's replay is captured here, on the server's data interface
#   capture [ARGS...] `mimic capture --source iface:IF ARGS` on the server segment, a passive tap
#
# Like the namespace lab (netemu/src/lab.rs): the router has no addresses on the data segments
# and bridges them in userspace (its interfaces promiscuous), the end hosts know each other's
# MAC address (no ARP crosses the emulator), the client's pool is local to it, and offloads are
# off on every data interface (tso/gso/gro, and tx checksums on the end hosts), so the emulator
# and the capture see real packets. Interfaces are found by the subnet of their address, not by
# name (Docker numbers them in no promised order). Needs NET_ADMIN and NET_RAW (SYS_NICE for
# real-time timer threads).
#
# Environment (all set by compose.yaml):
#   MIMIC_CLIENT_NET, MIMIC_SERVER_NET, MIMIC_CONTROL_NET   the three segments (CIDR)
#   MIMIC_CLIENT_ADDR, MIMIC_CLIENT_MAC                     the client's data address and MAC
#   MIMIC_SERVER_ADDR, MIMIC_SERVER_MAC, MIMIC_SERVER_PORT  the server's (port default 80)
#   MIMIC_CLIENT_POOL    the client's source addresses (CIDR, local to the client)
#   MIMIC_PKI_DIR        the control channels' certificates from `mimic pki init` (default /work/pki)
#   MIMIC_SERVE_CONTROL_PORT, MIMIC_NETEMU_CONTROL_PORT    default 7001, 7002
#   MIMIC_ROUTER_CPU, MIMIC_SERVER_TIMER_CPUS   optional: netemu run --cpu, serve --timer-cpus
#   MIMIC_ROUTER_SPIN_RULE   optional: netemu run --spin-rule (fixed|load)
set -euo pipefail

say() { echo "mimic-role: $*" >&2; }
die() { say "$*"; exit 2; }
need() { [ -n "${!1:-}" ] || die "$role: $1 is not set"; }

ip2int() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  echo $(((a << 24) | (b << 16) | (c << 8) | d))
}

# the interface whose IPv4 address lies in CIDR
iface_in() {
  local net=${1%/*} len=${1#*/} mask n dev addr
  mask=$(((0xffffffff << (32 - len)) & 0xffffffff))
  n=$(ip2int "$net")
  while read -r _ dev _ addr _; do
    addr=${addr%/*}
    if [ $(($(ip2int "$addr") & mask)) -eq $((n & mask)) ]; then
      echo "$dev"
      return 0
    fi
  done < <(ip -o -4 addr show)
  return 1
}

addr_of() { ip -o -4 addr show dev "$1" | awk '{print $4}' | cut -d/ -f1 | head -1; }

data_if() {
  local dev
  dev=$(iface_in "$1") || die "$role: no interface has an address in $1 (is the container attached to that network?)"
  echo "$dev"
}

offloads_off() { # DEV [tx]
  local f=(tso off gso off gro off)
  [ "${2:-}" = tx ] && f+=(tx off)
  local out
  out=$(ethtool -K "$1" "${f[@]}" 2>&1) || die "$role: cannot switch offloads off on $1 (ethtool -K; needs NET_ADMIN): $out"
}

control_addr() {
  need MIMIC_CONTROL_NET
  addr_of "$(data_if "$MIMIC_CONTROL_NET")"
}

role=${1:-help}
shift || true
pki=${MIMIC_PKI_DIR:-/work/pki}

case "$role" in
  client)
    need MIMIC_CLIENT_NET; need MIMIC_SERVER_ADDR; need MIMIC_SERVER_MAC; need MIMIC_CLIENT_POOL
    dev=$(data_if "$MIMIC_CLIENT_NET")
    [ -z "${MIMIC_CLIENT_MAC:-}" ] || ip link set dev "$dev" address "$MIMIC_CLIENT_MAC"
    offloads_off "$dev" tx
    ip route replace local "$MIMIC_CLIENT_POOL" dev lo
    ip route replace "$MIMIC_SERVER_ADDR/32" dev "$dev"
    ip neigh replace "$MIMIC_SERVER_ADDR" lladdr "$MIMIC_SERVER_MAC" dev "$dev" nud permanent
    say "client: $dev $(addr_of "$dev"), pool $MIMIC_CLIENT_POOL, server $MIMIC_SERVER_ADDR via the router"
    echo "$dev" >/run/mimic-data-if
    if [ $# -eq 0 ]; then
      exec sleep infinity
    fi
    exec "$@"
    ;;
  server)
    need MIMIC_SERVER_NET; need MIMIC_CLIENT_ADDR; need MIMIC_CLIENT_MAC; need MIMIC_CLIENT_POOL
    dev=$(data_if "$MIMIC_SERVER_NET")
    ctl=$(control_addr)
    [ -z "${MIMIC_SERVER_MAC:-}" ] || ip link set dev "$dev" address "$MIMIC_SERVER_MAC"
    offloads_off "$dev" tx
    ip route replace "$MIMIC_CLIENT_ADDR/32" dev "$dev"
    ip neigh replace "$MIMIC_CLIENT_ADDR" lladdr "$MIMIC_CLIENT_MAC" dev "$dev" nud permanent
    ip route replace "$MIMIC_CLIENT_POOL" via "$MIMIC_CLIENT_ADDR" dev "$dev"
    addr=$(addr_of "$dev")
    say "server: $dev $addr, control $ctl:${MIMIC_SERVE_CONTROL_PORT:-7001}, pool $MIMIC_CLIENT_POOL via $MIMIC_CLIENT_ADDR"
    extra=()
    [ -z "${MIMIC_SERVER_TIMER_CPUS:-}" ] || extra=(--timer-cpus "$MIMIC_SERVER_TIMER_CPUS")
    # (the replay's capture at this host: started by the controller over the control channel)
    exec mimic serve --listen "$addr:${MIMIC_SERVER_PORT:-80}" \
      --control "tcp:$ctl:${MIMIC_SERVE_CONTROL_PORT:-7001}" --pki "$pki" \
      --capture-iface "$dev" "${extra[@]}" "$@"
    ;;
  router)
    need MIMIC_CLIENT_NET; need MIMIC_SERVER_NET
    cdev=$(data_if "$MIMIC_CLIENT_NET")
    sdev=$(data_if "$MIMIC_SERVER_NET")
    ctl=$(control_addr)
    for d in "$cdev" "$sdev"; do
      offloads_off "$d"
      ip link set dev "$d" promisc on
      # a bridge, not a host: nothing on the segments may talk to the router itself
      ip addr flush dev "$d"
    done
    say "router: client side $cdev, server side $sdev, control $ctl:${MIMIC_NETEMU_CONTROL_PORT:-7002}"
    extra=()
    [ -z "${MIMIC_ROUTER_CPU:-}" ] || extra=(--cpu "$MIMIC_ROUTER_CPU")
    [ -z "${MIMIC_ROUTER_SPIN_RULE:-}" ] || extra+=(--spin-rule "$MIMIC_ROUTER_SPIN_RULE")
    exec mimic netemu run --client-if "$cdev" --server-if "$sdev" \
      --control "tcp:$ctl:${MIMIC_NETEMU_CONTROL_PORT:-7002}" --pki "$pki" "${extra[@]}" "$@"
    ;;
  capture)
    net=${MIMIC_CAPTURE_NET:-${MIMIC_SERVER_NET:-}}
    [ -n "$net" ] || die "capture: MIMIC_CAPTURE_NET (or MIMIC_SERVER_NET) is not set"
    dev=$(data_if "$net")
    offloads_off "$dev"
    ip link set dev "$dev" promisc on
    # a passive tap: no address, so it never answers on the segment it watches
    ip addr flush dev "$dev"
    say "capture: $dev on $net"
    exec mimic capture --source "iface:$dev" "$@"
    ;;
  help | -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    ;;
  *)
    # anything else runs as a command (e.g. `mimic-role mimic analyze ...`)
    exec "$role" "$@"
    ;;
esac
