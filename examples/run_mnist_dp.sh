#!/bin/bash
# MindSpore's distributed_data_parallel/run.sh (msrun), for shardc: the MNIST MLP, data
# parallel on 8 ranks started by `shardc launch`; logs in log_output/1/rank.*/stdout.
#   bash examples/run_mnist_dp.sh [DATA_PATH] [options of mnist_data_parallel]
# Without DATA_PATH (or with a directory lacking the idx files) a synthetic MNIST is written
# there first.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA_PATH=${1:-$ROOT/target/mnist-synthetic}
shift || true
SHARDC=${SHARDC_BIN:-$ROOT/target/release/shardc}
BIN=${SHARDC_EXAMPLE_BIN:-$ROOT/target/release/examples/mnist_data_parallel}
if [ ! -x "$BIN" ] || [ ! -x "$SHARDC" ]; then
  (cd "$ROOT" && cargo build --release --quiet --bin shardc --example mnist_data_parallel)
fi
if [ ! -f "$DATA_PATH/train-images-idx3-ubyte" ]; then
  "$SHARDC" data synth --format mnist --out "$DATA_PATH" --images 4096
fi
export DATA_PATH
"$SHARDC" launch --worker-num "${WORKER_NUM:-8}" --local-worker-num "${WORKER_NUM:-8}" \
  --master-port "${MASTER_PORT:-8118}" --log-dir "${LOG_DIR:-log_output}" --join \
  -- "$BIN" "$@"
echo "-- rank 0: ${LOG_DIR:-log_output}/1/rank.0/stdout"
cat "${LOG_DIR:-log_output}/1/rank.0/stdout"
