#!/usr/bin/env bash
# AllReduce between processes on this host: shardc against gloo (torch.distributed) and
# Open MPI, with the memory-bandwidth ceiling beside them, all measured in this run on this
# machine with the same method (see bench/collectives/README.md).
#
#   bench/collectives/run.sh [--sizes 4K,64K,1M,16M,64M] [--procs 2,4,8] [--iters N]
#
# Runs `shardc bench collectives --json` (built with `cargo build --release -p shardc` unless
# SHARDC_BIN names a binary), gloo_allreduce.py (skipped with a message when python3 cannot
# import torch.distributed), mpi_allreduce.c under `mpirun -n P` (skipped when mpicc or mpirun
# is absent) and triad.c on 2 threads (skipped without a C compiler with OpenMP), then prints
# one table (table.py). The JSON lines are kept in target/bench-collectives/results.jsonl.
# Exit status: 1 when shardc's own run failed (the references are still measured and shown).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sizes="4K,64K,1M,16M,64M"
procs="2,4,8"
iters=""

usage() {
    sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) sizes="${2:?--sizes needs a value}"; shift 2 ;;
        --procs) procs="${2:?--procs needs a value}"; shift 2 ;;
        --iters) iters="${2:?--iters needs a value}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

out="${CARGO_TARGET_DIR:-$root/target}/bench-collectives"
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
iters_arg=()
[ -n "$iters" ] && iters_arg=(--iters "$iters")
status=0

echo "== machine: $(nproc) logical CPUs; $(uname -srm); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# --- shardc -----------------------------------------------------------------------------------
bin="${SHARDC_BIN:-}"
if [ -z "$bin" ]; then
    echo "== building shardc (release) ..." >&2
    if (cd "$root" && cargo build --release -p shardc >&2); then
        bin="${CARGO_TARGET_DIR:-$root/target}/release/shardc"
    else
        echo "run.sh: cargo build failed: measuring the references only" >&2
        status=1
    fi
fi
if [ -n "$bin" ]; then
    echo "== shardc: $bin bench collectives --sizes $sizes --procs $procs ${iters_arg[*]}" >&2
    if ! "$bin" bench collectives --json --sizes "$sizes" --procs "$procs" "${iters_arg[@]}" >> "$results"; then
        echo "run.sh: shardc bench collectives failed (messages above); the table shows what it measured" >&2
        status=1
    fi
fi

# --- gloo (torch.distributed) -----------------------------------------------------------------
python="${PYTHON:-python3}"
if "$python" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null; then
    echo "== gloo: $("$python" -c 'import torch; print("torch", torch.__version__)')" >&2
    if ! OMP_NUM_THREADS=1 "$python" "$here/gloo_allreduce.py" --sizes "$sizes" --procs "$procs" "${iters_arg[@]}" >> "$results"; then
        echo "run.sh: the gloo reference failed (messages above)" >&2
    fi
else
    echo "== gloo: skipped: $python cannot import torch.distributed with gloo (pip install torch)" >&2
fi

# --- Open MPI ---------------------------------------------------------------------------------
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    echo "== Open MPI: $(mpirun --version 2>/dev/null | head -n1)" >&2
    if mpicc -O2 -o "$out/mpi_allreduce" "$here/mpi_allreduce.c"; then
        mpi_flags=(--oversubscribe)
        [ "$(id -u)" = 0 ] && mpi_flags+=(--allow-run-as-root)
        for p in ${procs//,/ }; do
            if ! mpirun "${mpi_flags[@]}" -n "$p" "$out/mpi_allreduce" --sizes "$sizes" "${iters_arg[@]}" >> "$results"; then
                echo "run.sh: the Open MPI reference with $p processes failed (messages above)" >&2
            fi
        done
    else
        echo "run.sh: mpicc could not build mpi_allreduce.c: skipping Open MPI" >&2
    fi
else
    echo "== Open MPI: skipped: mpicc or mpirun is absent (apt-get install openmpi-bin libopenmpi-dev)" >&2
fi

# --- memory-bandwidth ceiling -----------------------------------------------------------------
cc="${CC:-cc}"
if command -v "$cc" >/dev/null && "$cc" -O3 -march=native -fopenmp -o "$out/triad" "$here/triad.c" 2>/dev/null; then
    echo "== triad: STREAM triad, 2 threads" >&2
    OMP_NUM_THREADS=2 "$out/triad" >> "$results" || echo "run.sh: the triad failed" >&2
else
    echo "== triad: skipped: no C compiler with OpenMP ($cc -fopenmp)" >&2
fi

# --- the table --------------------------------------------------------------------------------
echo
if command -v "$python" >/dev/null; then
    "$python" "$here/table.py" "$results"
else
    cat "$results"
fi
echo "(JSON lines: $results)"
exit "$status"
