#!/usr/bin/env bash
# Installs what building and testing shardc needs on a fresh Debian machine with Rust.
# Idempotent: a second run only checks.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
# g++ (C++20) builds the CUDA backend's kernels for the host emulator its tests run on.
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found: install Rust (rustup) first" >&2; exit 1; }
for tool in rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null 2>&1 || rustup component add "${tool#cargo-}" || {
    echo "setup: $tool is missing and could not be installed" >&2; exit 1; }
done
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest from crates.io (a few minutes, once)"
  cargo install cargo-nextest --locked
fi
