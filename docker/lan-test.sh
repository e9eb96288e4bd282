#!/usr/bin/env bash
# The container LAN end to end: builds the image from a binary built on this host, brings up
# docker/compose.yaml (client, router, server, a control network), replays a 300-connection
# synthetic workload across it with the remote roles -- captured at the server host by `mimic
# serve` and brought back over the control channel, mimic replay's default -- and prints the
# accuracy table of that replay database. Exit 0 when
#   replayed >= 95% of the workload, min RTT within 10% or 1 ms >= 90%, bandwidth within 20%
#   >= 80% of estimates, response delays within 2 ms >= 90% of exchanges, and (unless
#   MIMIC_LAN_LAB=0) the same workload replayed in the namespace lab has a median response
#   time within 5% of the LAN's, with no vantage bias per connection (median of the
#   connections' differences within 0.25 RTT), while a second LAN replay captured on the
#   client (--vantage client) shows the bias: its connections' median difference lies between
#   0.5 and 2 RTTs (about one round trip, as expected); and the sharded analysis run in
#   containers of the same image -- the Kubernetes Indexed Job's pods (docker/k8s, their
#   scripts with JOB_COMPLETION_INDEX set) and docker/shard-run.sh --docker (-j 2) -- merges
#   into the unsharded run's database, table by table and row by row (docker/shard-check.py);
# 1 when one is missed, 2 on an error, 130 when interrupted. Everything of its own (containers,
# networks, the image tag, the engine if it started it) is removed on exit, Ctrl-C included.
#
# Usage (root): docker/lan-test.sh
# Environment:
#   MIMIC_BIN           the mimic binary to put in the image (default: build --profile
#                       test-build --features dpdk, as scripts/test.sh does, and take that)
#   MIMIC_LAN_CONNECTIONS, MIMIC_LAN_SEED   the workload (default 300, 1)
#   MIMIC_LAN_KEEP=DIR  keep the databases, captures and role logs in DIR (default: removed)
#   MIMIC_LAN_LAB=0     skip the namespace-lab replay of the same workload (the client-side
#                       bias is then measured against the LAN's server-side replay)
#   MIMIC_LAN_SHARDS=0  skip the sharded analysis in containers (below)
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
      for r in router server client; do
        say "--- log of $r ---"
        dc logs --no-color --tail 30 "$r" 2>&1 | sed 's/^/  /' >&2
      done
    fi
    dc down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 \
      || say "docker-compose down failed: remove ${run}_* containers and networks by hand"
  fi
  # the sharded analysis's containers (docker run, not compose)
  for c in $(docker ps -aq --filter "name=^${run}_" 2>/dev/null); do docker rm -f "$c" >/dev/null 2>&1; done
  if [ -n "$(docker image ls -q "$tag" 2>/dev/null)" ]; then
    docker image rm -f "$tag" >/dev/null || say "could not remove the image $tag"
  fi
  for r in $roles; do
    if [ -n "$(docker image ls -q "mimic-lan-$r:$run" 2>/dev/null)" ]; then
      docker image rm -f "mimic-lan-$r:$run" >/dev/null || say "could not remove the image mimic-lan-$r:$run"
    fi
  done
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
roles="client router server capture"
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
  for r in $roles; do docker image ls --format '{{.Tag}}' "mimic-lan-$r"; done
  ls docker/bin 2>/dev/null) | grep '^mimiclan[0-9]' | sed 's/_.*//' | sort -u); do
  pid=${p#mimiclan}
  case "$pid" in '' | *[!0-9]*) continue ;; esac
  if [ "$pid" = $$ ] || kill -0 "$pid" 2>/dev/null; then continue; fi
  say "removing what an earlier, killed run left ($p)"
  docker-compose -f "$repo/docker/compose.yaml" -p "$p" down --remove-orphans --timeout 5 >/dev/null 2>&1 || true
  for c in $(docker ps -aq --filter "name=^${p}_"); do docker rm -f "$c" >/dev/null 2>&1 || true; done
  docker image rm -f "mimic-lan:$p" >/dev/null 2>&1 || true
  for r in $roles; do docker image rm -f "mimic-lan-$r:$p" >/dev/null 2>&1 || true; done
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
# one image per role (the Dockerfile's role targets: the same layers, the role as the default
# command): each must build and start its own role
for r in $roles; do
  bgw docker build -q --network host -f docker/Dockerfile --target "$r" \
    --build-arg MIMIC_BINARY=host --build-arg "MIMIC_HOST_BINARY=docker/bin/$run/mimic" \
    -t "mimic-lan-$r:$run" . >/dev/null
  cmd=$(docker image inspect -f '{{json .Config.Cmd}}' "mimic-lan-$r:$run")
  case "$cmd" in "[\"$r\""*) ;; *) die "image mimic-lan-$r:$run starts $cmd, not the $r role" ;; esac
