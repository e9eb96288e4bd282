#!/usr/bin/env bash
# shard-run.sh: sharded analysis without a cluster. Runs `mimic analyze --shard K/N` for
# K = 1..N, at most J at a time, as local processes, in Docker containers of a mimic image, or
# over ssh on other hosts; then puts the N shards together here: `mimic merge` into one
# flows.db (SQLite; it equals the unsharded run), or the N shards' Parquet files into one
# Hive-partitioned dataset directory (--format parquet). The output appears only when every
# shard succeeded (renamed into place); a failed shard fails the run and names its host. The
# Kubernetes way is docker/k8s/analyze-shards.yaml; this is the same for a shell.
#
# Usage: docker/shard-run.sh [-n N] [-j J] [--format sqlite|parquet]
#                            [--docker IMAGE | --ssh HOST[,HOST...] [--copy] [--remote-mimic P]]
#                            [--keep-shards DIR] -o OUT CAPTURE... [-- ANALYZE_ARGS...]
#   -n N              shards (default 4)
#   -j J              shards at once (default: the CPUs here; with --ssh, one per host given)
#   -o OUT            the merged database, or with --format parquet the dataset directory
#                     (absent or empty: a run never mixes into another run's files)
#   --format F        sqlite (default: the shard databases merged by `mimic merge`) or parquet
#                     (OUT/table=NAME/shard=K/part-0.parquet, as `mimic analyze --format
#                     parquet` writes them; DuckDB and Spark read OUT as one table per name)
#   --docker IMAGE    each shard in `docker run --rm --network none IMAGE`, each capture
#                     mounted read-only at its own path, the shards written to a mounted folder
#   --ssh HOSTS       shard K on host number (K-1) mod H of the list ([user@]host, as ssh takes
#                     it; a host may appear twice to run two shards there at once). Each host
#                     gets a private temporary folder (mktemp -d); shard K runs `mimic analyze`
#                     there, prints the SHA-256 of its output, which comes back by scp under a
#                     temporary name, is checked against it, renamed into place and removed there
#   --copy            (--ssh) copy the captures to each host first (scp into its folder, checked
#                     by SHA-256); without it the captures must be readable on every host at the
#                     same absolute paths as here (a shared file system: NFS, CephFS, ...).
#                     With --copy each shard reads the captures by file name (so their base
#                     names must differ) and meta `inputs` names them so
#   --remote-mimic P  (--ssh) the mimic on the hosts (default: mimic on their PATH;
#                     MIMIC_REMOTE_BIN too)
#   --mimic PATH      the mimic binary here, for the merge (default: mimic on PATH; MIMIC_BIN)
#   --keep-shards DIR (sqlite) keep the shard databases in DIR (default: a temporary folder
#                     beside OUT, removed)
#   ANALYZE_ARGS      more arguments for every shard's `mimic analyze` (e.g. --server-port 8080)
# Environment: MIMIC_SSH, the ssh command with its options, read by the shell as git reads
# GIT_SSH_COMMAND (default "ssh"), e.g. MIMIC_SSH="ssh -p 2222 -i ~/.ssh/shards -o
# StrictHostKeyChecking=yes"; scp runs through it too (scp -S), so port, identity and -o
# options hold for the copies. BatchMode=yes is added (no password prompt can wait unseen).
# Exit: 0 done, 2 on an error (bad arguments, a host that cannot run mimic, a failed shard,
# a checksum that does not match, the merge: the output shown, nothing written), 130 on
# Ctrl-C. Shard processes, containers and remote shards of this run are stopped, and remote
# folders removed, on any exit.
set -euo pipefail

say() { echo "shard-run: $*" >&2; }
die() { say "$*"; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
# one word for a POSIX shell on the remote side (single quotes; a ' as '\'')
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

n=4
jobs=
mode=local
format=sqlite
image=
hosts=()
copy=
out=
keep=
mimic=${MIMIC_BIN:-mimic}
rmimic=${MIMIC_REMOTE_BIN:-mimic}
caps=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=${2:?-n needs a number}; shift 2 ;;
    -j) jobs=${2:?-j needs a number}; shift 2 ;;
    --format) format=${2:?--format needs sqlite or parquet}; shift 2 ;;
    --docker) mode=docker; image=${2:?--docker needs an image}; shift 2 ;;
    --ssh) mode=ssh; IFS=, read -r -a hosts <<<"${2:?--ssh needs hosts}"
      # "a,b," has an empty last name that read drops
      case "$2" in *, | ,* | *,,*) die "--ssh '$2': an empty host name in the list" ;; esac
      shift 2 ;;
    --copy) copy=1; shift ;;
    --remote-mimic) rmimic=${2:?--remote-mimic needs a path}; shift 2 ;;
    --mimic) mimic=${2:?--mimic needs a path}; shift 2 ;;
    --keep-shards) keep=${2:?--keep-shards needs a directory}; shift 2 ;;
    -o) out=${2:?-o needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) caps+=("$1"); shift ;;
  esac
