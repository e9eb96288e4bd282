#!/usr/bin/env bash
# The container LAN end to end: builds the image from a binary built on this host, brings up
# docker/compose.yaml (client, router, server, capture node on the server's segment, a control
# network), replays a 300-connection synthetic workload across it with the remote roles, analyzes
# the capture node's (server-side) capture and prints the accuracy table. Exit 0 when
#   replayed >= 95% of the workload, min RTT within 10% or 1 ms >= 90%, bandwidth within 20%
#   >= 80% of estimates, response delays within 2 ms >= 90% of exchanges, and (unless
#   MIMIC_LAN_LAB=0) the same workload replayed in the namespace lab has a median response
#   time within 5% of the capture node's, while the client-side capture's is off by more
#   (the vantage bias, shown to be there and to be avoided);
# 1 when one is missed, 2 on an error, 130 when interrupted. Everything of its own (containers,
# networks, the image tag, the engine if it started it) is removed on exit, Ctrl-C included.
#
# Usage (root): docker/lan-test.sh
# Environment:
#   MIMIC_BIN           the mimic binary to put in the image (default: build --profile
#                       test-build --features dpdk, as scripts/test.sh does, and take that)
#   MIMIC_LAN_CONNECTIONS, MIMIC_LAN_SEED   the workload (default 300, 1)
#   MIMIC_LAN_KEEP=DIR  keep the databases, captures and role logs in DIR (default: removed)
#   MIMIC_LAN_LAB=0     skip the namespace-lab replay of the same workload
# One run at a time when it has to start the engine itself.
set -euo pipefail
# paths given relative to where the script was started
[ -z "${MIMIC_BIN:-}" ] || MIMIC_BIN=$(realpath -m -- "$MIMIC_BIN")
[ -z "${MIMIC_LAN_KEEP:-}" ] || MIMIC_LAN_KEEP=$(realpath -m -- "$MIMIC_LAN_KEEP")
cd "$(dirname "$0")/.."
repo=$PWD

say() { echo "lan-test: $*" >&2; }
die() { say "$*"; exit 2; }

[ "$(id -u)" -eq 0 ] || die "needs root (the Docker engine, network namespaces)"
for c in docker dockerd docker-compose debootstrap sqlite3 python3 strip; do
  command -v "$c" >/dev/null || die "$c is missing: scripts/deps.sh test installs it"
done

run=mimiclan$$ # compose project: containers ${run}_ROLE_1, networks ${run}_NET
tag=mimic-lan:$run
conns=${MIMIC_LAN_CONNECTIONS:-300}
seed=${MIMIC_LAN_SEED:-1}
work=$(mktemp -d "${TMPDIR:-/tmp}/mimic-lan.XXXXXX")
chmod 0755 "$work"
started_dockerd=
compose_up=
lab_pid=
t_start=$(date +%s)

# the Docker client: Debian's (docker.io) has BuildKit built in, which the Dockerfile's host-binary
# path needs (it skips the Rust stage); a newer client first on PATH needs the buildx plugin
docker=docker
if [ -x /usr/bin/docker ] && ! docker buildx version >/dev/null 2>&1; then docker=/usr/bin/docker; fi
docker() { command "$docker" "$@"; }
export DOCKER_BUILDKIT=1

dc() { docker-compose -f "$repo/docker/compose.yaml" -p "$run" "$@"; }
# Long steps run in the background and are waited for: bash runs a trap at once during `wait`,
# but after a foreground child that handled Ctrl-C itself (docker-compose does) it runs none
bgw() { "$@" & wait $!; }