done
say "role images: $(for r in $roles; do printf 'mimic-lan-%s ' "$r"; done)(the runtime's layers, one default command each)"

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
# the replay LAN: client, router, server (the capture node is for originals at a tap, not needed:
# serve captures the replay at the server host)
bgw dc up -d --no-build --quiet-pull server router client >/dev/null 2>&1 \
  || { dc up -d --no-build server router client || true; die "docker-compose up failed"; }
for r in router server client; do
  for _ in $(seq 1 20); do [ "$(docker inspect -f '{{.State.Running}}' "${run}_${r}_1" 2>/dev/null)" = true ] && break; sleep 0.5; done
  [ "$(docker inspect -f '{{.State.Running}}' "${run}_${r}_1")" = true ] || die "the $r container is not running"
done
t_up=$(($(date +%s) - t0))
say "LAN $prefix.0/24 up in ${t_up} s (clients .0/26, servers .64/26, control .128/26); $rt_note"

# ---- the replays: captured at the server (the default), then once more on the client ----
cif=$(dc exec -T client cat /run/mimic-data-if)
pool=()
for i in 1 2 3 4; do pool+=(--client-addr "198.19.0.$i"); done
bgw dc exec -T client mimic -q synth --connections "$conns" --seed "$seed" -o /work/synth.db
remote=(--server "$prefix.74:80" --server-control "tcp:$prefix.138:7001"
  --netemu "tcp:$prefix.130:7002" --pki /work/pki "${pool[@]}" --json)
t0=$(date +%s)
bgw dc exec -T client mimic -q replay /work/synth.db -o /work/replay.db "${remote[@]}" \
  --keep-capture /work/capture-server >"$work/replay.json" || die "mimic replay (server side) failed"
t_replay=$(($(date +%s) - t0))
t0=$(date +%s)
bgw dc exec -T client mimic -q replay /work/synth.db -o /work/client.db "${remote[@]}" \
  --vantage client --capture-iface "$cif" --keep-capture /work/capture-client \
  >"$work/client.json" || die "mimic replay (client side) failed"
t_replay2=$(($(date +%s) - t0))
python3 - "$work" <<'PY' >&2
import json, os, sqlite3, sys
w = sys.argv[1]
for name, side in (("replay", "server"), ("client", "client")):
    r = json.load(open(f"{w}/{name}.json"))
    meta = dict(sqlite3.connect(f"file:{w}/{name}.db?mode=ro", uri=True).execute("SELECT key, value FROM meta"))
    cap = f"{w}/capture-{side}"
    files = [f for f in os.listdir(cap) if f.endswith(".pcapng")]
    size = sum(os.path.getsize(os.path.join(cap, f)) for f in files)
    print(f"lan-test: replay ({name}.db): connections {r['connections']}, ok {r['ok']}, failed {r['failed']}; "
          f"captured at the {meta.get('capture_vantage')} on {meta.get('capture_iface')} "
          f"({(r.get('capture') or {}).get('written')} packets, {len(files)} pcapng files, {size / 1e6:.2f} MB"
          + (f"; brought over the control channel and checked in {r['capture_fetch']['seconds']:.2f} s" if r.get("capture_fetch") else "")
          + ")")
    if meta.get("capture_vantage") != side:
        sys.exit(f"lan-test: {name}.db: meta capture_vantage is {meta.get('capture_vantage')!r}, not {side!r}")
PY

# the router and the server print their counters when stopped; their logs go with the results
bgw dc stop --timeout 15 router server >/dev/null 2>&1
for r in router server; do dc logs --no-color "$r" 2>&1 | sed 's/^[^|]*| //' >"$work/$r.log"; done
{
  grep -iE 'warn|error|not granted' "$work/router.log" "$work/server.log" | sed 's/^/  /' || true
  grep -E '^ *total (up|down)' "$work/router.log" | sed 's/^/  router: /' || true
} >&2

