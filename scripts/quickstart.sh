#!/usr/bin/env bash
# The main job: set up, build, and train the MindSpore tutorial's quickstart net with shardc,
# on one device and on 8 ranks (the tutorial's strategies, the rest by sharding propagation),
# the 8 ranks as worker processes under `shardc launch` (a scheduler + 8 workers, collectives
# through shared memory), then check that the 8 ranks compute what one device does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin shardc --example quickstart
shardc=./target/release/shardc
echo "== examples/quickstart.rs: the tutorial net built with the Rust frontend =="
cargo run --release --quiet --example quickstart
out=$(mktemp -d)
echo "== shardc compile + run: the same net from models/quickstart.ir, one device =="
$shardc compile models/quickstart.ir -o "$out/quickstart" \
  --optimizer momentum --learning-rate 0.2 --momentum 0.1
$shardc run "$out/quickstart" --steps 40 --stats
echo "== the same net on 8 ranks: matmul ((2, 4), (4, 1)) as annotated, the rest by sharding propagation =="
$shardc compile models/quickstart.ir -o "$out/quickstart8" --device-num 8 \
  --parallel-mode auto_parallel --optimizer momentum --learning-rate 0.2 --momentum 0.1 \
  --save-graphs-path "$out/saved_graph"
$shardc launch --worker-num 8 --local-worker-num 8 --master-port "${SHARDC_PORT:-8118}" \
  --log-dir "$out/log_output" --join -- "$shardc" run "$out/quickstart8" --steps 40
echo "-- rank 0's log: $out/log_output/1/rank.0/stdout"
cat "$out/log_output/1/rank.0/stdout"
echo "-- rank 0's dumps: $out/saved_graph/rank_0/"
ls "$out/saved_graph/rank_0/"
$shardc explain "$out/quickstart8" --op relu
echo "== shardc verify: 8 ranks against one device =="
$shardc verify models/quickstart.ir --device-num 8 --parallel-mode auto_parallel --steps 5 \
  --optimizer momentum --learning-rate 0.2 --momentum 0.1
