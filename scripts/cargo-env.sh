# Sourced by demo.sh and test.sh (and by hand: `source scripts/cargo-env.sh`): finds cargo
# (sudo often drops ~/.cargo/bin from PATH) and checks that its Rust is new enough for the
# workspace, or stops with a message saying what was found, what is needed and how to get it.
#
# The minimum is the workspace's `rust-version` (Cargo.toml), which is the newest that any
# locked dependency declares (rusqlite 0.41 and libsqlite3-sys need 1.89; Cargo.lock's
# `version = 4` alone needs cargo 1.78). Debian 12's packaged cargo/rustc is 1.63: it cannot
# even read the lock file.
_mimic_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_mimic_rustup="install a current Rust with rustup: curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal, then . \"\$HOME/.cargo/env\" (with rustup already installed: rustup update stable)"
if ! command -v cargo >/dev/null 2>&1 || [ "$(command -v cargo)" = /usr/bin/cargo ]; then
  # prefer a rustup toolchain over the distribution's cargo
  for d in "${HOME:-/root}/.cargo/bin" "$(getent passwd "${SUDO_USER:-root}" | cut -d: -f6)/.cargo/bin"; do
    if [ -x "$d/cargo" ]; then PATH="$d:$PATH"; export PATH; break; fi
  done
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "mimic: needs Rust (cargo) $(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$_mimic_root/Cargo.toml" | head -1) or newer; none in PATH or ~/.cargo/bin: $_mimic_rustup" >&2
  return 1 2>/dev/null || exit 1
fi
_mimic_need=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$_mimic_root/Cargo.toml" | head -1)
_mimic_have=$(rustc --version 2>/dev/null | awk '{print $2}')
_mimic_have=${_mimic_have%%-*}
if [ -z "$_mimic_have" ]; then
  echo "mimic: $(command -v cargo) found but rustc does not run: $_mimic_rustup" >&2
  return 1 2>/dev/null || exit 1
fi
if [ -n "$_mimic_need" ] && [ "$(printf '%s\n%s\n' "$_mimic_need" "$_mimic_have" | sort -V | head -1)" != "$_mimic_need" ]; then
  echo "mimic: needs Rust $_mimic_need or newer (Cargo.toml rust-version; the locked rusqlite needs it), found rustc $_mimic_have at $(command -v rustc): $_mimic_rustup" >&2
  return 1 2>/dev/null || exit 1
fi
unset _mimic_root _mimic_rustup _mimic_need _mimic_have
