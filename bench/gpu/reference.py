#!/usr/bin/env python3
"""Reference side of ``shardc bench gpu``: PyTorch on the same NVIDIA GPU.

Run with the interpreter of ``bench/.venv`` (``bench/setup_venv.sh``; PyPI's torch is the CUDA
build). Every result is one line of ``key=value`` fields starting with ``ref=``::

    reference.py gemm --sizes 1024,2048,4096,8192 [--quick]
        ref=torch gemm precision=f32 n=1024 tflops=19.1 ms=0.112 runs=200
        (precisions f32 with TF32 off, tf32, bf16)

    reference.py train --models mlp,resnet18,transformer --batch 32 [--quick] [--modes eager,compile]
        ref=torch train model=mlp mode=eager step_ms=0.41 steps=200 loss=2.30
        ref=torch train model=mlp mode=compile step_ms=0.30 steps=200 loss=2.30
        (modes: eager; compile, torch.compile; deterministic, eager with
        torch.backends.cudnn.deterministic = True, cuDNN's deterministic algorithms only, as
        shardc's convolutions run unless SHARDC_CUDNN_DETERMINISTIC=0)

The models are shardc's benchmark models (``bench/reference.py`` for the MLP and ResNet-18;
the transformer as ``compiler/src/transformer.rs`` builds it: 2 layers, hidden 256, 4 heads,
sequence 128, batch 8 sequences, MSE loss, Momentum(0.01, 0.9)). A training step is forward,
backward and ``optimizer.step()`` with the loss read back to the host (``float(loss)``), as
shardc's step returns its loss. Timing: median over the steps after warm-up steps; GEMMs
timed with CUDA events.
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import reference as cpu_reference  # noqa: E402  (the CPU side's model definitions)


def emit(line):
    print(line, flush=True)


def gemm(args):
    dev = torch.device("cuda")
    for n in args.sizes:
        for precision in ("f32", "tf32", "bf16"):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            torch.matmul(a, b)
            torch.cuda.synchronize()
            runs = 20 if args.quick else 100
            times = []
            for _ in range(runs):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                torch.matmul(a, b)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            t = statistics.median(times)
            emit(
                "ref=torch gemm precision={} n={} tflops={:.2f} ms={:.4f} runs={}".format(
                    precision, n, 2 * n**3 / t / 1e12, t * 1e3, runs
                )
            )
    torch.backends.cuda.matmul.allow_tf32 = False


class EncoderLayer(torch.nn.Module):
    """One layer of shardc's transformer (post-LayerNorm, tanh GeLU)."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.q = torch.nn.Linear(hidden, hidden)
        self.k = torch.nn.Linear(hidden, hidden)
        self.v = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.ln1 = torch.nn.LayerNorm(hidden, eps=1e-7)
        self.ffn_in = torch.nn.Linear(hidden, ffn)
        self.ffn_out = torch.nn.Linear(ffn, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden, eps=1e-7)

    def forward(self, x, batch, seq):
        hidden = x.shape[1]
        d = hidden // self.heads

        def heads(t):
            return t.reshape(batch, seq, self.heads, d).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        p = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d)), dim=-1)
        ctx = (p @ v).transpose(1, 2).reshape(batch * seq, hidden)
        x = self.ln1(x + self.out(ctx))
        y = self.ffn_out(torch.nn.functional.gelu(self.ffn_in(x), approximate="tanh"))
        return self.ln2(x + y)


class Transformer(torch.nn.Module):
    def __init__(self, layers=2, hidden=256, heads=4, seq=128, batch=8):
        super().__init__()
        self.batch, self.seq = batch, seq
        self.layers = torch.nn.ModuleList(
            [EncoderLayer(hidden, heads, 4 * hidden) for _ in range(layers)]
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, self.batch, self.seq)
        return x


def train_case(model, batch):
    if model == "transformer":
        net = Transformer()
        g = torch.Generator().manual_seed(1)
        tokens = net.batch * net.seq
        x = torch.randn(tokens, 256, generator=g)
        y = torch.randn(tokens, 256, generator=g)
        loss = torch.nn.MSELoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        return net, loss, opt, x, y
    return cpu_reference._train_case(model, batch)


def train(args):
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for model in args.models:
        for mode in args.modes:
            torch.manual_seed(0)
            torch.backends.cudnn.deterministic = mode == "deterministic"
            net, loss_fn, opt, x, y = train_case(model, args.batch)
            net = net.to(dev)
            opt = type(opt)(net.parameters(), **opt.defaults)
            x, y = x.to(dev), y.to(dev)
            fwd = torch.compile(net) if mode == "compile" else net

            def step():
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(fwd(x), y)
                loss.backward()
                opt.step()
                return float(loss)

            warmup, steps = (3, 20) if args.quick else (10, 100)
            try:
                for _ in range(warmup):
                    step()
                samples, last = [], float("nan")
                for _ in range(steps):
                    t0 = time.perf_counter()
                    last = step()
                    samples.append(time.perf_counter() - t0)
            except Exception as e:  # torch.compile needs a C compiler and Triton
                emit("ref=torch train model={} mode={} error={!r}".format(model, mode, str(e)[:200]))
                continue
            emit(
                "ref=torch train model={} mode={} step_ms={:.3f} steps={} loss={:.6g}".format(
                    model, mode, statistics.median(samples) * 1e3, steps, last
                )
            )


def ints(text):
    return [int(v) for v in text.split(",") if v]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--sizes", type=ints, default=[1024, 2048, 4096, 8192])
    g.add_argument("--quick", action="store_true")
    t = sub.add_parser("train")
    t.add_argument("--models", type=lambda s: s.split(","), default=["mlp", "resnet18", "transformer"])
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--quick", action="store_true")
    t.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["eager", "compile"],
        help="eager, compile, deterministic (eager with cuDNN's deterministic algorithms)",
    )
    a = p.parse_args()
    if not torch.cuda.is_available():
        emit("ref=error reason=no_cuda_device")
        sys.exit(1)
    emit("ref=info gpu={!r} torch={}".format(torch.cuda.get_device_name(0), torch.__version__))
    gemm(a) if a.cmd == "gemm" else train(a)


if __name__ == "__main__":
    main()
