#!/usr/bin/env bash
# Installs the Debian packages a task needs, idempotently: only what is missing is installed,
# and nothing is done when everything is present. Usage: scripts/deps.sh demo|test|bench|corpus
set -euo pipefail

group=${1:-demo}

# Building mimic: a C toolchain (SQLite and mimalloc are compiled from source) and libpcap.
build_pkgs=(build-essential pkg-config libpcap-dev)
# What the product itself runs: namespaces, veth offload switches, sysctls, ping in the lab,
# a font for the text of `mimic compare --png` plots, and DPDK 22.11 (Debian 12's libdpdk-dev
# and dpdk-dev: the capture's `dpdk:` source, which scripts/demo.sh builds in).
demo_pkgs=("${build_pkgs[@]}" iproute2 ethtool procps iputils-ping libpcap0.8 ca-certificates fonts-dejavu-core
  dpdk-dev libdpdk-dev)
# Testing: the peers the tests compare against (tcptrace, tshark/capinfos, tcpdump, iperf3,
# chromium); curl opens connections from chosen ports in netemu/tests/tc_apply.rs; nginx-light
# is the real web server of the independent testbed (bench/independent.sh, its lab test); Docker
# (Debian's engine and compose v1) and debootstrap for docker/lan-test.sh's container LAN
# (python3-yaml: its check of the Kubernetes manifests in docker/k8s without a cluster); QEMU,
# Debian's static busybox and cpio run lab hosts as guests on Debian's stock kernel
# (tests/lab/guest.rs; the kernel itself is fetched with apt-get download, not installed).
# DuckDB and PySpark read the Parquet output in tests/cli/parquet.rs: from PyPI into the venv
# below (Debian's pip refuses system installs), Spark on Debian's Java 17. openssh-server and
# openssh-client: docker/shard-run.sh --ssh against sshd in two namespaces (tests/lab/shard_ssh.rs).
test_pkgs=("${demo_pkgs[@]}" util-linux
  tcptrace tshark tcpdump iperf3 chromium sqlite3 python3 python3-prometheus-client curl nginx-light
  docker.io docker-compose debootstrap python3-yaml qemu-system-x86 busybox-static cpio
  python3-venv openjdk-17-jre-headless openssh-server openssh-client)
bench_pkgs=("${test_pkgs[@]}" hyperfine time)
# Fetching the public corpus (scripts/corpus.sh).
corpus_pkgs=(curl gzip ca-certificates)

case "$group" in
  demo) pkgs=("${demo_pkgs[@]}") ;;
  test) pkgs=("${test_pkgs[@]}") ;;
  bench) pkgs=("${bench_pkgs[@]}") ;;
  corpus) pkgs=("${corpus_pkgs[@]}") ;;
  *) echo "usage: $0 demo|test|bench|corpus" >&2; exit 2 ;;
esac

# The Python packages of the tests, in a venv of their own (MIMIC_PYENV, by default
# /var/cache/mimic/pyenv); made once, after the Debian packages, and left alone when complete.
pyenv() {
  local env=${MIMIC_PYENV:-/var/cache/mimic/pyenv}
  if [ -x "$env/bin/python" ] && "$env/bin/python" -c 'import duckdb, pyspark' 2>/dev/null; then
    return 0
  fi
  echo "mimic: installing duckdb and pyspark into $env" >&2
  mkdir -p "$(dirname "$env")"
  /usr/bin/python3 -m venv "$env"
  "$env/bin/pip" install -q duckdb pyspark >&2
}
[ "$group" = test ] || [ "$group" = bench ] && trap pyenv EXIT

missing=()
for p in "${pkgs[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "mimic: missing Debian packages: ${missing[*]}" >&2
  echo "mimic: run this as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi

echo "mimic: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# tshark asks whether non-root users may capture; answer once, non-interactively.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
