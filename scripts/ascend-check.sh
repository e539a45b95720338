#!/usr/bin/env bash
# Issue 29's checks on a machine with Ascend NPUs and CANN, from the bundle
# `scripts/ascend-bundle.sh` builds (no Rust needed there). Source CANN's environment first
# (`source /usr/local/Ascend/ascend-toolkit/set_env.sh`: ASCEND_HOME_PATH, LD_LIBRARY_PATH):
#   1. `shardc device info`: the CANN libraries found, the NPUs;
#   2. the models of the emulated suite (MLP, quickstart, transformer with Adam, LeNet,
#      ResNet-18) on NPU 0 against the CPU executor (SHARDC_TEST_DEVICE=ascend);
#   3. the quickstart net on one NPU and on 8 in-process ranks (an NPU each with HCCL where
#      there are 8, else staged through the host) with the CPU's losses;
#   4. with 2 NPUs or more: launched workers with HCCL (`shardc launch`, then a job started by
#      hand from a rank table, as MindSpore's Ascend tutorials do) with the CPU's losses;
#   5. where `torch_npu` imports (`--python`, default python3): the same MLP's training steps
#      in PyTorch on the NPU against `shardc run --device-target Ascend`, as a ratio.
#
#   bash scripts/ascend-check.sh [BUNDLE] [OUT]     (defaults: .ascend and $OUT or /tmp/ascend-check)
#
# SHARDC_ASCEND_CHECK_REHEARSE=1 rehearses it on a machine without NPUs, on the project's CANN
# emulator (SHARDC_ASCEND_LIB_DIRS must name a directory where it is staged under CANN's
# names; tests/ascend_check.rs does so): every step runs there but the torch_npu bench.
# Each step has its own time limit and log; OUT/summary.txt gets one line per step
# (PASS/FAIL/SKIP, seconds, a failure's last lines), OUT/logs.tar.gz the logs. Exits 0 only
# when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-.ascend}
out=${2:-${OUT:-/tmp/ascend-check}}
python=${SHARDC_PYTHON:-python3}
rehearse=${SHARDC_ASCEND_CHECK_REHEARSE:-}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
work=$(mktemp -d)
bin="$work/bin"
logs="$work/logs"
mkdir -p "$bin" "$logs"
for f in "$bundle"/*; do
  name=$(basename "$f")
  case "$name" in
    *.gz) gunzip -c "$f" > "$bin/${name%.gz}" && chmod +x "$bin/${name%.gz}" ;;
    COMMIT) ;;
    *) [ -x "$f" ] && ln -s "$(cd "$(dirname "$f")" && pwd)/$name" "$bin/$name" ;;
  esac
done
if [ ! -x "$bin/shardc" ]; then
  echo "ascend-check: no shardc binary in $bundle: run scripts/ascend-bundle.sh first" | tee -a "$summary"
  exit 2
fi
if [ -n "$rehearse" ] && [ -z "${SHARDC_ASCEND_LIB_DIRS:-}" ]; then
  echo "ascend-check: a rehearsal needs SHARDC_ASCEND_LIB_DIRS (the emulator staged under CANN's names)" | tee -a "$summary"
  exit 2
fi
test_device=ascend
[ -n "$rehearse" ] && test_device=emulator
echo "bundle: $(cat "$bundle/COMMIT" 2> /dev/null || echo unknown commit); ASCEND_HOME_PATH=${ASCEND_HOME_PATH:-unset}; SHARDC_ASCEND_LIB_DIRS=${SHARDC_ASCEND_LIB_DIRS:-unset}" | tee -a "$summary"
npu-smi info > "$logs/00-env.log" 2>&1 || true

failed=0
step() { # NAME SECONDS COMMAND...
  local name=$1 limit=$2 log="$logs/$1.log" start=$SECONDS rc
  shift 2
  echo "== $name: $*" | tee "$log"
  timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name ($((SECONDS - start)) s)" | tee -a "$summary"
  else
    [ "$rc" -eq 124 ] && rc="$rc: over ${limit} s"
    echo "FAIL $name ($((SECONDS - start)) s, exit $rc; last lines of $name.log below)" | tee -a "$summary"
    tail -n 15 "$log" | sed 's/^/    /' | tee -a "$summary"
    failed=1
  fi
  tar czf "$out/logs.tar.gz" -C "$work" logs
}

compare_losses() { # CPU_LOG NPU_LOG: the ", loss is X" lines agree to 1e-5 relative to max(|x|, 1)
  "$python" - "$1" "$2" << 'EOF'
import math, sys
def losses(p):
    return [float(l.split(", loss is ")[1]) for l in open(p) if ", loss is " in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("cpu", a)
print("npu", b)
ok = len(a) == len(b) > 0 and all(math.isfinite(y) and abs(x - y) <= 1e-5 * max(abs(x), 1.0) for x, y in zip(a, b))
print("same losses" if ok else "LOSSES DIFFER")
sys.exit(0 if ok else 1)
EOF
}

cli_checks() {
  local s="$bin/shardc" model=models/quickstart.ir
  "$s" compile "$model" -o "$work/one" &&
    "$s" run "$work/one" --steps 10 > "$work/one.cpu" &&
    "$s" run "$work/one" --steps 10 --device-target Ascend --stats > "$work/one.npu" &&
    cat "$work/one.npu" && compare_losses "$work/one.cpu" "$work/one.npu" &&
    "$s" compile "$model" -o "$work/eight" --device-num 8 --parallel-mode semi_auto_parallel &&
    "$s" run "$work/eight" --steps 5 > "$work/eight.cpu" &&
    "$s" run "$work/eight" --steps 5 --device-target Ascend > "$work/eight.npu" &&
    cat "$work/eight.npu" && compare_losses "$work/eight.cpu" "$work/eight.npu"
}

launched() { # N: N launched workers with HCCL, then N processes started from a rank table
  local n=$1 s="$bin/shardc" port
  "$s" compile models/quickstart.ir -o "$work/dp" --device-num "$n" --parallel-mode data_parallel &&
    "$s" run "$work/dp" --steps 5 > "$work/dp.cpu" &&
    PATH="$bin:$PATH" "$s" launch --worker-num "$n" --local-worker-num "$n" \
      --master-port "$((20000 + RANDOM % 20000))" --log-dir "$work/dp-launch" --join -- \
      shardc run "$work/dp" --steps 5 --device-target Ascend &&
    cat "$work/dp-launch/1/rank.0/stderr" "$work/dp-launch/1/rank.0/stdout" &&
    compare_losses "$work/dp.cpu" "$work/dp-launch/1/rank.0/stdout" || return 1
  # MindSpore's way: a rank table, a process per NPU with RANK_ID / RANK_SIZE / DEVICE_ID.
  "$python" - "$n" > "$work/rank_table.json" << 'EOF'
import json, sys
n = int(sys.argv[1])
print(json.dumps({"version": "1.0", "server_count": "1", "status": "completed", "server_list": [
    {"server_id": "127.0.0.1", "host_nic_ip": "reserve", "device": [
        {"device_id": str(r), "device_ip": "192.168.100.%d" % (101 + r), "rank_id": str(r)} for r in range(n)]}]}))
EOF
  port=$((20000 + RANDOM % 20000))
  local pids=() r token
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  for ((r = 0; r < n; r++)); do
    RANK_TABLE_FILE="$work/rank_table.json" RANK_ID=$r RANK_SIZE=$n DEVICE_ID=$r \
      MS_SCHED_PORT=$port SHARDC_CLUSTER_TOKEN=$token \
      "$s" run "$work/dp" --steps 5 --device-target Ascend > "$work/table.$r" 2>&1 &
    pids+=($!)
  done
  local ok=0
  for p in "${pids[@]}"; do wait "$p" || ok=1; done
  cat "$work/table.0"
  [ "$ok" -eq 0 ] && compare_losses "$work/dp.cpu" "$work/table.0"
}

bench_torch_npu() {
  if ! "$python" -c 'import torch, torch_npu' > /dev/null 2>&1; then
    echo "no torch_npu for $python"
    return 3
  fi
  local s="$bin/shardc" steps=50 t0 t1
  "$s" compile models/quickstart.ir -o "$work/bench" &&
    t0=$(date +%s.%N) &&
    "$s" run "$work/bench" --steps "$steps" --device-target Ascend > /dev/null &&
    t1=$(date +%s.%N) || return 1
  "$python" - "$steps" "$t0" "$t1" << 'EOF'
import sys, time, torch, torch_npu  # noqa: F401
steps, t0, t1 = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
# The quickstart net's shapes: 784 -> 512 -> 512 -> 10, batch 32, Momentum(0.01, 0.9).
start = time.time()
dev = torch.device("npu:0")
net = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                          torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(32, 784, device=dev)
y = torch.randint(0, 10, (32,), device=dev)
for _ in range(steps):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
torch.npu.synchronize()
torch_s = time.time() - start
shardc_s = t1 - t0
print(f"{steps} steps, process start included on both sides: shardc {shardc_s:.2f} s, torch_npu {torch_s:.2f} s, ratio (torch_npu / shardc) {torch_s / shardc_s:.2f}")
EOF
}

export bin work python
export -f compare_losses cli_checks launched bench_torch_npu
step 01-device-info 60 "$bin/shardc" device info
step 02-models-on-npu 600 env SHARDC_TEST_DEVICE=$test_device "$bin/ascend_emulated" --test-threads=1 --nocapture
step 03-quickstart-cli 300 bash -c cli_checks
npus=$("$bin/shardc" device info 2> /dev/null | sed -n 's/^ *\([0-9]*\) device(s)$/\1/p' | head -n 1)
if [ "${npus:-0}" -ge 2 ]; then
  n=$((npus < 8 ? npus : 8))
  step 04-launched-hccl 300 bash -c "launched $n"
else
  echo "SKIP 04-launched-hccl (${npus:-0} NPU(s) here; HCCL ranks need an NPU each)" | tee -a "$summary"
fi
if [ -n "$rehearse" ]; then
  echo "SKIP 05-bench-torch-npu (needs NPUs and torch_npu; rehearsal)" | tee -a "$summary"
else
  step 05-bench-torch-npu 300 bash -c bench_torch_npu
fi
echo "done in $SECONDS s: $(grep -c ^PASS "$summary") passed, $(grep -c ^FAIL "$summary") failed, $(grep -c ^SKIP "$summary") skipped" | tee -a "$summary"
rm -rf "$work"
exit "$failed"
