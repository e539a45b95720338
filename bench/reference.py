#!/usr/bin/env python3
"""Reference side of shardc's benchmarks: numpy and PyTorch (CPU, eager) on this machine.

Run with the interpreter of ``bench/.venv`` (made by ``bench/setup_venv.sh``); ``shardc bench``
and ``cargo bench --bench train_step`` call it and print ratios against shardc's own numbers.

Subcommands (every result is one line of ``key=value`` fields, starting with ``ref=``)::

    reference.py info [--threads 1]
        ref=info numpy=2.3.5 torch=2.9.1 numpy_blas=openblas:0.3.30:SkylakeX ...

    reference.py gemm --sizes 256,512,1024,2048 --threads 1,2 [--quick]
        ref=numpy gemm f32 n=512 threads=1 gflops=140.1 ms=1.916 runs=262
        ref=torch gemm f32 n=512 threads=1 gflops=160.3 ms=1.675 runs=299

    reference.py train --model quickstart|mlp|resnet18 --batch 32 --threads 1 --steps N
                       [--warmup W]
        ref=torch train model=mlp batch=32 threads=1 step_ms=2.340 steps=50 loss=2.30

    reference.py serve [--threads 2]
        reads one command per line on stdin (``gemm ...`` / ``train ...`` / ``info``, with the
        arguments above), answers each with its result lines and then ``ref=done``; ends on
        end of input. Lets a caller interleave its own measurements with the reference's
        without paying PyTorch's import time per case.

Timing: GEMM figures are the median over repeated products after one warm-up product (at least
5 runs and 0.5 s per case; ``--quick``: at least 3 runs and 0.1 s). Training figures are the
median wall time of ``--steps`` full steps (forward, backward, ``optimizer.step()``) after
``--warmup`` untimed steps.

Thread counts: the BLAS and OpenMP variables are set before numpy and torch are imported (to
the largest count asked for), then each case limits numpy's BLAS with threadpoolctl and
PyTorch with ``torch.set_num_threads``. ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` are
removed from the environment first: set on some machines, they make OpenBLAS pick slower
kernels.
"""

import argparse
import os
import shlex
import statistics
import sys
import time

# --- environment, before numpy / torch are imported -----------------------------------------

for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_var, None)


def _max_threads_in_argv(argv):
    """The largest thread count named by ``--threads`` in argv (default 1)."""
    best = 1
    for i, a in enumerate(argv):
        value = None
        if a == "--threads" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--threads="):
            value = a.split("=", 1)[1]
        if value is not None:
            for part in value.split(","):
                part = part.strip()
                if part.isdigit():
                    best = max(best, int(part))
    return best


_POOL_THREADS = str(_max_threads_in_argv(sys.argv[1:]))
for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
):
    os.environ[_var] = _POOL_THREADS

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

torch.set_num_interop_threads(1)


def _emit(line):
    print(line, flush=True)


def _set_threads(threads):
    torch.set_num_threads(threads)


# --- info ------------------------------------------------------------------------------------


def cmd_info(_args):
    """Prints the versions and the BLAS libraries numpy and torch use."""
    blas = []
    for pool in threadpool_info():
        if pool.get("user_api") != "blas":
            continue
        blas.append(
            "{}:{}:{}:{}".format(
                pool.get("internal_api", "?"),
                pool.get("version", "?"),
                pool.get("architecture", "?"),
                os.path.basename(pool.get("filepath", "?")),
            )
        )
    openmp = sorted(
        {
            "{}:{}".format(p.get("internal_api", "?"), os.path.basename(p.get("filepath", "?")))
            for p in threadpool_info()
            if p.get("user_api") == "openmp"
        }
    )
    _emit(
        "ref=info numpy={} torch={} numpy_blas={} openmp={} torch_mkl={} torch_mkldnn={} "
        "torch_parallel={} cpu_capability={}".format(
            np.__version__,
            torch.__version__,
            ",".join(blas) or "none-found",
            ",".join(openmp) or "none-found",
            torch.backends.mkl.is_available(),
            torch.backends.mkldnn.is_available(),
            _torch_parallel_backend(),
            _torch_cpu_capability(),
        )
    )


def _torch_parallel_backend():
    try:
        for line in torch.__config__.parallel_info().splitlines():
            if line.startswith("ATen parallel backend:"):
                return line.split(":", 1)[1].strip().replace(" ", "_")
    except Exception:  # noqa: BLE001 - diagnostic only
        pass
    return "unknown"


def _torch_cpu_capability():
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - diagnostic only
        return "unknown"


# --- gemm ------------------------------------------------------------------------------------


def _repeat(fn, quick):
    """Median seconds of fn() after one warm-up call, and the number of timed runs."""
    fn()
    min_runs, min_total = (3, 0.1) if quick else (5, 0.5)
    samples = []
    total = 0.0
    while len(samples) < min_runs or total < min_total:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        samples.append(dt)
        total += dt
    return statistics.median(samples), len(samples)


def _gemm_line(lib, n, threads, seconds, runs):
    flops = 2.0 * n * n * n
    return "ref={} gemm f32 n={} threads={} gflops={:.1f} ms={:.3f} runs={}".format(
        lib, n, threads, flops / seconds / 1e9, seconds * 1e3, runs
    )


