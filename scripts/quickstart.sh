#!/usr/bin/env bash
# The main job: set up, build, and train the MindSpore tutorials' networks with shardc:
#  1. the parallel quickstart's net on one device (examples/quickstart.rs);
#  2. the same net on 8 worker processes under `shardc launch`, auto_parallel with sharding
#     propagation, through Model.train (examples/run_quickstart_parallel.sh): the tutorial's
#     losses, dumps and per-rank checkpoints;
#  3. the data-parallel tutorial's MLP on MNIST (a synthetic set in the real idx format),
#     8 ranks, the tutorial's explicit value_and_grad / DistributedGradReducer loop
#     (examples/run_mnist_dp.sh);
#  4. `shardc verify`: the 8 ranks compute what one device does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin shardc --example quickstart --example quickstart_parallel \
  --example mnist_data_parallel
shardc=./target/release/shardc
out=$(mktemp -d)
echo "== 1. examples/quickstart.rs: the tutorial net on one device =="
./target/release/examples/quickstart
echo "== 2. the parallel quickstart on 8 worker processes (auto_parallel, Model.train) =="
OUT_DIR="$out/device" MASTER_PORT="${SHARDC_PORT:-8118}" bash examples/run_quickstart_parallel.sh
echo "-- rank 0's dumps: $out/device/saved_graph/rank_0/; checkpoints: $out/device/ckpt/{0..7}/"
ls "$out/device/saved_graph/rank_0/" "$out/device/ckpt/0/"
echo "== 3. the MNIST MLP, data parallel on 8 ranks (value_and_grad + DistributedGradReducer) =="
LOG_DIR="$out/log_output" MASTER_PORT="$(( ${SHARDC_PORT:-8118} + 1 ))" \
  bash examples/run_mnist_dp.sh "$out/mnist" --epochs 2 --print-every 4
echo "== 4. shardc verify: 8 ranks against one device =="
$shardc verify models/quickstart.ir --device-num 8 --parallel-mode auto_parallel --steps 5 \
  --optimizer momentum --learning-rate 0.2 --momentum 0.1
