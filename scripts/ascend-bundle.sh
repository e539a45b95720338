#!/usr/bin/env bash
# Builds, on this machine, what `scripts/ascend-check.sh` runs on a machine with Ascend NPUs
# and CANN but no Rust toolchain: the release `shardc` binary and the Ascend test binaries,
# stripped and gzipped into `.ascend/` (ignored by git). No CANN is needed to build: the
# backend opens CANN's libraries at run time.
#
#   bash scripts/ascend-bundle.sh              # then, on the Ascend machine, in the checkout:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
#   bash scripts/ascend-check.sh .ascend OUT
#
# The binaries need glibc >= this machine's (Debian 12: 2.36).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=.ascend
tests=(ascend_emulated ascend_cli)

cargo build --release --bin shardc
test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
# The test executables' paths, from cargo's JSON messages.
mapfile -t test_paths < <(
  cargo test --release --no-run "${test_args[@]}" --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"] + " " + m["executable"])
'
)
if [ "${#test_paths[@]}" -ne "${#tests[@]}" ]; then
  echo "ascend-bundle: expected ${#tests[@]} test executables, cargo listed ${#test_paths[@]}" >&2
  exit 1
fi

rm -rf "$bundle"
mkdir -p "$bundle"
pack() { # NAME PATH
  strip -o "$bundle/$1" "$2"
  gzip -9 "$bundle/$1"
}
pack shardc target/release/shardc
for line in "${test_paths[@]}"; do pack "${line%% *}" "${line#* }"; done
git describe --always --dirty > "$bundle/COMMIT"
du -sh "$bundle"
ls -l "$bundle"