def cmd_gemm(args):
    """numpy.matmul and torch.matmul, f32, square, into a preallocated result."""
    rng = np.random.default_rng(0)
    for n in args.sizes:
        a = rng.uniform(-1.0, 1.0, (n, n)).astype(np.float32)
        b = rng.uniform(-1.0, 1.0, (n, n)).astype(np.float32)
        c = np.empty((n, n), dtype=np.float32)
        ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
        tc = torch.empty((n, n), dtype=torch.float32)
        for threads in args.threads:
            with threadpool_limits(limits=threads, user_api="blas"):
                secs, runs = _repeat(lambda: np.matmul(a, b, out=c), args.quick)
            _emit(_gemm_line("numpy", n, threads, secs, runs))
            _set_threads(threads)
            with torch.no_grad():
                secs, runs = _repeat(lambda: torch.matmul(ta, tb, out=tc), args.quick)
            _emit(_gemm_line("torch", n, threads, secs, runs))


# --- train -----------------------------------------------------------------------------------


class Quickstart(torch.nn.Module):
    """MindSpore's quickstart Net: x @ w (32x16) -> ReLU -> @ w2 (16x16), no biases."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 16) * 0.01)
        self.w2 = torch.nn.Parameter(torch.randn(16, 16) * 0.01)

    def forward(self, x):
        return torch.relu(x @ self.w) @ self.w2


def _mlp():
    """The data-parallel tutorial's network: Dense 784-512-512-10 with ReLU between."""
    return torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


class BasicBlock(torch.nn.Module):
    """ResNet basic block; 1x1 conv + BN shortcut when the stride or the width changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                torch.nn.BatchNorm2d(cout),
            )

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        identity = x if self.down is None else self.down(x)
        return torch.relu(y + identity)


class ResNet18Cifar(torch.nn.Module):
    """ResNet-18, CIFAR variant: 3x3 stem of 64 (stride 1, no max pool), 4 stages of 2 blocks
    (64, 128, 256, 512; stride 2 at stages 2-4), global average pool, Linear 512 -> 10."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(64)
        layers = []
        cin = 64
        for i, width in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            layers.append(
                torch.nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width, 1))
            )
            cin = width
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(512, num_classes)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.layers(y)
        return self.fc(y.mean(dim=(2, 3)))


def _train_case(model, batch):
    """(module, loss function, optimizer, inputs, labels) of a benchmark model."""
    g = torch.Generator().manual_seed(1)
    if model == "quickstart":
        net = Quickstart()
        x = torch.randn(batch, 32, generator=g)
        y = torch.randn(batch, 16, generator=g)
        loss = torch.nn.MSELoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.1)
    elif model == "mlp":
        net = _mlp()
        x = torch.randn(batch, 784, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        loss = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
    elif model == "resnet18":
        net = ResNet18Cifar()
        x = torch.randn(batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        loss = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    else:
        raise SystemExit("reference.py: unknown model {!r}".format(model))
    net.train()
    return net, loss, opt, x, y


def cmd_train(args):
    """Median wall time of one full training step in PyTorch eager."""
    torch.manual_seed(0)
    for threads in args.threads:
        _set_threads(threads)
        net, loss_fn, opt, x, y = _train_case(args.model, args.batch)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
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
        value = float(last.detach()) if last is not None else float("nan")
        _emit(
            "ref=torch train model={} batch={} threads={} step_ms={:.3f} steps={} loss={:.6g}".format(
                args.model,
                args.batch,
                threads,
                statistics.median(samples) * 1e3 if samples else float("nan"),
                len(samples),
                value,
            )
        )


# --- command line ----------------------------------------------------------------------------


def _ints(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers, got {!r}".format(text))
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected positive integers, got {!r}".format(text))
    return values


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises instead of exiting when serving."""

    serving = False

    def error(self, message):
        if _Parser.serving:
            raise _ArgError(message)
        super().error(message)


def _parser():
    p = _Parser(prog="reference.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    info = sub.add_parser("info", help="versions and BLAS libraries")
    info.add_argument("--threads", type=_ints, default=[1])
    gemm = sub.add_parser("gemm", help="numpy / torch f32 matmul GFLOP/s")
    gemm.add_argument("--sizes", type=_ints, default=[256, 512, 1024, 2048])
    gemm.add_argument("--threads", type=_ints, default=[1])
    gemm.add_argument("--quick", action="store_true")
    train = sub.add_parser("train", help="PyTorch eager training step time")
    train.add_argument("--model", choices=["quickstart", "mlp", "resnet18"], required=True)
    train.add_argument("--batch", type=int, default=32)
    train.add_argument("--threads", type=_ints, default=[1])
    train.add_argument("--steps", type=int, default=20)
    train.add_argument("--warmup", type=int, default=3)
    serve = sub.add_parser("serve", help="answer commands read from stdin")
    serve.add_argument("--threads", type=_ints, default=[1])
    return p


def _run(args):
    if args.cmd == "info":
        cmd_info(args)
    elif args.cmd == "gemm":
        cmd_gemm(args)
    elif args.cmd == "train":
        if args.batch < 1 or args.steps < 1 or args.warmup < 0:
            raise _ArgError("--batch and --steps must be positive, --warmup non-negative")
        cmd_train(args)
    else:
        raise _ArgError("{} cannot be nested".format(args.cmd))


def cmd_serve(parser):
    _Parser.serving = True
    for line in sys.stdin:
        words = shlex.split(line)
        if not words:
            continue
        try:
            _run(parser.parse_args(words))
        except _ArgError as e:
            _emit("ref=error message={}".format(str(e).replace("\n", " ")))
        except Exception as e:  # noqa: BLE001 - reported to the caller, who decides
            _emit("ref=error message={}: {}".format(type(e).__name__, str(e).replace("\n", " ")))
        _emit("ref=done")


def main():
    parser = _parser()
    args = parser.parse_args()
    if args.cmd == "serve":
        cmd_serve(parser)
    else:
        try:
            _run(args)
        except _ArgError as e:
            parser.error(str(e))


if __name__ == "__main__":
    main()