status=0
for side in server client; do
  db=$([ $side = server ] && echo replay.db || echo client.db)
  set +e
  bgw dc exec -T client mimic synth check --json /work/synth.db "/work/$db" >"$work/check-$side.json"
  set -e
  echo
  if [ $side = server ]; then
    echo "=== captured at the server host (mimic serve, the default vantage): judged ==="
  else
    echo "=== captured on the client (--vantage client --capture-iface): for comparison ==="
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
# the same way (at the server), and the client-side capture must show the vantage bias ----
t_lab=0
ref=replay.db
ref_name="container LAN, at the server"
if [ "${MIMIC_LAN_LAB:-1}" != 0 ]; then
  t0=$(date +%s)
  "$MIMIC_BIN" -q replay "$work/synth.db" -o "$work/lab.db" --lab "mlan$$" --json >"$work/lab.json" &
  lab_pid=$!
  wait "$lab_pid" || die "the lab replay of the same workload failed"
  lab_pid=
  t_lab=$(($(date +%s) - t0))
  ref=lab.db
  ref_name="namespace lab (at the server)"
fi
echo
echo "=== response time: each replay against the $ref_name, per connection and median ==="
python3 - "$work" "$ref" "$ref_name" <<'PY' || status=1
import sqlite3, statistics, sys
w, ref, ref_name = sys.argv[1:4]
def times(db):
    """orig_conn_id -> the replayed connection's response time (us)"""
    c = sqlite3.connect(f"file:{w}/{db}?mode=ro", uri=True)
    return dict(c.execute("""SELECT m.orig_conn_id, c.response_time_us FROM replay_map m
        JOIN connections c ON c.id = m.replay_conn_id
        WHERE m.status = 'ok' AND c.response_time_us IS NOT NULL"""))
s = sqlite3.connect(f"file:{w}/synth.db?mode=ro", uri=True)
rtt = dict(s.execute("SELECT id, min_rtt_us FROM connections WHERE min_rtt_us > 0"))
base = times(ref)
if not base:
    sys.exit(f"lan-test: {ref} has no response times")
mb = statistics.median(base.values())
# (name, db, relative median bound, bias bounds in RTTs)
rows = [("container LAN, at the server", "replay.db", 0.05, (-0.25, 0.25)),
        ("container LAN, on the client", "client.db", None, (0.5, 2.0))]
if ref == "replay.db":
    rows = rows[1:]
print(f"{'capture':<32} {'conns':>5} {'median':>9} {'vs ref':>7} {'bias (median of per-connection differences)':>44}  required                  result")
print(f"{ref_name:<32} {len(base):>5} {mb / 1000:>6.1f} ms")
ok = True
for name, db, rel, (lo, hi) in rows:
    t = times(db)
    if not t:
        sys.exit(f"lan-test: {db} has no response times")
    m = statistics.median(t.values())
    d = (m - mb) / mb
    common = [k for k in t if k in base and k in rtt]
    if len(common) < 0.9 * len(base):
        print(f"{name:<32}: only {len(common)} connections pair with the reference")
        ok = False
        continue
    bias_rtt = statistics.median((t[k] - base[k]) / rtt[k] for k in common)
    bias_ms = statistics.median(t[k] - base[k] for k in common) / 1000
    passed = lo <= bias_rtt <= hi and (rel is None or abs(d) <= rel)
    ok &= passed
    req = (f"median within {rel:.0%}, " if rel is not None else "") + f"bias {lo:+.2f}..{hi:+.2f} RTT"
    print(f"{name:<32} {len(t):>5} {m / 1000:>6.1f} ms {d:>+7.1%} {bias_rtt:>+27.2f} RTT ({bias_ms:>+7.2f} ms)  {req:<24}  {'ok' if passed else 'MISS'}")
print(f"(over {len(rtt)} connections, RTTs median {statistics.median(rtt.values()) / 1000:.1f} ms)")
sys.exit(0 if ok else 1)
PY

