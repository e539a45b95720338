#!/usr/bin/env bash
# Installs NVIDIA's runtime compiler (NVRTC, CUDA 13.0; no GPU or driver needed) into
# target/cuda-libs/nvrtc from PyPI, so that the CUDA backend's kernels are compiled to PTX
# by the real compiler in the tests (backends/cuda/tests/nvrtc.rs). Pinned to 13.0.x so the
# PTX is not newer than a CUDA 13.0 driver. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=target/cuda-libs/nvrtc
if [ -e "$dest/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  exit 0
fi
python3 -m pip --version >/dev/null 2>&1 || { echo "install-nvrtc: python3 with pip is needed" >&2; exit 1; }
mkdir -p "$dest"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  --target "$dest" "nvidia-cuda-nvrtc==13.0.*"
echo "install-nvrtc: NVRTC in $dest/nvidia/cu13/lib"
