#!/usr/bin/env bash
# The test command: every test of the workspace under cargo-nextest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
profile=default
[ "${CI:-}" = "true" ] && profile=ci
cargo nextest run --workspace --profile "$profile" "$@"
