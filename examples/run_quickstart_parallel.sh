#!/bin/bash
# MindSpore's parallel-training quickstart (run_with_mpi.sh), for shardc: 8 ranks started by
# `shardc launch` (or by mpirun with a build that has --features mpi: see README), auto_parallel
# with sharding propagation; logs in device/1/rank.R/stdout, IR dumps in
# saved_graph/rank_R/, checkpoints in device/ckpt/{rank_id}/.
#   bash examples/run_quickstart_parallel.sh [options of quickstart_parallel]
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARDC=${SHARDC_BIN:-$ROOT/target/release/shardc}
BIN=${SHARDC_EXAMPLE_BIN:-$ROOT/target/release/examples/quickstart_parallel}
if [ ! -x "$BIN" ] || [ ! -x "$SHARDC" ]; then
  (cd "$ROOT" && cargo build --release --quiet --bin shardc --example quickstart_parallel)
fi
OUT=${OUT_DIR:-device}
mkdir -p "$OUT"
"$SHARDC" launch --worker-num 8 --local-worker-num 8 --master-port "${MASTER_PORT:-8119}" \
  --log-dir "$OUT" --join -- "$BIN" --save-graphs-path "$OUT/saved_graph" \
  --checkpoint-dir "$OUT/ckpt" "$@"
echo "-- rank 0: $OUT/1/rank.0/stdout"
cat "$OUT/1/rank.0/stdout"
grep -h "in_strategy" "$OUT"/saved_graph/rank_0/step_parallel_begin_*.ir | head -3
