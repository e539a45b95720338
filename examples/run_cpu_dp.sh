#!/bin/bash
# run data parallel training on CPU: MindSpore's distributed_training_cpu/run.sh, for shardc.
echo "=============================================================================================================="
echo "Please run the script with dataset path, such as: "
echo "bash examples/run_cpu_dp.sh DATA_PATH [options of resnet50_distributed_training]"
echo "For example: bash examples/run_cpu_dp.sh /path/dataset/cifar-10-batches-bin"
echo "It is better to use the absolute path."
echo "=============================================================================================================="
set -e
if [ $# -lt 1 ]; then
  echo "error: no DATA_PATH given (\`shardc data synth --format cifar10 --out DIR\` writes a synthetic one)" >&2
  exit 2
fi
DATA_PATH=$1
shift
export DATA_PATH=${DATA_PATH}
export MS_WORKER_NUM=${MS_WORKER_NUM:-8}
export MS_SCHED_HOST=${MS_SCHED_HOST:-127.0.0.1}
export MS_SCHED_PORT=${MS_SCHED_PORT:-8117}
# shardc's cluster refuses workers without the shared secret (MindSpore's tutorial has none):
# one made here is handed to the scheduler and every worker through the environment.
export SHARDC_CLUSTER_TOKEN=${SHARDC_CLUSTER_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${SHARDC_EXAMPLE_BIN:-$ROOT/target/release/examples/resnet50_distributed_training}
if [ ! -x "$BIN" ]; then
  (cd "$ROOT" && cargo build --release --quiet --example resnet50_distributed_training)
fi
LOG_DIR=${LOG_DIR:-.}
mkdir -p "$LOG_DIR"

# Launch 1 scheduler.
export MS_ROLE=MS_SCHED
"$BIN" "$@" >"$LOG_DIR/scheduler.txt" 2>&1 &
sched=$!
echo "scheduler start success!"

# Launch the workers.
export MS_ROLE=MS_WORKER
pids=()
for((i=0;i<${MS_WORKER_NUM};i++));
do
    "$BIN" "$@" >"$LOG_DIR/worker_$i.txt" 2>&1 &
    pids+=($!)
    echo "worker ${i} start success with pid ${!}"
done

# Unlike the tutorial's script, wait for the job and report how it ended.
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "worker $i failed: see $LOG_DIR/worker_$i.txt" >&2
    status=1
  fi
done
wait "$sched" || status=1
exit $status
