#!/usr/bin/env bash
# shard-run.sh: sharded analysis without a cluster. Runs `mimic analyze --shard K/N` for
# K = 1..N, at most J at a time (xargs -P), as local processes, in Docker containers of a mimic
# image, or over ssh on other hosts; then `mimic merge`s the N shard databases into one
# flows.db (written atomically, as analyze writes; it equals the unsharded run). The Kubernetes
# way is docker/k8s/analyze-shards.yaml; this is the same for a shell.
#
# Usage: docker/shard-run.sh [-n N] [-j J] [--docker IMAGE | --ssh HOST[,HOST...]]
#                            [--keep-shards DIR] -o OUT.db CAPTURE... [-- ANALYZE_ARGS...]
#   -n N              shards (default 4)
#   -j J              shards at once (default: the CPUs here; with --ssh, one per host)
#   --docker IMAGE    each shard in `docker run --rm --network none IMAGE`, each capture
#                     mounted read-only at its own path, the shard databases written to a
#                     mounted directory
#   --ssh HOSTS       shard K on host number (K-1) mod H of the list: `ssh HOST mimic analyze`
#                     (mimic on each host's PATH, the captures at the same paths there); each
#                     shard database is copied back with scp and removed there
#   --mimic PATH      the mimic binary here (default: mimic on PATH; MIMIC_BIN too)
#   --keep-shards DIR keep the shard databases in DIR (default: a temporary directory, removed)
#   ANALYZE_ARGS      more arguments for every shard's `mimic analyze` (e.g. --server-port 8080)
# Exit: 0 merged, 2 on an error (a shard or the merge failed: its output is shown), 130 on
# Ctrl-C. Shard processes and containers of this run are stopped on any exit.
set -euo pipefail

say() { echo "shard-run: $*" >&2; }
die() { say "$*"; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

n=4
jobs=
mode=local
image=
hosts=()
out=
keep=
mimic=${MIMIC_BIN:-mimic}
caps=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=${2:?-n needs a number}; shift 2 ;;
    -j) jobs=${2:?-j needs a number}; shift 2 ;;
    --docker) mode=docker; image=${2:?--docker needs an image}; shift 2 ;;
    --ssh) mode=ssh; IFS=, read -r -a hosts <<<"${2:?--ssh needs hosts}"; shift 2 ;;
    --mimic) mimic=${2:?--mimic needs a path}; shift 2 ;;
    --keep-shards) keep=${2:?--keep-shards needs a directory}; shift 2 ;;
    -o) out=${2:?-o needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) caps+=("$1"); shift ;;
  esac