# shellcheck disable=SC2317 # (called by the EXIT trap)
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$lab_pid" ] && kill -0 "$lab_pid" 2>/dev/null; then
    # the lab replay tears its lab down when stopped
    kill -TERM "$lab_pid" 2>/dev/null
    wait "$lab_pid" 2>/dev/null
  fi
  if [ -n "$compose_up" ]; then
    if [ "$rc" -eq 2 ]; then
      for r in router server capture client; do
        say "--- log of $r ---"
        dc logs --no-color --tail 30 "$r" 2>&1 | sed 's/^/  /' >&2
      done
    fi
    dc down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 \
      || say "docker-compose down failed: remove ${run}_* containers and networks by hand"
  fi
  if [ -n "$(docker image ls -q "$tag" 2>/dev/null)" ]; then
    docker image rm -f "$tag" >/dev/null || say "could not remove the image $tag"
  fi
  rm -rf "$repo/docker/bin/$run"
  rmdir "$repo/docker/bin" 2>/dev/null
  if [ -n "${MIMIC_LAN_KEEP:-}" ]; then
    mkdir -p "$MIMIC_LAN_KEEP" && cp -r "$work"/. "$MIMIC_LAN_KEEP"/ && say "results kept in $MIMIC_LAN_KEEP"
  fi
  rm -rf "$work"
  if [ -n "$started_dockerd" ]; then
    kill "$started_dockerd" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$started_dockerd" 2>/dev/null && { say "dockerd did not stop: killing it"; kill -9 "$started_dockerd"; }
    rm -f "$owner"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# ---- the engine: use the running one, or start Debian's dockerd and stop it at the end ----
# (one started by an earlier run that was killed outright is adopted and stopped at the end;
# one another run of this script started and still uses is used as it is)
owner=/run/mimic-lan-dockerd.owner
if docker info >/dev/null 2>&1; then
  if [ -f "$owner" ] && read -r opid dpid <"$owner" && ! kill -0 "$opid" 2>/dev/null \
    && [ "$(ps -o comm= -p "$dpid" 2>/dev/null)" = dockerd ]; then
    say "stopping at the end the dockerd (pid $dpid) an earlier, killed run started"
    started_dockerd=$dpid
    echo "$$ $dpid" >"$owner"
  fi
else
  [ ! -S /var/run/docker.sock ] || [ -z "$(pgrep -x dockerd || true)" ] \
    || die "dockerd runs but does not answer on /var/run/docker.sock"
  say "starting dockerd (log: $work/dockerd.log)"
  # no default bridge and no iptables/forwarding changes on this host: the LAN's networks are
  # internal (no NAT), and image builds use the host's network (--network host)
  # (a session of its own: Ctrl-C in this terminal must not stop it before the cleanup)
  # (a real-time budget for the containers to share: see the LAN's placement below)
  setsid dockerd --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
    --cpu-rt-runtime=900000 \
    --pidfile "$work/dockerd.pid" >"$work/dockerd.log" 2>&1 &
  started_dockerd=$!
  echo "$$ $started_dockerd" >"$owner"
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -5 "$work/dockerd.log" >&2; die "dockerd did not come up in 30 s"; }
fi

# the LANs of earlier runs that were killed before their cleanup (kill -9, a crash)
for p in $( (docker ps -a --format '{{.Names}}' --filter name=mimiclan
  docker network ls --format '{{.Name}}' --filter name=mimiclan
  docker image ls --format '{{.Tag}}' mimic-lan
  ls docker/bin 2>/dev/null) | grep '^mimiclan[0-9]' | sed 's/_.*//' | sort -u); do
  pid=${p#mimiclan}
  case "$pid" in '' | *[!0-9]*) continue ;; esac
  if [ "$pid" = $$ ] || kill -0 "$pid" 2>/dev/null; then continue; fi
  say "removing what an earlier, killed run left ($p)"
  docker-compose -f "$repo/docker/compose.yaml" -p "$p" down --remove-orphans --timeout 5 >/dev/null 2>&1 || true
  docker image rm -f "mimic-lan:$p" >/dev/null 2>&1 || true
  rm -rf "docker/bin/$p"
done