# ---- sharded analysis in containers of the same image (docker/k8s, docker/shard-run.sh) ----
# the captures: this run's two replay captures, and the public corpus's web captures when it is
# there; mounted read-only at /captures as the Kubernetes Job mounts its volume
t_shards=0
if [ "${MIMIC_LAN_SHARDS:-1}" != 0 ]; then
  t0=$(date +%s)
  echo
  echo "=== sharded analysis in containers: merged shards against the unsharded run ==="
  python3 docker/k8s/check.py || { say "docker/k8s: the manifests are not well-formed"; status=1; }
  sh_dir=$work/shards
  mkdir -p "$sh_dir/captures" "$sh_dir/out"
  # (only captures here: the Job's script takes *.pcap, *.pcapng and their .gz)
  cp "$work"/capture-server/*.pcapng "$sh_dir/captures/"
  for f in "$work"/capture-client/*.pcapng; do cp "$f" "$sh_dir/captures/client-$(basename "$f")"; done
  corpus=${MIMIC_TRACES:-$repo/../shared/traces/public}
  if [ -d "$corpus/web" ]; then
    cp "$corpus"/web/*.pcap "$corpus"/web/*.pcapng "$sh_dir/captures/" 2>/dev/null || true
    note="this run's 2 replay captures and the public corpus's web/"
  else
    note="this run's 2 replay captures only (no public corpus at $corpus; scripts/corpus.sh fetches it)"
  fi
  chmod -R a+rX "$sh_dir/captures"
  n_sh=$(python3 docker/k8s/check.py --shards)
  say "shards: $n_sh, over $(find "$sh_dir/captures" -type f | wc -l) captures ($note)"
  sh_vols=(--network none -v "$sh_dir/captures:/captures:ro" -v "$sh_dir/out:/out")
  sh_run=(--rm "${sh_vols[@]}")
  # the unsharded run, in a container of the image: the captures as the Job's pods see them
  # (its order: name order in the container), and at their paths here as shard-run.sh mounts them
  # shellcheck disable=SC2016 # (expanded in the container)
  bgw docker run "${sh_run[@]}" --name "${run}_full" --entrypoint /bin/sh "$tag" -c \
    'set --; for f in /captures/*; do set -- "$@" "$f"; done; exec mimic -q analyze "$@" -o /out/full.db' \
    >"$work/shards-full.log" 2>&1 || { cat "$work/shards-full.log" >&2; die "the unsharded analysis in a container failed"; }
  sh_caps=("$sh_dir"/captures/*)
  bgw docker run --rm --network none -v "$sh_dir/captures:$sh_dir/captures:ro" -v "$sh_dir/out:/out" \
    --name "${run}_full2" --entrypoint mimic "$tag" -q analyze "${sh_caps[@]}" -o /out/full-here.db \
    >"$work/shards-full2.log" 2>&1 || { cat "$work/shards-full2.log" >&2; die "the unsharded analysis in a container failed"; }
  # the Kubernetes Indexed Job's pods: its script, with JOB_COMPLETION_INDEX 0..N-1, all at once
  k8s_script=$(python3 docker/k8s/check.py --script analyze)
  for i in $(seq 0 $((n_sh - 1))); do
    docker run -d "${sh_vols[@]}" --name "${run}_k8s_$i" -e JOB_COMPLETION_INDEX="$i" \
      -e MIMIC_SHARDS="$n_sh" -e MIMIC_RUN=ci --entrypoint /bin/sh "$tag" -c "$k8s_script" >/dev/null \
      || die "starting the shard pod $i failed"
  done
  for i in $(seq 0 $((n_sh - 1))); do
    rc_i=$(docker wait "${run}_k8s_$i")
    if [ "$rc_i" != 0 ]; then docker logs "${run}_k8s_$i" >&2; die "shard pod $i exited with $rc_i"; fi
    docker rm "${run}_k8s_$i" >/dev/null
  done
  bgw docker run "${sh_run[@]}" --name "${run}_k8s_merge" -e MIMIC_SHARDS="$n_sh" -e MIMIC_RUN=ci \
    --entrypoint /bin/sh "$tag" -c "$(python3 docker/k8s/check.py --script merge)" >"$work/shards-merge.log" 2>&1 \
    || { cat "$work/shards-merge.log" >&2; die "the merge Job's container failed"; }
  echo "-- Kubernetes Indexed Job (docker/k8s/*.yaml's scripts, one container per index) --"
  python3 docker/shard-check.py "$sh_dir/out/full.db" "$sh_dir/out/ci/flows.db" || status=1
  # the same without a cluster: xargs -P over containers
  bgw docker/shard-run.sh --docker "$tag" -n "$n_sh" -j 2 --mimic "$MIMIC_BIN" \
    -o "$sh_dir/xargs.db" "${sh_caps[@]}" || die "docker/shard-run.sh failed"
  echo "-- docker/shard-run.sh --docker (-j 2) --"
  python3 docker/shard-check.py "$sh_dir/out/full-here.db" "$sh_dir/xargs.db" || status=1
  t_shards=$(($(date +%s) - t0))
fi

echo
say "build ${t_build} s, LAN up ${t_up} s, replays ${t_replay} s (server side) + ${t_replay2} s (client side), lab replay ${t_lab} s, shards ${t_shards} s, total $(($(date +%s) - t_start)) s"
if [ "$status" -eq 0 ]; then say "PASS"; else say "FAIL: a criterion was missed"; fi
exit "$status"
