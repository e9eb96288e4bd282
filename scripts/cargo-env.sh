# Sourced by demo.sh and test.sh: finds cargo (sudo often drops ~/.cargo/bin from PATH) or
# stops with a message saying what is missing.
if ! command -v cargo >/dev/null 2>&1; then
  for d in "${HOME:-/root}/.cargo/bin" "$(getent passwd "${SUDO_USER:-root}" | cut -d: -f6)/.cargo/bin"; do
    if [ -x "$d/cargo" ]; then PATH="$d:$PATH"; export PATH; break; fi
  done
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "mimic: needs Rust (cargo), e.g. from https://rustup.rs; not found in PATH or ~/.cargo/bin" >&2
  exit 1
fi
