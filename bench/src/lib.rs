//! `shardc-bench`: the benchmarks of `shardc bench` — shardc against numpy and PyTorch,
//! measured in the same run on the same machine. The `shardc` binary parses the command line
//! into [`BenchArgs`] and calls [`run_bench`]; this crate uses `shardc-tools` (the cluster,
//! in-process ranks, plan comparison, device descriptions) and is not used by it.
//!
//! The benchmarks:
//!
//! - `gemm`: f32 GEMM throughput (GFLOP/s) of [`shardc_backend_cpu::sgemm`] at each size and
//!   thread count, against `numpy.matmul` and `torch.matmul`. Target: at least 1.0× PyTorch on
//!   one thread.
//! - `train`: the median wall time of one full training step (forward, backward, optimizer
//!   update; the best of `--rounds` rounds that alternate the two sides) of the quickstart net (batch 16, its `x[16, 32]`), the MLP (784-512-512-10) and
//!   ResNet-18 for CIFAR (`--batch`, default 32), compiled by the pipeline and run by the
//!   executor on a [`CpuBackend`](shardc_backend_cpu::CpuBackend) with the thread count, against the same model in PyTorch CPU
//!   eager with the same thread count. Targets: quickstart at most 0.5× PyTorch's step time,
//!   MLP and ResNet-18 at most 1.0×.
//! - `compile`: the parallel compiler's compile time on a 24-layer transformer, shardc only
//!   (see [`bench_compile`]). Goal: the whole pipeline within 1 s.
//! - `search`: the strategy searchers on the 24-layer transformer at 8 to 4096 devices and on
//!   a generated 10⁵-op graph (see [`bench_search`]), and the whole `shardc compile` of the
//!   24-layer transformer as users run it, in a child process. Goals: 512 devices within 2 s
//!   whole (the command line: 2 s, 1 GiB peak RSS, 64 MiB of artifact; 4096 devices within
//!   4 s), 10⁵ ops at 4096 devices within 60 s, under 2 GiB.
//! - `gemm`, `train` and `all` are [`bench_cpu`]; `train --ranks N` is [`bench_ddp`] (against
//!   PyTorch DDP), `gpu` is [`bench_gpu`], `calibrate` [`bench_calibrate`], `plans`
//!   [`bench_plans`] and `collectives` [`bench_collectives`].
//! - `plan`: the stage planner on paper, at scale: GPT-style 1.3B, 6.7B and 13B on 512
//!   H100s, shardc's auto plan (stages, micro-batches, ZeRO-1, recompute) against the best
//!   Megatron-LM 3D plan under the same cost model, with MFU and search time, and the 24-layer
//!   transformer's weak scaling from 8 to 512 devices (see [`bench_plan`]). Goals: auto ≥ 1.0×
//!   3D throughput on every model, search < 60 s per model, weak scaling ≥ 70 % at 512.
//! - `strategies`: the cost model's predicted step time of candidate strategies (data
//!   parallel, model-parallel annotations, searched) against their measured step time on
//!   in-process ranks, with Spearman's rank correlation per case (see [`bench_strategies`]).
//!   Goal: at least 0.8 everywhere.
//!
//! The reference side is `bench/reference.py`, run by the interpreter of `bench/.venv`; when
//! the virtual environment is missing, `bench/setup_venv.sh` creates it first (unless
//! `--no-setup`, which skips the reference instead). The script runs as one long-lived
//! process (`reference.py serve`) so that every case is measured by shardc and then at once
//! by the reference, both under the same machine load.
//!
//! Each case prints one line on stdout, for example
//!
//! ```text
//! gemm n=512 threads=1 shardc=150.2 GFLOP/s numpy=140.1 torch=160.3 ratio_vs_torch=0.94 (target >= 1.0: missed)
//! train mlp batch=32 threads=1 shardc=1.23 ms torch=2.34 ms ratio=0.53 (target <= 1.0: met)
//! ```
//!
//! The modules: [`args`] (the command line of `shardc bench`), [`measure`] and
//! [`reference`](mod@reference) (what the benchmarks share), one `bench_*` module per
//! benchmark. None uses the crate root: the dispatch, [`run_bench`], is the only code here.

#![warn(missing_docs)]

pub mod args;
pub mod bench_calibrate;
pub mod bench_collectives;
pub mod bench_compile;
pub mod bench_cpu;
pub mod bench_ddp;
pub mod bench_gpu;
pub mod bench_plan;
pub mod bench_plans;
pub mod bench_search;
pub mod bench_strategies;
pub mod measure;
pub mod reference;

pub use args::{BenchArgs, BenchWhat, TrainModel};

use anyhow::Result;

/// Runs `shardc bench`: measures each case on shardc's side and then on the reference's,
/// printing one line per case with the ratio and whether it meets the issue's target.
pub fn run_bench(args: &BenchArgs) -> Result<()> {
    if let Some(bench_collectives::BenchSubcommand::Collectives(c)) = &args.sub {
        return bench_collectives::run(c);
    }
    if args.what == BenchWhat::Train && (args.ranks > 1 || args.worker_artifact.is_some()) {
        return bench_ddp::run(args);
    }
    if args.what == BenchWhat::Calibrate {
        return bench_calibrate::run(args);
    }
    if args.what == BenchWhat::Search {
        return bench_search::run(args);
    }
    if args.what == BenchWhat::Compile {
        return bench_compile::run(&bench_compile::CompileBench::standard(args.quick)).map(drop);
    }
    if args.what == BenchWhat::Strategies {
        return bench_strategies::run(args);
    }
    if args.what == BenchWhat::Plans {
        return bench_plans::run(args);
    }
    if args.what == BenchWhat::Plan {
        return bench_plan::run(args);
    }
    if args.what == BenchWhat::Gpu {
        return bench_gpu::run(args);
    }
    bench_cpu::run(args)
}
