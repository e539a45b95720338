#!/usr/bin/env bash
# The main job: set up, build, and train the MindSpore tutorial's quickstart net with shardc.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin shardc --example quickstart
echo "== examples/quickstart.rs: the tutorial net built with the Rust frontend =="
cargo run --release --quiet --example quickstart
echo "== shardc compile + run: the same net from models/quickstart.ir =="
out=$(mktemp -d)
./target/release/shardc compile models/quickstart.ir -o "$out/quickstart" \
  --optimizer momentum --learning-rate 0.2 --momentum 0.1
./target/release/shardc run "$out/quickstart" --steps 40 --stats
