#!/usr/bin/env bash
# The test command: every test of the workspace under cargo-nextest. Where Open MPI is
# installed (scripts/install-mpi.sh), the `mpi` feature is on and the tests that run
# `mpirun -n N shardc ... --comm mpi` run too; elsewhere they are left out with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# NVIDIA's runtime compiler (no GPU needed), so the tests compile every CUDA kernel to PTX.
bash scripts/install-nvrtc.sh || echo "test: NVRTC could not be installed: the PTX test skips"
profile=default
[ "${CI:-}" = "true" ] && profile=ci
features=()
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
  features=(--features mpi)
else
  echo "test: Open MPI not found: the MPI communicator's tests are left out (bash scripts/install-mpi.sh adds them)"
fi
cargo nextest run --workspace --profile "$profile" "${features[@]}" "$@"
# The `mlir` feature's one test binary (MLIR's C API links statically, about 230 MB a binary):
# `shardc export --mlir`'s output verified, and MLIR's shard-partition as an oracle of ours.
if [ -x /usr/lib/llvm-22/bin/llvm-config ]; then
  cargo nextest run -p shardc-mlir --features mlir --test mlir_oracle --profile "$profile" \
    --no-tests=warn "$@"
else
  echo "test: LLVM/MLIR 22 not found: the MLIR oracle is left out (bash scripts/install-mlir.sh adds it)"
fi