# ---- the image: base, then the runtime with this host's binary ----
t0=$(date +%s)
bgw docker/base.sh
if [ -z "${MIMIC_BIN:-}" ]; then
  . scripts/cargo-env.sh
  bgw cargo build -q --profile test-build -p mimic --features dpdk
  MIMIC_BIN=${CARGO_TARGET_DIR:-target}/test-build/mimic
fi
[ -x "$MIMIC_BIN" ] || die "$MIMIC_BIN: not an executable mimic binary"
mkdir -p "docker/bin/$run"
# debug info is not needed in the image
strip -o "docker/bin/$run/mimic" "$MIMIC_BIN"
say "building $tag from $MIMIC_BIN"
bgw docker build -q --network host -f docker/Dockerfile \
  --build-arg MIMIC_BINARY=host --build-arg "MIMIC_HOST_BINARY=docker/bin/$run/mimic" \
  -t "$tag" . >/dev/null
t_build=$(($(date +%s) - t0))
say "image $tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'), built in ${t_build} s"

# ---- the LAN: a /24 of 198.18.0.0/15 that no route and no Docker network uses yet ----
# shellcheck disable=SC2046 # one argument per network
used=$( (ip -4 route show; docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' $(docker network ls -q) 2>/dev/null) | tr ' ' '\n')
prefix=
for i in $(seq 0 199); do
  k=$(((($$ + i) % 200) + 40))
  if ! grep -q "^198\.18\.$k\." <<<"$used"; then prefix=198.18.$k; break; fi
done
[ -n "$prefix" ] || die "no free /24 in 198.18.40.0-198.18.239.0 for the LAN"
export MIMIC_IMAGE=$tag MIMIC_WORK=$work MIMIC_NET_PREFIX=$prefix
# placement as in the lab: real-time scheduling where the engine grants a budget (cgroup v1
# cpu.rt_runtime_us of Docker's parent group; dockerd --cpu-rt-runtime)
# (Docker writes the budget to its group when the first container asks for one)
rt_budget=$(cat /sys/fs/cgroup/cpu/docker/cpu.rt_runtime_us 2>/dev/null || echo 0)
if [ -n "$started_dockerd" ] || [ "$rt_budget" -ge 900000 ]; then
  export MIMIC_RT_ROUTER=500000us MIMIC_RT_SERVER=200000us MIMIC_RT_CLIENT=200000us
  rt_note="real-time budgets 500/200/200 ms per s (router/server/client)"
elif [ -e /sys/fs/cgroup/cpu/docker/cpu.rt_runtime_us ]; then
  rt_note="no real-time budget for containers (dockerd without --cpu-rt-runtime): timing may suffer on a loaded host"
else
  rt_note="real-time scheduling as the host allows"
fi
# (MIMIC_ROUTER_CPU and MIMIC_SERVER_TIMER_CPUS, if set, pin them as the lab does)
# the control channels' certificates (TLS 1.3, mutual): one PKI in the shared work folder, so
# every container finds its own pair there (a real deployment hands each host only its own)
"$MIMIC_BIN" -q pki init "$work/pki" >/dev/null || die "mimic pki init failed"

t0=$(date +%s)
compose_up=1
bgw dc up -d --no-build --quiet-pull >/dev/null 2>&1 || { dc up -d --no-build || true; die "docker-compose up failed"; }
# a tap sees both directions of every conversation on the server's segment: the segment's
# bridge floods every frame to every port (a hub) instead of learning where the server is
servers_id=$(docker network inspect -f '{{.Id}}' "${run}_servers")
servers_br=br-${servers_id:0:12}
ip link set dev "$servers_br" type bridge ageing_time 0 || die "cannot make $servers_br a hub"
for _ in $(seq 1 60); do [ -e "$work/capture/capture.ready" ] && break; sleep 0.5; done
[ -e "$work/capture/capture.ready" ] || die "the capture node did not become ready in 30 s"
for r in router server client; do
  [ "$(docker inspect -f '{{.State.Running}}' "${run}_${r}_1")" = true ] || die "the $r container is not running"
done
t_up=$(($(date +%s) - t0))
say "LAN $prefix.0/24 up in ${t_up} s (clients .0/26, servers .64/26 as a hub, control .128/26); $rt_note"

# ---- the replay ----
cif=$(dc exec -T client cat /run/mimic-data-if)
pool=()
for i in 1 2 3 4; do pool+=(--client-addr "198.19.0.$i"); done
bgw dc exec -T client mimic -q synth --connections "$conns" --seed "$seed" -o /work/synth.db
t0=$(date +%s)
bgw dc exec -T client mimic -q replay /work/synth.db -o /work/replay.db \
  --server "$prefix.74:80" --server-control "tcp:$prefix.138:7001" \
  --netemu "tcp:$prefix.130:7002" --pki /work/pki \
  --capture-iface "$cif" "${pool[@]}" --json >"$work/replay.json" \
  || die "mimic replay failed"
t_replay=$(($(date +%s) - t0))
python3 - "$work/replay.json" <<'PY' >&2
import json, sys
r = json.load(open(sys.argv[1]))
print("lan-test: replay: " + ", ".join(f"{k} {r[k]}" for k in ("connections", "ok", "failed") if k in r))
PY

# the capture node closes its files on SIGINT (compose's stop_signal) and writes its summary
bgw dc stop --timeout 30 capture >/dev/null 2>&1
[ -s "$work/capture/capture-summary.json" ] || die "the capture node left no capture-summary.json"
bgw dc exec -T client sh -c 'mimic -q analyze /work/capture/*.pcapng -o /work/server-side.db --server-port 80' \
  || die "analyzing the server-side capture failed"

# the router and the server print their counters when stopped; their logs go with the results
bgw dc stop --timeout 15 router server >/dev/null 2>&1
for r in router server capture; do dc logs --no-color "$r" 2>&1 | sed 's/^[^|]*| //' >"$work/$r.log"; done
{
  grep -iE 'warn|error|not granted' "$work/router.log" "$work/server.log" | sed 's/^/  /' || true
  grep -E '^ *total (up|down)' "$work/router.log" | sed 's/^/  router: /' || true
} >&2

# pair the server-side capture's connections with the workload by the 4-tuple the replay used
cp "$work/server-side.db" "$work/server-replay.db"
sqlite3 "$work/server-replay.db" <<SQL || die "pairing the server-side capture with the replay failed"
ATTACH '$work/replay.db' AS r;
BEGIN;
INSERT INTO replay_map (orig_conn_id, replay_conn_id, status, failure, client_ip, client_port, server_ip, server_port)
  SELECT m.orig_conn_id, c.id,
         CASE WHEN m.status = 'ok' AND c.id IS NULL THEN 'missing' ELSE m.status END,
         m.failure, m.client_ip, m.client_port, m.server_ip, m.server_port
    FROM r.replay_map m
    LEFT JOIN main.connections c
      ON m.status = 'ok' AND c.client_ip = m.client_ip AND c.client_port = m.client_port
     AND c.server_ip = m.server_ip AND c.server_port = m.server_port;
INSERT INTO replay_pipes SELECT * FROM r.replay_pipes;
COMMIT;
SQL

status=0
for side in server client; do
  db=$([ $side = server ] && echo server-replay.db || echo replay.db)
  set +e
  bgw dc exec -T client mimic synth check --json /work/synth.db "/work/$db" >"$work/check-$side.json"
  set -e
  echo
  if [ $side = server ]; then
    echo "=== server-side capture (the capture node on the server's segment): judged ==="
  else
    echo "=== client-side capture (mimic replay --capture-iface on the client): for comparison ==="
  fi
  python3 - "$work/check-$side.json" "$side" <<'PY' || { [ $side = server ] && status=1; }
import json, sys
r = json.load(open(sys.argv[1]))
judged = sys.argv[2] == "server"
checks = {c["parameter"]: c for c in r["checks"]}
total = r["paired"] + r["failed"]
rows = [("replayed", "connections replayed and seen", r["paired"], total, 0.95, "", None)]
for name, crit, need in (("min RTT", "within 10% or 1 ms", 0.90),
                         ("bandwidth", "within 20% (of estimates)", 0.80),
                         ("response delay", "within 2 ms (per exchange)", 0.90),
                         ("query delay", "within 2 ms (per exchange)", None),
                         ("delayed ACK", "policy as emulated", None),
                         ("receive window", "within 10%", None)):
    c = checks.get(name)
    if c:
        rows.append((name, crit, c["ok"], c["n"], need, c["unit"], c))
ok = True
print(f"{'parameter':<16} {'criterion':<30} {'ok/n':>11} {'share':>7} {'required':>8} {'median|err|':>12} {'p99|err|':>10}  result")
for name, crit, k, n, need, unit, c in rows:
    share = k / n if n else 0.0
    passed = n > 0 and (need is None or share >= need)
    if need is not None and not passed:
        ok = False
    med = f"{c['median_abs_error']:.3f} {unit}" if c else ""
    p99 = f"{c['p99_abs_error']:.3f} {unit}" if c else ""
    res = "-" if need is None else ("ok" if passed else "MISS")
    req = "report" if need is None else f"{need:.0%}"
    print(f"{name:<16} {crit:<30} {k:>5}/{n:<5} {share:>6.1%} {req:>8} {med:>12} {p99:>10}  {res}")
print(f"bandwidth estimates for {r['bw_coverage']:.1%} of the paired connections")
sys.exit(0 if ok or not judged else 1)
PY
done

# ---- the same workload in the namespace lab: the LAN must agree with it where it is measured
# the same way (server side), and the client-side capture must show the vantage bias ----
t_lab=0
if [ "${MIMIC_LAN_LAB:-1}" != 0 ]; then
  t0=$(date +%s)
  "$MIMIC_BIN" -q replay "$work/synth.db" -o "$work/lab.db" --lab "mlan$$" --json >"$work/lab.json" &
  lab_pid=$!
  wait "$lab_pid" || die "the lab replay of the same workload failed"
  lab_pid=
  t_lab=$(($(date +%s) - t0))
  echo
  echo "=== median response time: the same workload in the namespace lab (server-side capture) ==="
  python3 - "$work" <<'PY' || status=1
import sqlite3, sys
w = sys.argv[1]
def median(db):
    c = sqlite3.connect(f"file:{w}/{db}?mode=ro", uri=True)
    v = sorted(r[0] for r in c.execute("SELECT response_time_us FROM connections WHERE response_time_us IS NOT NULL"))
    if not v:
        sys.exit(f"lan-test: {db} has no response times")
    n = len(v)
    return (v[(n - 1) // 2] + v[n // 2]) / 2, n
lab, nl = median("lab.db")
ok = True
print(f"{'capture':<40} {'connections':>11} {'median':>11} {'vs lab':>8}  required       result")
print(f"{'namespace lab (server side)':<40} {nl:>11} {lab / 1000:>8.1f} ms {'':>8}")
for name, db, agree in (("container LAN, capture node (server side)", "server-replay.db", True),
                        ("container LAN, client side", "replay.db", False)):
    m, n = median(db)
    d = (m - lab) / lab
    passed = abs(d) <= 0.05 if agree else abs(d) > 0.05
    ok &= passed
    req = "within 5%" if agree else "off by > 5%"
    print(f"{name:<40} {n:>11} {m / 1000:>8.1f} ms {d:>+7.1%}  {req:<13}  {'ok' if passed else 'MISS'}")
sys.exit(0 if ok else 1)
PY
fi
echo
say "build ${t_build} s, LAN up ${t_up} s, replay ${t_replay} s, lab replay ${t_lab} s, total $(($(date +%s) - t_start)) s"
if [ "$status" -eq 0 ]; then say "PASS"; else say "FAIL: a criterion was missed"; fi
exit "$status"
