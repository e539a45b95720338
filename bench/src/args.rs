//! The arguments of `shardc bench` ([`BenchArgs`]): which benchmark ([`BenchWhat`]), the
//! models of the training benchmark ([`TrainModel`]) and every option.

use crate::bench_collectives::BenchSubcommand;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use shardc_compiler::optim::{Momentum, SGD};
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_compiler::zoo;
use shardc_ir::Graph;
use std::path::PathBuf;

/// Which benchmark `shardc bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchWhat {
    /// f32 GEMM GFLOP/s against numpy and PyTorch.
    Gemm,
    /// One training step of each model against PyTorch CPU eager.
    Train,
    /// `gemm` and `train` (not `compile`).
    All,
    /// The parallel compiler's compile time on a 24-layer transformer (shardc only; see
    /// [`bench_compile`]).
    ///
    /// [`bench_compile`]: crate::bench_compile
    Compile,
    /// Measure this machine for the cost model and write a device description (TOML,
    /// `--device-file`; see [`bench_calibrate`]).
    ///
    /// [`bench_calibrate`]: crate::bench_calibrate
    Calibrate,
    /// The strategy searchers' speed on a 24-layer transformer at 8 to 4096 devices and on a
    /// generated 10^5-op graph (shardc only; see [`bench_search`]).
    ///
    /// [`bench_search`]: crate::bench_search
    Search,
    /// The CUDA backend against PyTorch on the same GPU: GEMM TFLOP/s (f32, TF32, BF16) and
    /// training steps of the MLP, ResNet-18 and a transformer (see [`bench_gpu`]).
    ///
    /// [`bench_gpu`]: crate::bench_gpu
    Gpu,
    /// Whether the cost model ranks candidate strategies as measured step times do, on the
    /// quickstart net, the MLP and a 2-layer transformer at 2, 4, 8 ranks (see
    /// [`bench_strategies`]).
    ///
    /// [`bench_strategies`]: crate::bench_strategies
    Strategies,
    /// The default modes' plans (semi-auto, sharding propagation) against the full searcher
    /// and MindSpore's rules, on the quickstart net at two sizes (see [`bench_plans`]).
    ///
    /// [`bench_plans`]: crate::bench_plans
    Plans,
    /// The stage planner on paper: GPT 1.3B / 6.7B / 13B on 64 8xH100 hosts, the auto plan
    /// (stages, micro-batches, ZeRO-1, recompute) against Megatron 3D, and weak scaling of the
    /// 24-layer transformer from 8 to 512 devices (see [`bench_plan`]).
    ///
    /// [`bench_plan`]: crate::bench_plan
    Plan,
}

/// A model of the training-step benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TrainModel {
    /// MindSpore's parallel quickstart net with MSELoss, `Momentum(0.2, 0.1)`, batch 16.
    Quickstart,
    /// Dense 784-512-512-10 with ReLU, sparse softmax cross-entropy, `SGD(0.01)`.
    Mlp,
    /// ResNet-18 for CIFAR (32×32 input), sparse softmax cross-entropy, `Momentum(0.01, 0.9)`.
    Resnet18,
}

impl TrainModel {
    /// Every model, in the order they are measured.
    pub const ALL: [TrainModel; 3] = [
        TrainModel::Quickstart,
        TrainModel::Mlp,
        TrainModel::Resnet18,
    ];

    /// The name used on the command line, in the output and by `reference.py`.
    pub fn name(self) -> &'static str {
        match self {
            TrainModel::Quickstart => "quickstart",
            TrainModel::Mlp => "mlp",
            TrainModel::Resnet18 => "resnet18",
        }
    }

    /// The largest ratio of shardc's step time to PyTorch's that meets the target.
    pub fn target_ratio(self) -> f64 {
        match self {
            TrainModel::Quickstart => 0.5,
            TrainModel::Mlp | TrainModel::Resnet18 => 1.0,
        }
    }

    /// The batch size measured: the quickstart net's own 16, `batch` for the others.
    pub fn batch(self, batch: usize) -> usize {
        match self {
            TrainModel::Quickstart => 16,
            TrainModel::Mlp | TrainModel::Resnet18 => batch,
        }
    }

    /// (untimed warm-up steps, timed steps) by default.
    pub(crate) fn default_steps(self, quick: bool) -> (usize, usize) {
        match (self, quick) {
            (TrainModel::Quickstart, false) => (20, 200),
            (TrainModel::Quickstart, true) => (5, 50),
            (TrainModel::Mlp, false) => (5, 50),
            (TrainModel::Mlp, true) => (2, 10),
            (TrainModel::Resnet18, false) => (2, 10),
            (TrainModel::Resnet18, true) => (1, 3),
        }
    }

    /// The zoo's forward graph (with its loss) at `batch` and the model's optimizer.
    pub fn forward_and_optimizer(
        self,
        batch: usize,
    ) -> Result<(Graph, shardc_passes::autodiff::Optimizer)> {
        Ok(match self {
            TrainModel::Quickstart => (zoo::quickstart(16)?, Momentum::new(0.2, 0.1).to_spec()),
            TrainModel::Mlp => (
                zoo::mlp(batch, &[784, 512, 512, 10])?,
                SGD::new(0.01).to_spec(),
            ),
            TrainModel::Resnet18 => (
                zoo::resnet18_cifar(batch)?,
                Momentum::new(0.01, 0.9).to_spec(),
            ),
        })
    }

    /// The training graph: the zoo's forward graph compiled with the model's optimizer.
    pub fn training_graph(self, batch: usize) -> Result<Graph> {
        let (forward, optimizer) = self.forward_and_optimizer(batch)?;
        let opts = CompileOptions {
            optimizer: Some(optimizer),
            dump_dir: None,
            ..Default::default()
        };
        Ok(compile(forward, &opts)
            .with_context(|| format!("compiling the {} training step", self.name()))?
            .graph)
    }
}

