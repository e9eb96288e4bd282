#!/usr/bin/env bash
# Makes the base image the Dockerfile starts FROM (debian:bookworm-slim) available to the local
# Docker engine. Present already: nothing to do. Otherwise it is pulled from the registry, and
# where no registry can be reached it is built from Debian's own packages: debootstrap
# --variant=minbase bookworm from the Debian mirror, trimmed like the official slim image, then
# `docker import`. Idempotent and safe to run concurrently (a lock); the image is left for the
# next build (a shared base, like a pulled one, not a tag of any one run).
#
# Usage: docker/base.sh            (root: debootstrap and the engine need it)
# Environment: MIMIC_BASE_IMAGE (default debian:bookworm-slim), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), MIMIC_BASE_PULL=0 to skip the registry attempt.
set -euo pipefail

image=${MIMIC_BASE_IMAGE:-debian:bookworm-slim}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { echo "docker/base.sh: $*" >&2; }

command -v docker >/dev/null || { say "docker is not installed (Debian: apt-get install docker.io)"; exit 1; }
docker info >/dev/null 2>&1 || { say "the Docker engine is not running (start dockerd, or run docker/lan-test.sh which starts it)"; exit 1; }

exec 9>"/run/lock/mimic-docker-base.lock"
flock 9

if docker image inspect "$image" >/dev/null 2>&1; then
  say "$image present"
  exit 0
fi

if [ "${MIMIC_BASE_PULL:-1}" != 0 ]; then
  say "pulling $image"
  if timeout 120 docker pull -q "$image" >/dev/null 2>&1; then
    say "$image pulled"
    exit 0
  fi
  say "cannot pull $image (no registry reachable?): building it with debootstrap from $mirror"
fi

case "$image" in
  debian:bookworm*) ;;
  *) say "$image: only a debian:bookworm image can be built here (debootstrap bookworm)"; exit 1 ;;
esac
command -v debootstrap >/dev/null || { say "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
[ "$(id -u)" -eq 0 ] || { say "debootstrap needs root"; exit 1; }

root=$(mktemp -d "${TMPDIR:-/var/tmp}/mimic-base.XXXXXX")
cleanup() {
  # debootstrap may leave /proc or /sys mounted inside the tree when it is interrupted
  for m in "$root/proc" "$root/sys" "$root/dev/pts" "$root/dev"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" || true; fi
  done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT

debootstrap --variant=minbase --merged-usr bookworm "$root" "$mirror" >&2 \
  || { say "debootstrap failed (see above); is $mirror reachable?"; exit 1; }

# what the official slim image adds and removes: the same apt sources (main, updates,
# security), no documentation or translations installed from now on, no package lists kept
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
cat >"$root/etc/dpkg/dpkg.cfg.d/docker-slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
SLIM
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'CLEAN'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CLEAN
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/log/* "$root"/tmp/* "$root"/root/.bash_history
: >"$root/etc/machine-id"
echo "debian" >"$root/etc/hostname"

# an import is one layer; --change gives it the official image's command
tar --numeric-owner --xattrs -C "$root" -c . \
  | docker import --change 'CMD ["bash"]' --message "debootstrap --variant=minbase bookworm ($mirror), by mimic docker/base.sh" - "$image" >/dev/null
say "$image built: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
