#!/usr/bin/env bash
# Larger models than the CI fixtures, exported by the real frameworks, imported and checked
# (issue 31, part 4): each is exported, imported with `shardc import`, run forward with
# `shardc predict` against the exporter's own output, compiled for 8 devices in every
# parallel mode (timed), checked with `shardc verify` and trained for two steps.
#
#   PYTHON=/path/to/python [SHARDC=/path/to/shardc] scripts/import-large-models.sh [OUT_DIR] [BATCH] [SIZE]
#
# The models: MindSpore's ResNet-50 as MindIR (scripts/large_models/mindspore_resnet50.py),
# torchvision's ResNet-50 and Hugging Face's GPT-2 small (124 M parameters) as ONNX
# (scripts/large_models/torch_models.py). PYTHON must have MindSpore 2.10, torch,
# torchvision, transformers, onnx, onnxruntime, numpy and safetensors (`pip install
# mindspore==2.10.0 torch torchvision transformers onnx onnxruntime safetensors`). OUT_DIR
# (default: a new temporary directory) receives the exported files (about 1.5 GB) and the
# logs. BATCH and SIZE are the ResNets' input (default 8 and 112: 224 works too, four times
# slower); GPT-2 reads BATCH sequences of 16 tokens. Not run by CI: it takes minutes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
out="${1:-$(mktemp -d -t shardc-large-XXXXXX)}"
batch="${2:-8}"
size="${3:-112}"
mkdir -p "$out"
# SHARDC: a shardc binary to use (default: a release build of this checkout).
shardc="${SHARDC:-}"
if [ -z "$shardc" ]; then
  cargo build --release --bin shardc --manifest-path "$root/Cargo.toml" >&2
  shardc="$root/target/release/shardc"
fi

# Largest |a - b| over largest |b| of the only output of $1 against `logits` of $2.
compare() {
  "$py" - "$1" "$2" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
got = list(load_file(sys.argv[1]).values())[0]
want = np.load(sys.argv[2])["logits"]
print(f"{np.abs(got - want).max() / np.abs(want).max():.3e}")
PY
}

# check NAME MODEL_FILE FORWARD_NPZ LOSS...: import, predict, compile in every mode, verify, train.
check() {
  local name="$1" file="$2" forward="$3"
  shift 3
  local t0 t1 rel
  t0=$(date +%s.%N)
  "$shardc" import "$file" -o "$out/$name.ir" --weights "$out/$name.safetensors"
  t1=$(date +%s.%N)
  echo "$name: import $(echo "$t0 $t1" | awk '{printf "%.1f", $2-$1}') s"
  "$shardc" predict "$out/$name.ir" --init-from "$out/$name.safetensors" --data "$forward" \
    -o "$out/$name.out.safetensors" >/dev/null
  rel=$(compare "$out/$name.out.safetensors" "$forward")
  echo "$name: predict, max relative difference to the exporter's output: $rel"
  for mode in "data_parallel" "semi_auto_parallel" \
    "auto_parallel --search-mode sharding_propagation" \
    "auto_parallel --search-mode dynamic_programming" \
    "auto_parallel --search-mode recursive_programming" \
    "auto_parallel --search-mode ilp"; do
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    if "$shardc" compile "$out/$name.ir" -o "$out/$name-art" "$@" --device-num 8 --parallel-mode $mode \
      >"$out/$name-compile.log" 2>&1; then
      t1=$(date +%s.%N)
      echo "$name: compile for 8 devices, $mode: $(echo "$t0 $t1" | awk '{printf "%.1f", $2-$1}') s"
    else
      echo "$name: compile for 8 devices, $mode: refused: $(tail -1 "$out/$name-compile.log")"
    fi
  done
  "$shardc" verify "$out/$name.ir" "$@" --device-num 8 --steps 2 | tail -1 | sed "s/^/$name: verify: /"
  # A small learning rate: the random initializations give large first losses.
  "$shardc" compile "$out/$name.ir" -o "$out/$name-art" "$@" --device-num 8 --parallel-mode auto_parallel \
    --learning-rate 0.0001 >/dev/null
  "$shardc" run "$out/$name-art" --steps 2 --init-from "$out/$name.safetensors" | sed "s/^/$name: run: /"
}

"$py" "$root/scripts/large_models/mindspore_resnet50.py" "$out" "$batch" "$size" 2>&1 | grep -v WARNING
check resnet50-mindir "$out/resnet50.mindir" "$out/resnet50_forward.npz" --loss sparse_softmax_cross_entropy

"$py" "$root/scripts/large_models/torch_models.py" "$out" "$batch" "$size" 2>&1 | grep -v -i warn
check resnet50-onnx "$out/torch_resnet50.onnx" "$out/torch_resnet50_forward.npz" --loss sparse_softmax_cross_entropy
check gpt2-onnx "$out/torch_gpt2.onnx" "$out/torch_gpt2_forward.npz" --loss mse
