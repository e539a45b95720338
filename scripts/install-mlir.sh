#!/usr/bin/env bash
# Installs what the `mlir` feature (crate shardc-mlir: `shardc export --mlir` and the MLIR
# shard-partition oracle) needs on Debian: LLVM/MLIR 22 from Debian's packages, about 1.9 GiB.
# melior's bindings link the MLIR C API statically, which also needs Polly and zstd.
# `.cargo/config.toml` points melior at /usr/lib/llvm-22. Idempotent: installs only what is
# missing and exits 0 when everything is already there.
#
# Usage: scripts/install-mlir.sh
set -euo pipefail

packages=(libmlir-22-dev mlir-22-tools llvm-22-dev libclang-22-dev libpolly-22-dev libzstd-dev)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-mlir: apt-get not found; install ${missing[*]} with your package manager" >&2
        exit 1
    fi
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "install-mlir: not root and sudo not found; cannot install ${missing[*]}" >&2
            exit 1
        fi
        sudo=(sudo)
    fi
    echo "install-mlir: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "install-mlir: LLVM/MLIR 22 is already installed"
fi

prefix=/usr/lib/llvm-22
for f in "$prefix/bin/llvm-config" "$prefix/bin/mlir-tblgen" "$prefix/lib/libMLIRCAPIIR.a"; do
    if [ ! -e "$f" ]; then
        echo "install-mlir: $f is missing after installing; the mlir feature cannot build" >&2
        exit 1
    fi
done
echo "install-mlir: $("$prefix/bin/llvm-config" --version) at $prefix"
echo "install-mlir: build with: cargo build -p shardc-mlir --features mlir"
