#!/usr/bin/env python3
"""The PyTorch DDP (gloo) reference of `shardc bench train --ranks N`: the same model, batch per
rank, optimizer and step count as shardc's data-parallel run, in N processes on this host.

    python3 ddp.py --model mlp|resnet18 --ranks 2 --batch 32 --steps 20 --warmup 3 --threads 1

Method (shared with shardc's side):
  - every rank trains on its own seeded batch (fixed across steps) with one compute thread;
  - a step is forward, loss, backward (DDP's bucketed gradient AllReduce, overlapped with the
    backward pass, bucket_cap_mb --bucket-mb, 25 by default) and the optimizer step;
  - every step is timed on every rank; the figure of a step is the slowest rank's (an
    AllReduce MAX of the samples after the loop); the step time is the median of those.

Rank 0 prints one JSON object on stdout:
    {"impl":"torch-ddp-gloo","model":"mlp","ranks":2,"batch":32,"steps":20,"step_ms":4.1,"loss":2.30}
"""

import argparse
import json
import os
import socket
import statistics
import sys


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, args, port, result_path):
    threads = str(args.threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = threads
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from reference import _train_case  # the single-process benchmark's models

    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method="tcp://127.0.0.1:{}".format(port), rank=rank, world_size=args.ranks
    )
    torch.manual_seed(0)
    net, loss_fn, _, x, y = _train_case(args.model, args.batch)
    # Each rank its own batch, as data parallel reads its own shard.
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(x.shape, generator=g)
    model = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    lr, momentum = (0.01, 0.0) if args.model == "mlp" else (0.01, 0.9)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    samples = []
    last = None
    for _ in range(args.steps):
        t0 = time.perf_counter()
        last = step()
        samples.append(time.perf_counter() - t0)
    worst = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(result_path, "w") as f:
            f.write(
            json.dumps(
                {
                    "impl": "torch-ddp-gloo",
                    "model": args.model,
                    "ranks": args.ranks,
                    "batch": args.batch,
                    "steps": args.steps,
                    "step_ms": round(statistics.median(worst.tolist()) * 1e3, 3),
                    "loss": float(last.detach()) if last is not None else float("nan"),
                }
            )
            )
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "resnet18"], required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    args = p.parse_args()
    if args.ranks < 1 or args.batch < 1 or args.steps < 1 or args.threads < 1:
        p.error("--ranks, --batch, --steps and --threads must be positive")
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        try:
            mp.spawn(_worker, args=(args, _free_port(), result), nprocs=args.ranks, join=True)
        except mp.ProcessExitedException as e:
            # gloo sometimes aborts a process while tearing down after the measurement; the
            # figures are complete once rank 0 wrote them.
            if not os.path.exists(result):
                raise
            print("ddp.py: a process ended badly after the measurement ({})".format(e), file=sys.stderr)
        with open(result) as f:
            print(f.read(), flush=True)


if __name__ == "__main__":
    main()