done
case "$n" in '' | *[!0-9]* | 0*) die "-n must be a positive number, not '$n'" ;; esac
case "$format" in sqlite | parquet) ;; *) die "--format must be sqlite or parquet, not '$format'" ;; esac
[ -n "$out" ] || die "-o OUT is required (see --help)"
[ ${#caps[@]} -gt 0 ] || die "no capture given (see --help)"
for c in "${caps[@]}"; do
  [ "$c" != - ] || die "standard input cannot be sharded (every shard reads the whole capture): give files"
  [ -f "$c" ] || die "$c: no such file"
  [ -r "$c" ] || die "$c: not readable"
done
for a in "${extra[@]+"${extra[@]}"}"; do
  case "$a" in
    -o | --output | --output=* | --shard | --shard=* | --format | --format=*)
      die "ANALYZE_ARGS: $a is shard-run.sh's to set (-o, --format; the shard is chosen per run)" ;;
  esac
done
if [ "$mode" = ssh ]; then
  [ ${#hosts[@]} -gt 0 ] || die "--ssh needs at least one host"
  for h in "${hosts[@]}"; do
    case "$h" in
      '' | -* | *[[:space:]]* | *[\'\"\\\$\`]*) die "--ssh: '$h' is not a host name ([user@]host)" ;;
    esac
  done
else
  [ -z "$copy" ] || die "--copy copies the captures to the --ssh hosts: it needs --ssh"
fi
if [ -z "$jobs" ]; then
  if [ "$mode" = ssh ]; then jobs=${#hosts[@]}; else jobs=$(nproc); fi
fi
case "$jobs" in '' | *[!0-9]* | 0*) die "-j must be a positive number, not '$jobs'" ;; esac
[ "$format" = sqlite ] || [ -z "$keep" ] \
  || die "--keep-shards is for SQLite shards: a Parquet dataset keeps every shard's files itself"
command -v "$mimic" >/dev/null || die "$mimic: not found (the merge runs here; give --mimic PATH)"
[ "$mode" != docker ] || command -v docker >/dev/null || die "docker is missing"
if [ "$mode" = ssh ]; then
  for c in sha256sum scp; do command -v "$c" >/dev/null || die "$c is missing (--ssh needs it here)"; done
fi

if [ -n "$copy" ]; then
  declare -A named=()
  for c in "${caps[@]}"; do
    b=$(basename -- "$c")
    [ -z "${named[$b]:-}" ] || die "--copy: two captures are named $b (each host gets them by file name)"
    named[$b]=1
  done
fi

out=$(realpath -m -- "$out")
mkdir -p "$(dirname "$out")"
if [ "$format" = parquet ] && [ -e "$out" ]; then
  [ -d "$out" ] || die "$out exists and is not a directory (Parquet output is a directory)"
  [ -z "$(ls -A "$out")" ] \
    || die "$out is not empty: the shards would mix with another run's files (name a new directory, or remove it first)"
fi
stage=
run=shardrun$$
declare -A running=() # pid of a shard's job (its own process group) -> K
# distinct hosts, their remote folders (filled in once each host answered)
uhosts=()
declare -A rdir=()
if [ "$mode" = ssh ]; then
  # (only those that get a shard)
  mapfile -t uhosts < <(for k in $(seq 1 "$n"); do echo "${hosts[$(((k - 1) % ${#hosts[@]}))]}"; done | awk '!seen[$0]++')
fi

stop_jobs() {
  local p
  set +m # (no "Terminated" notice for each)
  for p in "${!running[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  for p in "${!running[@]}"; do wait "$p" 2>/dev/null || true; done
  running=()
}
# the remote shards still running (their pids in the host's folder: TERM makes analyze remove
# its unfinished output), then the folders
# shellcheck disable=SC2317 # (called by cleanup)
remote_cleanup() {
  local h ps=() hs=() i=0
  for h in "${uhosts[@]+"${uhosts[@]}"}"; do
    # (a stop while the hosts were still being prepared: the folders they made so far)
    [ -n "${rdir[$h]:-}" ] || [ ! -s "$stage/host-$i.dir" ] || rdir[$h]=$(cat "$stage/host-$i.dir")
    i=$((i + 1))
    [ -n "${rdir[$h]:-}" ] || continue
    # shellcheck disable=SC2016 # (expanded there)
    "$stage/ssh" "$h" "d=$(q "${rdir[$h]}")"'
case "$d" in /*/mimic-shard-run.*) ;; *) exit 1 ;; esac
cd "$d" 2>/dev/null || exit 0
for f in *.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; done
i=0
while [ $i -lt 50 ]; do
  alive=
  for f in *.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
  [ -n "$alive" ] || break
  sleep 0.1; i=$((i + 1))
done
cd / && rm -rf "$d"' </dev/null >/dev/null 2>&1 &
    ps+=("$!")
    hs+=("$h")
  done
  for i in "${!ps[@]}"; do
    wait "${ps[$i]}" || say "could not remove ${rdir[${hs[$i]}]} on ${hs[$i]}: remove it by hand"
  done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  stop_jobs
  if [ "$mode" = docker ]; then
    for k in $(seq 1 "$n"); do docker rm -f "$run-$k" >/dev/null 2>&1; done
  fi
  [ "$mode" != ssh ] || remote_cleanup
  [ -z "$stage" ] || rm -rf "$stage"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# everything of this run here: beside the output (so the last rename stays on one file system)
stage=$(mktemp -d "$(dirname "$out")/.shard-run.XXXXXX")
if [ -n "$keep" ]; then
  shards=$(realpath -m -- "$keep")
  mkdir -p "$shards"
else
  shards=$stage
fi
# absolute capture paths (the same inside a container, and on hosts that share them)
abs=()
for c in "${caps[@]}"; do abs+=("$(realpath -- "$c")"); done

# ssh as the user asked for it (MIMIC_SSH: words for the shell, like GIT_SSH_COMMAND), never
# prompting; scp -S runs the same
if [ "$mode" = ssh ]; then
  # (ssh takes the first value of an option: the user's come first and win)
  printf '#!/bin/sh\nexec %s -o BatchMode=yes -o ConnectTimeout=20 -o ServerAliveInterval=15 -o ServerAliveCountMax=4 "$@"\n' \
    "${MIMIC_SSH:-ssh}" >"$stage/ssh"
  chmod 0700 "$stage/ssh"
  "$stage/ssh" -V >/dev/null 2>&1 || die "MIMIC_SSH='${MIMIC_SSH:-ssh}' does not run ($("$stage/ssh" -V 2>&1 | tail -1))"
fi
# scp HOST:PATH needs brackets around an IPv6 address
scp_host() {
  local h=$1 user=
  case "$h" in *@*) user=${h%@*}@ h=${h##*@} ;; esac
  case "$h" in *:*) h="[$h]" ;; esac
  printf '%s%s' "$user" "$h"
}
sum_of() { sha256sum <"$1" | cut -d' ' -f1; }

# ---- ssh: each host answers, runs the same mimic, gets its folder (and the captures) ----
if [ "$mode" = ssh ]; then
  here=$("$mimic" --version 2>/dev/null || true)
  if [ -n "$copy" ]; then
    for c in "${abs[@]}"; do printf '%s  %s\n' "$(sum_of "$c")" "$(basename -- "$c")"; done >"$stage/captures.sha256"
  fi
  prep() {
    local h=$1 i=$2 o
    # the version and the folder on lines of their own, marked: whatever the host's login
    # shell prints on its way in (a ~/.bashrc that sshd's bash reads) is not taken for them
    o=$("$stage/ssh" "$h" "v=\$($(q "$rmimic") --version) && d=\$(mktemp -d \"\${TMPDIR:-/tmp}/mimic-shard-run.XXXXXX\") && printf '\\n@shard-run-version %s\\n@shard-run-dir %s\\n' \"\$v\" \"\$d\"" </dev/null 2>&1) \
      || { echo "cannot run $rmimic there: $o"; return 1; }
    # the folder first, so that it is removed even when what follows fails
    local d v
    d=$(sed -n 's/^@shard-run-dir //p' <<<"$o" | tail -n 1)
    v=$(sed -n 's/^@shard-run-version //p' <<<"$o" | tail -n 1)
    case "$d" in /*/mimic-shard-run.*) ;; *) echo "mktemp -d there gave '$d': $o"; return 1 ;; esac
    printf '%s\n' "$d" >"$stage/host-$i.dir"
    printf '%s\n' "$v" >"$stage/host-$i.version"
    if [ -n "$copy" ]; then
      "$stage/ssh" "$h" "mkdir $(q "$d/in")" </dev/null || { echo "mkdir $d/in failed"; return 1; }
      scp -q -B -S "$stage/ssh" -- "${abs[@]}" "$(scp_host "$h"):$d/in/" </dev/null \
        || { echo "copying the captures (scp) failed"; return 1; }
      "$stage/ssh" "$h" "cd $(q "$d/in") && sha256sum -c --quiet --strict" <"$stage/captures.sha256" \
        || { echo "the captures copied there do not match their SHA-256 here"; return 1; }
    fi
  }
  declare -A ppid=()
  i=0
  for h in "${uhosts[@]}"; do
    prep "$h" "$i" >"$stage/host-$i.log" 2>&1 &
    ppid[$!]=$i
    i=$((i + 1))
  done
  bad=
  for p in "${!ppid[@]}"; do
    i=${ppid[$p]}
    rc=0
    wait "$p" || rc=$?
    [ "$rc" -eq 0 ] || { say "host ${uhosts[$i]}: $(cat "$stage/host-$i.log") (exit $rc)"; bad=1; }
    [ ! -s "$stage/host-$i.dir" ] || rdir[${uhosts[$i]}]=$(cat "$stage/host-$i.dir")
  done
  [ -z "$bad" ] || die "a host is not ready (above); nothing run"
  i=0
  for h in "${uhosts[@]}"; do
    v=$(cat "$stage/host-$i.version")
    [ "$v" = "$here" ] || say "note: $h runs $v, here $here (shards merge only with the same schema)"
    i=$((i + 1))
  done
  [ -z "$copy" ] || say "captures copied to ${#uhosts[@]} host(s), SHA-256 checked"
fi

host_of() { printf '%s' "${hosts[$((($1 - 1) % ${#hosts[@]}))]}"; }
# where shard K's output lies here, once done
shard_out() { if [ "$format" = parquet ]; then echo "$shards/shard-$1.parquet"; else echo "$shards/shard-$1.db"; fi; }
fmt_args=()
[ "$format" = sqlite ] || fmt_args=(--format parquet)

# one shard: K (its output on stdout/stderr goes to $shards/shard-K.log)
shard() {
  local k=$1 dest name
  dest=$(shard_out "$k")
  name=$(basename -- "$dest")
  case "$mode" in
    local)
      "$mimic" -q analyze "${abs[@]}" --shard "$k/$n" -o "$dest" "${fmt_args[@]+"${fmt_args[@]}"}" \
        "${extra[@]+"${extra[@]}"}" ;;
    docker)
      # each capture read-only at its own path, so meta `inputs` names the files as they are
      local mounts=()
      for c in "${abs[@]}"; do mounts+=(-v "$c:$c:ro"); done
      docker run --rm --name "$run-$k" --network none "${mounts[@]}" -v "$shards:/out" \
        --entrypoint mimic "$image" -q analyze "${abs[@]}" --shard "$k/$n" -o "/out/$name" \
        "${fmt_args[@]+"${fmt_args[@]}"}" "${extra[@]+"${extra[@]}"}" ;;
    ssh)
      local h d args=() a cmd tmp="$shards/.$name.part" sums="$stage/shard-$k.sha256"
      h=$(host_of "$k")
      d=${rdir[$h]}
      if [ -n "$copy" ]; then
        for c in "${abs[@]}"; do args+=("$(q "$(basename -- "$c")")"); done
      else
        for c in "${abs[@]}"; do args+=("$(q "$c")"); done
      fi
      for a in --shard "$k/$n" -o "$d/$name" "${fmt_args[@]+"${fmt_args[@]}"}" "${extra[@]+"${extra[@]}"}"; do
        args+=("$(q "$a")")
      done
      # analyze in the host's folder (the pid kept there for a stop), then the SHA-256 of each
      # file it wrote, on stdout
      cmd="cd $(q "$d${copy:+/in}") || exit 2
