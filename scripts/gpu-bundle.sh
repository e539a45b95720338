#!/usr/bin/env bash
# Builds, on this machine, what `scripts/gpu-check.sh` runs on a GPU machine that has no Rust
# toolchain and no network (the `device` tool's machines): the release `shardc` binary, the
# examples the GPU tutorials run, and the GPU test binaries, stripped and gzipped into
# `.gpu/` (ignored by git, about 25 MB; the device tool carries at most 64 MiB).
#
#   bash scripts/gpu-bundle.sh            # then, on the GPU machine, in the checkout's root:
#   bash scripts/gpu-check.sh .gpu OUT    # (device tool: carry [".gpu"], OUT=$OUT)
#
# The binaries need glibc >= this machine's (Debian 12: 2.36) and no CUDA at build time.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=.gpu
tests=(cuda_gpu cuda_emulated cuda_conv_emulated)
examples=(nccl_allgather resnet50_distributed_training)

cargo build --release --bin shardc "${examples[@]/#/--example=}"
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
  echo "gpu-bundle: expected ${#tests[@]} test executables, cargo listed ${#test_paths[@]}" >&2
  exit 1
fi

rm -rf "$bundle"
mkdir -p "$bundle"
pack() { # NAME PATH
  strip -o "$bundle/$1" "$2"
  gzip -9 "$bundle/$1"
}
pack shardc target/release/shardc
for e in "${examples[@]}"; do pack "$e" "target/release/examples/$e"; done
for line in "${test_paths[@]}"; do pack "${line%% *}" "${line#* }"; done
git describe --always --dirty > "$bundle/COMMIT"
du -sh "$bundle"
ls -l "$bundle"
