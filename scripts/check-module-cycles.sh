#!/usr/bin/env bash
# Fails when a module of any crate in the workspace depends on itself through others (a module
# cycle: A names an item of B and B, directly or not, one of A). The checker is a std-only Rust
# program (scripts/module_cycles.rs, how it reads the module graph is in its doc), built here with
# plain rustc so that CI needs nothing but the toolchain.
#
# Usage: scripts/check-module-cycles.sh             check this repository (exit 1 and every cycle)
#        scripts/check-module-cycles.sh --self-test show that a planted cycle is found
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${CARGO_TARGET_DIR:-$root/target}/module-cycles"
mkdir -p "$out"
bin="$out/module_cycles"
src="$root/scripts/module_cycles.rs"
if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ]; then
  rustc --edition 2021 -O -o "$bin" "$src"
fi
if [ "${1:-}" = "--self-test" ]; then
  exec "$bin" --self-test
fi
exec "$bin" "$root"
