#!/usr/bin/env bash
# Installs what the `mpi` feature of shardc-collectives needs on Debian/Ubuntu:
# Open MPI (mpirun, mpicc, the headers) and libclang (the `mpi` crate generates its bindings
# with bindgen). Idempotent: installs only the packages that are missing and exits 0 when
# everything is already there.
#
# Usage: scripts/install-mpi.sh
set -euo pipefail

packages=(openmpi-bin libopenmpi-dev libclang-dev)

missing=()
for p in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        echo "install-mpi: $p is already installed"
    else
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-mpi: apt-get not found; install ${missing[*]} with your package manager" >&2
        exit 1
    fi
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "install-mpi: not root and sudo not found; cannot install ${missing[*]}" >&2
            exit 1
        fi
        sudo=(sudo)
    fi
    echo "install-mpi: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    echo "install-mpi: installed ${missing[*]}"
else
    echo "install-mpi: nothing to install"
fi

for tool in mpirun mpicc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "install-mpi: $tool is still not on PATH after installing" >&2
        exit 1
    fi
done
echo "install-mpi: $(mpirun --version 2>/dev/null | head -n 1)"

# bindgen (used by the mpi crate) finds libclang through LIBCLANG_PATH when it is not on the
# default search path.
libclang=$(ls -d /usr/lib/llvm-*/lib/libclang.so* 2>/dev/null | sort -V | tail -n 1 || true)
if [ -n "$libclang" ]; then
    echo "install-mpi: libclang at $libclang; if the build cannot find it:"
    echo "    export LIBCLANG_PATH=$(dirname "$libclang")"
fi
echo "install-mpi: build with: cargo build -p shardc-collectives --features mpi"
echo "install-mpi: as root, run with: mpirun --allow-run-as-root --oversubscribe -n 4 PROGRAM"
