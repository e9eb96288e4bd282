#!/usr/bin/env bash
# Fetches the public corpus: the third-party captures listed in scripts/corpus-sources.md (a
# copy of the corpus's SOURCES.md: `owner/repo : path @commit` per file), each the raw file of
# that commit on GitHub, `.gz` upstream files decompressed, every size checked against the list.
#
#   scripts/corpus.sh [DIR]    DIR defaults to $MIMIC_TRACES, else ../shared/traces/public
#
# The tests find the corpus at ../shared/traces/public beside the checkout, or wherever
# MIMIC_TRACES points (export it when DIR is elsewhere). Idempotent: files already there with
# the listed size are kept, the rest fetched into a staging folder beside DIR and moved in only
# once all of them arrived, so a failed or interrupted run leaves no half-written file.
# MIMIC_CORPUS_MIRROR=URL fetches from a mirror laid out as URL/owner/repo/raw/COMMIT/PATH
# (default https://github.com, whose /raw/ URLs resolve the abbreviated commits of the list).
set -euo pipefail
cd "$(dirname "$0")/.."

list=scripts/corpus-sources.md
dest=${1:-${MIMIC_TRACES:-../shared/traces/public}}
dest=${dest%/}
mirror=${MIMIC_CORPUS_MIRROR:-https://github.com}
mirror=${mirror%/}

die() {
  echo "mimic corpus: $*" >&2
  exit 1
}

[ -f "$list" ] || die "$list is missing"
scripts/deps.sh corpus
command -v curl >/dev/null 2>&1 || die "needs curl (apt-get install -y curl)"
command -v gzip >/dev/null 2>&1 || die "needs gzip"

# SOURCES.md → dir, file, owner/repo, upstream path, commit, size (tab-separated). A section's
# rows name their source in the Source column, or (the fuzz corpus) share the one named on its
# "Source:" line, whose files sit in sub-folders tried in turn.
entries=$(awk '
/^## [^ ]+\/ - / { dir = $2; sub(/\/$/, "", dir); repo = ""; base = ""; commit = ""; next }
/^## / { dir = ""; next }
/^Source: `/ && dir != "" {
  split($0, q, "`"); repo = q[2]; base = q[4]
  if (match($0, /@[0-9a-f]+/)) commit = substr($0, RSTART + 1, RLENGTH - 1)
  next
}
/^\| `/ && dir != "" {
  n = split($0, c, "|")
  for (i = 1; i <= n; i++) gsub(/^ +| +$/, "", c[i])
  file = c[2]; gsub(/`/, "", file)
  if (c[3] ~ /^`[^`]+` : `[^`]+` @[0-9a-f]+$/) {
    split(c[3], q, "`"); r = q[2]; p = q[4]
    match(c[3], /@[0-9a-f]+$/); k = substr(c[3], RSTART + 1)
    size = c[4]
  } else if (repo != "") {
    r = repo; p = base file; k = commit; size = c[3]
  } else next
  printf "%s\t%s\t%s\t%s\t%s\t%s\n", dir, file, r, p, k, size
}' "$list")
total=$(printf '%s\n' "$entries" | grep -c . || true)
[ "$total" -gt 100 ] || die "$list lists only $total captures: not the corpus's SOURCES.md"

size_of() { stat -c %s "$1" 2>/dev/null || echo -1; }

# what is missing (or has the wrong size)
missing=$(printf '%s\n' "$entries" | while IFS=$'\t' read -r d f r p k s; do
  [ "$(size_of "$dest/$d/$f")" = "$s" ] || printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$d" "$f" "$r" "$p" "$k" "$s"
done)
if [ -z "$missing" ]; then
  [ "$(size_of "$dest/SOURCES.md")" = "$(size_of "$list")" ] || {
    mkdir -p "$dest"
    cp "$list" "$dest/.SOURCES.md.part" && mv "$dest/.SOURCES.md.part" "$dest/SOURCES.md"
  }
  echo "mimic corpus: $dest is complete ($total captures)"
  exit 0
fi
need=$(printf '%s\n' "$missing" | grep -c .)
echo "mimic corpus: fetching $need of $total captures into $dest from $mirror" >&2

# the network first: a machine that reaches only package registries stops here, having
# written nothing
if [[ "$mirror" == http* ]] && ! curl -sS -o /dev/null --max-time 20 -I "$mirror/" 2>/tmp/mimic-corpus-$$.err; then
  why=$(tr -d '\r' </tmp/mimic-corpus-$$.err | tail -1)
  rm -f /tmp/mimic-corpus-$$.err
  die "cannot reach $mirror ($why): this network does not allow fetching the corpus. Nothing was written. Fetch it where GitHub is reachable and copy $dest here, or set MIMIC_CORPUS_MIRROR to a mirror"
fi
rm -f /tmp/mimic-corpus-$$.err

parent=$(dirname "$dest")
mkdir -p "$parent"
stage=$(mktemp -d "$parent/.corpus-staging.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# fetches one upstream file to $2; 0 when it arrived
get() {
  local url=$1 out=$2
  if [[ "$url" == *.gz ]]; then
    curl -sSfL --retry 2 --max-time 120 "$url" -o "$out.gz" && gzip -dc "$out.gz" >"$out" && rm -f "$out.gz"
  else
    curl -sSfL --retry 2 --max-time 120 "$url" -o "$out"
  fi
}

failed=0
while IFS=$'\t' read -r d f r p k s; do
  mkdir -p "$stage/$d"
  out="$stage/$d/$f"
  cands=("$p")
  if [[ "$p" == */RegressionTests/* ]]; then
    # the fuzz corpus: most files sit in regression_samples/, some one level up or in a
    # folder per sanitizer
    b=${p%/*}
    cands=("$b/regression_samples/$f" "$p" "$b/address/$f" "$b/memory/$f" "$b/undefined/$f")
  fi
  ok=0
  for c in "${cands[@]}"; do
    rm -f "$out" "$out.gz"
    if get "$mirror/$r/raw/$k/$c" "$out" 2>/dev/null && [ "$(size_of "$out")" = "$s" ]; then
      ok=1
      break
    fi
  done
  if [ "$ok" = 1 ]; then
    echo "  $d/$f" >&2
  else
    echo "  FAILED $d/$f ($r : $p @$k; expected $s bytes, got $(size_of "$out"))" >&2
    failed=$((failed + 1))
  fi
done <<<"$missing"
if [ "$failed" -gt 0 ]; then
  die "$failed of $need captures could not be fetched (listed above); nothing was written to $dest"
fi

# everything arrived: move it in, file by file (each rename is atomic), SOURCES.md last
while IFS=$'\t' read -r d f r p k s; do
  mkdir -p "$dest/$d"
  mv -f "$stage/$d/$f" "$dest/$d/$f"
done <<<"$missing"
cp "$list" "$dest/.SOURCES.md.part" && mv -f "$dest/.SOURCES.md.part" "$dest/SOURCES.md"
echo "mimic corpus: $dest is complete ($total captures, $need fetched)"
case "$(cd "$dest" && pwd -P)" in
  "$(cd .. && pwd -P)/shared/traces/public") ;;
  *) echo "mimic corpus: the tests look for it at ../shared/traces/public; run them with MIMIC_TRACES=$dest" >&2 ;;
esac