done
case "$n" in '' | *[!0-9]* | 0) die "-n must be a positive number, not '$n'" ;; esac
[ -n "$out" ] || die "-o OUT.db is required (see --help)"
[ ${#caps[@]} -gt 0 ] || die "no capture given (see --help)"
for c in "${caps[@]}"; do [ -f "$c" ] || die "$c: no such file"; done
if [ -z "$jobs" ]; then
  if [ "$mode" = ssh ]; then jobs=${#hosts[@]}; else jobs=$(nproc); fi
fi
case "$jobs" in '' | *[!0-9]* | 0) die "-j must be a positive number, not '$jobs'" ;; esac
command -v "$mimic" >/dev/null || die "$mimic: not found (the merge runs here; give --mimic PATH)"
[ "$mode" != docker ] || command -v docker >/dev/null || die "docker is missing"
[ "$mode" != ssh ] || [ ${#hosts[@]} -gt 0 ] || die "--ssh needs at least one host"

out=$(realpath -m -- "$out")
mkdir -p "$(dirname "$out")"
if [ -n "$keep" ]; then
  shards=$(realpath -m -- "$keep")
  mkdir -p "$shards"
else
  shards=$(mktemp -d "$(dirname "$out")/.shard-run.XXXXXX")
fi
# absolute capture paths (the same inside a container)
abs=()
for c in "${caps[@]}"; do abs+=("$(realpath -- "$c")"); done

run=shardrun$$
xpid=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$xpid" ] && kill -0 "$xpid" 2>/dev/null; then
    pkill -TERM -P "$xpid" 2>/dev/null
    kill -TERM "$xpid" 2>/dev/null
    wait "$xpid" 2>/dev/null
  fi
  if [ "$mode" = docker ]; then
    for k in $(seq 1 "$n"); do docker rm -f "$run-$k" >/dev/null 2>&1; done
  fi
  [ -n "$keep" ] || rm -rf "$shards"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# one shard: K; its output goes to $shards/shard-K.log
shard() {
  local k=$1 db="shard-$1.db" log="$shards/shard-$1.log"
  case "$mode" in
    local)
      "$mimic" -q analyze "${abs[@]}" --shard "$k/$n" -o "$shards/$db" "${extra[@]}" >"$log" 2>&1 ;;
    docker)
      # each capture read-only at its own path, so meta `inputs` names the files as they are
      local mounts=()
      for c in "${abs[@]}"; do mounts+=(-v "$c:$c:ro"); done
      docker run --rm --name "$run-$k" --network none "${mounts[@]}" -v "$shards:/out" \
        --entrypoint mimic "$image" -q analyze "${abs[@]}" --shard "$k/$n" -o "/out/$db" \
        "${extra[@]}" >"$log" 2>&1 ;;
    ssh)
      local h=${hosts[$(((k - 1) % ${#hosts[@]}))]} tmp="/tmp/$run-$db" q=()
      for a in "${abs[@]}" --shard "$k/$n" -o "$tmp" "${extra[@]}"; do q+=("$(printf '%q' "$a")"); done
      { ssh -o BatchMode=yes "$h" "mimic -q analyze ${q[*]}" \
        && scp -q -o BatchMode=yes "$h:$tmp" "$shards/$db"; } >"$log" 2>&1
      local rc=$?
      ssh -o BatchMode=yes "$h" "rm -f $(printf '%q' "$tmp")" >/dev/null 2>&1
      return $rc ;;
  esac
}
export -f shard
export mode image n mimic shards run
# arrays do not cross `export`: hand them over as NUL-separated files
printf '%s\0' "${abs[@]}" >"$shards/.captures"
printf '%s\0' "${extra[@]+"${extra[@]}"}" >"$shards/.extra"
printf '%s\0' "${hosts[@]+"${hosts[@]}"}" >"$shards/.hosts"

t0=$(date +%s.%N)
say "$n shards of ${#abs[@]} capture(s), $jobs at a time ($mode${image:+ $image}${hosts[*]:+ on ${hosts[*]}})"
# shellcheck disable=SC2016 # (expanded by the shard's bash)
seq 1 "$n" | xargs -P "$jobs" -I{} bash -c '
  mapfile -d "" -t abs <"$shards/.captures"
  mapfile -d "" -t extra <"$shards/.extra"
  mapfile -d "" -t hosts <"$shards/.hosts"
  [ -n "${extra[*]}" ] || extra=()
  if shard "$1"; then echo "shard-run: shard $1/$n done" >&2
  else echo "shard-run: shard $1/$n failed:" >&2; sed "s/^/  /" "$shards/shard-$1.log" >&2; exit 255; fi
' _ {} &
xpid=$!
wait "$xpid" || die "a shard failed (see above); nothing merged"
xpid=
t1=$(date +%s.%N)
dbs=()
for k in $(seq 1 "$n"); do
  [ -s "$shards/shard-$k.db" ] || die "shard $k/$n wrote no database"
  dbs+=("$shards/shard-$k.db")
done
"$mimic" -q merge "${dbs[@]}" -o "$out" || die "mimic merge failed"
t2=$(date +%s.%N)
say "wrote $out: $n shards in $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s, merged in $(awk "BEGIN { printf \"%.1f\", $t2 - $t1 }") s"
