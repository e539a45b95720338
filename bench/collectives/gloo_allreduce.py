#!/usr/bin/env python3
"""The gloo reference of `shardc bench collectives`: torch.distributed AllReduce (sum, f32, in
place) between P processes on this host, measured the way shardc and mpi_allreduce.c do.

    python3 gloo_allreduce.py --procs 2,4,8 --sizes 4K,64K,1M,16M,64M [--iters N]

Method (shared by all three sides):
  - iterations per size: --iters N, else min(200, max(5, 256 MiB / size)); untimed warm-up
    iterations: max(2, iters // 10);
  - the first warm-up call carries rank + 1 in every element and is checked against
    P (P + 1) / 2; the buffer is then zeroed;
  - every timed call is timed on every rank; the per-call figure is the slowest rank's (an
    AllReduce MAX of the samples after the loop); the latency is the median of those figures,
    the algorithm bandwidth size / latency (GB/s, 1e9 bytes).

The processes are started with torch.multiprocessing.spawn and rendezvous with
init_method tcp://127.0.0.1:PORT; each uses one compute thread. Rank 0 prints one JSON object
per (procs, size) on stdout:
    {"impl":"gloo","procs":2,"size_bytes":4096,"iters":200,"median_us":512.3,"algbw_gbs":0.008}
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time


def parse_size(text):
    """'4K' -> 4096 (K, M, G are powers of 1024; an optional 'iB' or 'B' follows)."""
    t = text.strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[: -len(suffix)]
            break
    scale = 1
    if t and t[-1] in "KMG":
        scale = 1 << {"K": 10, "M": 20, "G": 30}[t[-1]]
        t = t[:-1]
    value = int(t) * scale
    if value <= 0 or value % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} must be a positive multiple of 4 bytes")
    return value


def default_iters(size_bytes):
    return min(200, max(5, (256 << 20) // size_bytes))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, procs, port, sizes, iters_arg):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs
    )
    try:
        for size in sizes:
            iters = iters_arg or default_iters(size)
            warmup = max(2, iters // 10)
            buf = torch.full((size // 4,), float(rank + 1), dtype=torch.float32)
            for w in range(warmup):
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                if w == 0:
                    want = procs * (procs + 1) / 2
                    got = (buf[0].item(), buf[-1].item())
                    if got != (want, want):
                        raise RuntimeError(
                            f"rank {rank}: AllReduce of {size} bytes gave {got}, expected {want}"
                        )
                    buf.zero_()
            samples = []
            for _ in range(iters):
                t0 = time.perf_counter()
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                samples.append(time.perf_counter() - t0)
            slowest = torch.tensor(samples, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                med = statistics.median(slowest.tolist())
                print(
                    json.dumps(
                        {
                            "impl": "gloo",
                            "procs": procs,
                            "size_bytes": size,
                            "iters": iters,
                            "median_us": round(med * 1e6, 3),
                            "algbw_gbs": round(size / med / 1e9, 4),
                        }
                    ),
                    flush=True,
                )
    finally:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="2,4,8", help="process counts, comma-separated")
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes in bytes")
    p.add_argument("--iters", type=int, default=0, help="timed iterations (0: by size)")
    a = p.parse_args()
    procs = [int(x) for x in a.procs.split(",")]
    sizes = [parse_size(x) for x in a.sizes.split(",")]
    if any(n < 1 for n in procs) or a.iters < 0:
        p.error("--procs must be positive and --iters at least 0")
    # One compute thread per rank, set before torch starts its pools.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    for n in procs:
        mp.spawn(worker, args=(n, free_port(), sizes, a.iters), nprocs=n, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