sh -c 'p=\$1; shift; echo \$\$ >\"\$p\"; exec \"\$@\" >&2' sh $(q "$d/shard-$k.pid") $(q "$rmimic") -q analyze ${args[*]}; rc=\$?
rm -f $(q "$d/shard-$k.pid")
[ \$rc -eq 0 ] || exit \$rc
cd $(q "$d") || exit 2"
      if [ "$format" = parquet ]; then
        cmd+=" && cd $(q "$name") && find . -type f -print0 | sort -z | xargs -0 -r sha256sum"
      else
        cmd+=" && sha256sum $(q "$name")"
      fi
      # (only checksum lines: what a login shell prints on stdout is not one)
      "$stage/ssh" "$h" "$cmd" </dev/null >"$sums.all" || return
      grep -E '^[0-9a-f]{64}  ' "$sums.all" >"$sums" || true
      [ -s "$sums" ] || { echo "no checksum came back from $h"; return 1; }
      rm -rf "$tmp"
      scp -q -B -r -S "$stage/ssh" "$(scp_host "$h"):$d/$name" "$tmp" </dev/null \
        || { echo "fetching $d/$name from $h (scp) failed"; return 1; }
      if [ "$format" = parquet ]; then
        # the same files, each with the same SHA-256
        diff <(cut -c67- "$sums" | LC_ALL=C sort) <(cd "$tmp" && find . -type f | LC_ALL=C sort) >/dev/null \
          || { echo "the files fetched from $h are not the files written there"; return 1; }
        (cd "$tmp" && sha256sum -c --quiet --strict) <"$sums" \
          || { echo "checksum mismatch: $name fetched from $h is not what was written there"; return 1; }
      else
        [ "$(sum_of "$tmp")" = "$(cut -d' ' -f1 "$sums")" ] \
          || { echo "checksum mismatch: $name fetched from $h is not what was written there"; return 1; }
      fi
      mv -T -- "$tmp" "$dest"
      # the space on the host, at once (the folder goes at the end)
      "$stage/ssh" "$h" "rm -rf $(q "$d/$name")" </dev/null >/dev/null 2>&1 || true
      ;;
  esac
}

