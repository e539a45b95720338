#!/usr/bin/env python3
"""Prints the table of bench/collectives/run.sh from its JSON lines (stdin or a file).

Each input line is one JSON object: {"impl": "shardc" | "gloo" | "mpi", "procs", "size_bytes",
"iters", "median_us", "algbw_gbs"}, or {"impl": "triad", "best_gbs", ...}. Lines that are not
JSON objects are ignored. Columns: size, procs, then GB/s and median latency (µs) of shardc,
gloo and Open MPI, the ratios shardc/gloo and shardc/MPI (of bandwidth: the other side's
latency over shardc's, > 1 means shardc is faster), the issue's goal checked on that row, and
the triad ceiling (2 threads).

Goals (issue 5): shardc/gloo >= 2 from 1 MiB up; shardc/MPI >= 1 at 16 MiB; at 4 KiB
shardc's latency no worse than Open MPI's (shardc/MPI >= 1).
"""

import json
import sys


def fmt_size(n):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def load(stream):
    rows, triad = {}, None
    for line in stream:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if obj.get("impl") == "triad":
            triad = obj.get("best_gbs")
        elif "procs" in obj and "size_bytes" in obj:
            rows[(obj["impl"], obj["procs"], obj["size_bytes"])] = obj
    return rows, triad


def goal(size, vs_gloo, vs_mpi):
    """The goals that apply to a row, each 'met' or 'missed' (or '-' when none applies)."""
    out = []
    if size >= 1 << 20 and vs_gloo is not None:
        out.append(f">=2x gloo: {'met' if vs_gloo >= 2 else 'missed'}")
    if size == 16 << 20 and vs_mpi is not None:
        out.append(f">=1x MPI bw: {'met' if vs_mpi >= 1 else 'missed'}")
    if size == 4 << 10 and vs_mpi is not None:
        out.append(f"latency <= MPI: {'met' if vs_mpi >= 1 else 'missed'}")
    return "; ".join(out) or "-"


def main():
    stream = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    rows, triad = load(stream)
    cases = sorted({(p, s) for (_, p, s) in rows}, key=lambda c: (c[0], c[1]))
    header = (
        f"{'size':>7} {'procs':>5} | {'shardc GB/s':>11} {'us':>9} | {'gloo GB/s':>9} {'us':>9} | "
        f"{'MPI GB/s':>8} {'us':>9} | {'x gloo':>7} {'x MPI':>7} | {'triad GB/s':>10} | goal"
    )
    print(header)
    print("-" * len(header))
    num = lambda v, w, d: f"{v:>{w}.{d}f}" if v is not None else f"{'n/a':>{w}}"
    for procs, size in cases:
        get = lambda impl: rows.get((impl, procs, size))
        ours, gloo, mpi = get("shardc"), get("gloo"), get("mpi")
        ratio = lambda other: (
            other["median_us"] / ours["median_us"] if ours and other and ours["median_us"] > 0 else None
        )
        vs_gloo, vs_mpi = ratio(gloo), ratio(mpi)
        bw = lambda r: r["algbw_gbs"] if r else None
        us = lambda r: r["median_us"] if r else None
        print(
            f"{fmt_size(size):>7} {procs:>5} | {num(bw(ours), 11, 3)} {num(us(ours), 9, 1)} | "
            f"{num(bw(gloo), 9, 3)} {num(us(gloo), 9, 1)} | {num(bw(mpi), 8, 3)} {num(us(mpi), 9, 1)} | "
            f"{num(vs_gloo, 7, 2)} {num(vs_mpi, 7, 2)} | {num(triad, 10, 1)} | {goal(size, vs_gloo, vs_mpi)}"
        )
    print(
        "GB/s: algorithm bandwidth (bytes per rank / median latency, 1e9 B/s); us: median over "
        "calls of the slowest rank; x gloo, x MPI: their latency over shardc's (> 1: shardc faster)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
