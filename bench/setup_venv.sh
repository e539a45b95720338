#!/usr/bin/env bash
# Creates bench/.venv with the reference side of the benchmarks (numpy, PyTorch CPU use).
#
# Idempotent: when bench/.venv already imports numpy, torch and threadpoolctl it does nothing.
# Only the benchmarks call this (`shardc bench`, `cargo bench --bench train_step`); CI and the
# README's setup commands never do. PyTorch from PyPI is the CUDA build (about 5.5 GB) even
# though the benchmarks only use its CPU side.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import numpy, torch, threadpoolctl' 2>/dev/null; then
    echo "bench venv ready: $venv"
    exit 0
fi

if ! command -v "$python" >/dev/null 2>&1; then
    echo "error: '$python' not found; set PYTHON to a Python 3.9+ interpreter" >&2
    exit 1
fi

echo "creating bench venv at $venv (numpy, torch, threadpoolctl; torch is about 5.5 GB)"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --upgrade pip
"$venv/bin/python" -m pip install numpy torch threadpoolctl
"$venv/bin/python" -c 'import numpy, torch, threadpoolctl; print("numpy", numpy.__version__, "torch", torch.__version__)'
echo "bench venv ready: $venv"