t0=$(date +%s.%N)
say "$n shards of ${#abs[@]} capture(s), $jobs at a time, $format ($mode${image:+ $image}${hosts[*]:+ on ${hosts[*]}})"
# background jobs, each in its own process group (so a stop reaches its children), at most J
set -m
next=1
failed=
began=()
while :; do
  while [ ${#running[@]} -lt "$jobs" ] && [ "$next" -le "$n" ] && [ -z "$failed" ]; do
    (shard "$next") >"$shards/shard-$next.log" 2>&1 </dev/null &
    running[$!]=$next
    began[next]=$EPOCHREALTIME
    next=$((next + 1))
  done
  [ ${#running[@]} -gt 0 ] || break
  rc=0
  wait -n -p done_pid || rc=$?
  k=${running[$done_pid]}
  unset "running[$done_pid]"
  where=
  [ "$mode" != ssh ] || where=" on $(host_of "$k")"
  if [ "$rc" -eq 0 ]; then
    say "shard $k/$n done$where in $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - ${began[$k]} }") s"
  else
    say "shard $k/$n failed$where (exit $rc):"
    sed 's/^/  /' "$shards/shard-$k.log" >&2
    failed="$failed $k"
    # the others are stopped: the run has failed
    [ ${#running[@]} -eq 0 ] || say "stopping the shards still running"
    stop_jobs
  fi
done
set +m
[ -z "$failed" ] || die "shard$failed of $n failed (above); nothing written"
t1=$(date +%s.%N)
for k in $(seq 1 "$n"); do
  [ -e "$(shard_out "$k")" ] || die "shard $k/$n wrote nothing"
done
if [ "$format" = sqlite ]; then
  dbs=()
  for k in $(seq 1 "$n"); do dbs+=("$(shard_out "$k")"); done
  "$mimic" -q merge "${dbs[@]}" -o "$out" || die "mimic merge failed"
else
  # the shards' table=NAME/shard=K folders into one dataset, renamed into place
  ds=$stage/dataset
  mkdir "$ds"
  for k in $(seq 1 "$n"); do
    s=$(shard_out "$k")
    for t in "$s"/*; do
      tn=$(basename -- "$t")
      case "$tn" in table=*) ;; *) die "shard $k/$n: $tn in its output is not a table=NAME folder" ;; esac
      for p in "$t"/*; do
        [ "$(basename -- "$p")" = "shard=$k" ] || die "shard $k/$n: $tn holds $(basename -- "$p"), not shard=$k"
      done
      mkdir -p "$ds/$tn"
      mv -T -- "$t/shard=$k" "$ds/$tn/shard=$k"
    done
  done
  for t in "$ds"/*; do
    have=$(find "$t" -mindepth 1 -maxdepth 1 -name 'shard=*' | wc -l)
    [ "$have" -eq "$n" ] || die "$(basename -- "$t") has $have of the $n shards' files"
  done
  [ ! -d "$out" ] || rmdir -- "$out" || die "$out is no longer empty"
  mv -T -- "$ds" "$out"
fi
t2=$(date +%s.%N)
say "wrote $out: $n shards in $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s, put together in $(awk "BEGIN { printf \"%.1f\", $t2 - $t1 }") s"