/// Arguments of `shardc bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum, default_value_t = BenchWhat::All)]
    pub what: BenchWhat,
    /// Thread counts, comma-separated: each case runs once per count, on both sides.
    #[arg(long, value_delimiter = ',', value_parser = parse_positive, default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Fewer repetitions and steps (a smoke run; figures are noisier).
    #[arg(long)]
    pub quick: bool,
    /// GEMM sizes n (n×n times n×n), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_positive, default_value = "256,512,1024,2048")]
    pub sizes: Vec<usize>,
    /// Models of the training benchmark, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub models: Vec<TrainModel>,
    /// Batch size of the MLP and ResNet-18 (the quickstart net keeps its batch of 16).
    #[arg(long, value_parser = parse_positive, default_value_t = 32)]
    pub batch: usize,
    /// Timed training steps per case (default: 200 quickstart, 50 MLP, 10 ResNet-18; fewer
    /// with --quick).
    #[arg(long, value_parser = parse_positive)]
    pub steps: Option<usize>,
    /// After each training case, print where shardc's time went (per op kind, on stderr).
    #[arg(long)]
    pub stats: bool,
    /// Training cases (CPU and `bench gpu`): rounds of both sides, alternating (shardc, then
    /// the reference); each
    /// side's figure is its best round's median (default 3; 1 with --quick). This machine's
    /// speed drifts over seconds, and one round may catch one side in a slow phase.
    #[arg(long, value_parser = parse_positive)]
    pub rounds: Option<usize>,
    /// Measure shardc only, without numpy and PyTorch.
    #[arg(long)]
    pub no_reference: bool,
    /// Never create the reference's virtual environment: without it, measure shardc only.
    #[arg(long)]
    pub no_setup: bool,
    /// The directory holding `reference.py` and `setup_venv.sh` (default: `bench/` of the
    /// checkout containing the current directory, else of the one shardc was built from).
    #[arg(long)]
    pub bench_dir: Option<PathBuf>,
    /// The Python interpreter of the reference side (default: `.venv/bin/python` of the bench
    /// directory, made by `setup_venv.sh`); e.g. `--python python3` on a machine whose system
    /// Python already has PyTorch.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// `train` with more than one rank: data-parallel training in this many worker processes
    /// against PyTorch DDP (gloo) in as many (models mlp and resnet18; `--batch` per rank).
    #[arg(long, value_parser = parse_positive, default_value_t = 1)]
    pub ranks: usize,
    /// Gradient bucket size of the data-parallel benchmark in MB, on both sides (shardc's
    /// `comm_fusion` size mode, DDP's `bucket_cap_mb`; DDP's default 25).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// `calibrate`: where to write the device description.
    /// `bench plans`: the machine the plans are priced on, a preset (cpu, 8xh100,
    /// ascend910) or a device description file (default: cpu, as `shardc compile`);
    /// `bench plan`: the same (default: 8xh100).
    #[arg(long)]
    pub device: Option<String>,
    /// `calibrate`: the device description file written.
    // Without help text on the command line, as before the benchmarks left shardc-tools
    // (`--device`'s text describes it): `help = None` keeps `shardc bench --help` unchanged.
    #[arg(long, default_value = "device.toml", help = None::<&str>)]
    pub device_file: PathBuf,
    /// Untimed warm-up steps of a data-parallel worker (set by the parent).
    #[arg(long, hide = true, default_value_t = 0)]
    pub warmup: usize,
    /// Run as one worker of the data-parallel benchmark on this artifact (set by the parent).
    #[arg(long, hide = true)]
    pub worker_artifact: Option<PathBuf>,
    /// `shardc bench collectives`: AllReduce between processes against gloo and Open MPI
    /// (its own options: `shardc bench collectives --help`).
    #[command(subcommand)]
    pub sub: Option<BenchSubcommand>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            what: BenchWhat::All,
            threads: vec![1, 2],
            quick: false,
            sizes: vec![256, 512, 1024, 2048],
            models: Vec::new(),
            batch: 32,
            steps: None,
            stats: false,
            rounds: None,
            no_reference: false,
            no_setup: false,
            bench_dir: None,
            python: None,
            ranks: 1,
            bucket_mb: 25.0,
            device: None,
            device_file: PathBuf::from("device.toml"),
            warmup: 0,
            worker_artifact: None,
            sub: None,
        }
    }
}

/// A positive integer argument.
fn parse_positive(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("'{s}' is not a positive integer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn arguments_parse_and_reject_zero_threads() {
        let cli =
            Cli::try_parse_from(["x", "train", "--threads", "1,4", "--models", "mlp,resnet18"])
                .expect("valid arguments");
        assert_eq!(cli.bench.what, BenchWhat::Train);
        assert_eq!(cli.bench.threads, vec![1, 4]);
        assert_eq!(
            cli.bench.models,
            vec![TrainModel::Mlp, TrainModel::Resnet18]
        );
        let cli = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(cli.bench.what, BenchWhat::All);
        assert_eq!(cli.bench.threads, vec![1, 2]);
        assert_eq!(cli.bench.sizes, vec![256, 512, 1024, 2048]);
        let err = Cli::try_parse_from(["x", "gemm", "--threads", "0"])
            .err()
            .expect("zero threads is refused");
        assert_eq!(err.exit_code(), 2);
        assert!(Cli::try_parse_from(["x", "gemm", "--sizes", "12a"]).is_err());
    }
}
